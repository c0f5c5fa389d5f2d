"""The picker's servers: gRPC health, Prometheus metrics, draining on stop."""

from __future__ import annotations

from typing import Any

import aiohttp
import grpc
import pytest
from ep_support import completion, request_body, request_headers, response_headers, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READY_SERVICES = ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "")


async def check(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


async def statuses(port: int) -> dict[str, int]:
    return {s: await check(port, s) for s in ("liveness", *READY_SERVICES)}


async def test_health_follows_sync(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    synced = False
    p = await picker(cluster, synced=lambda: synced)
    port = p.server.health_port
    assert await statuses(port) == {
        "liveness": SERVING,
        **dict.fromkeys(READY_SERVICES, NOT_SERVING),
    }
    synced = True
    await wait_for(lambda: p.server.health.ready, what="ready")
    assert await statuses(port) == dict.fromkeys(("liveness", *READY_SERVICES), SERVING)
    # Health is answered on the ext_proc port too (for proxies that health check it).
    assert await statuses(p.server.grpc_port) == await statuses(port)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await check(port, "no.such.Service")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_follows_ready_endpoints_without_sync(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)  # endpoints from the configuration: ready while one is
    await wait_for(lambda: p.server.health.ready, what="ready")
    assert await check(p.server.health_port, "readiness") == SERVING
    await cluster.stop()  # no endpoint left: not ready; liveness is unaffected
    await wait_for(lambda: p.server.health.ready is False, what="not ready")
    assert await check(p.server.health_port, "readiness") == NOT_SERVING
    assert await check(p.server.health_port, "liveness") == SERVING


async def test_metrics_and_http_probes(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion()))
    await ex.recv(2)
    ex.cancel()
    bad = p.exchange()
    await bad.send(request_headers(), request_body(b"not json"))
    await bad.recv()
    bad.cancel()
    base = f"http://127.0.0.1:{p.server.metrics_port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/metrics") as r:
            assert r.status == 200
            text = await r.text()
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200
        await wait_for(lambda: p.server.health.ready)
        async with http.get(f"{base}/readyz") as r:
            assert r.status == 200
            assert (await r.json())["ready_endpoints"] == 1
    assert "sluicegate_extproc_streams_total 2.0" in text
    refusals = 'sluicegate_extproc_immediate_responses_total{reason="bad-request",status="400"}'
    assert f"{refusals} 1.0" in text
    assert "sluicegate_gateway_overhead_seconds_count 1.0" in text
    assert 'inference_objective_request_total{model_name="tiny-llama"' in text
    assert "inference_pool_ready_pods" in text


async def test_stop_drains_then_cancels_streams_in_flight(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion()))
    await ex.recv(2)
    await ex.send(response_headers())
    await ex.recv()
    assert p.inflight() == 1
    await p.server.stop(0.2)  # the response never ends: cancelled after the grace period
    assert p.server.health.ready is False
    assert p.inflight() == 0
