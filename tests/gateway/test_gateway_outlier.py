"""Outlier detection end to end: failing simulated servers are ejected, and come back."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
from gw_support import GatewayFactory

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.outlier import CONSECUTIVE_5XX, CONSECUTIVE_GATEWAY_FAILURE, Result
from sluicegate.gateway.app import Gateway
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.sim.faults import Faults

BASE = "tiny-llama"
EJECTIONS = "sluicegate_endpoint_ejections_total"


def url(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.port}/v1/completions"


def outlier(**fields: Any) -> dict[str, Any]:
    """GatewayConfig settings: outlier detection with the statistical tests out of the way
    (each test here is about one rule) and ``fields`` on top."""
    spec = {"intervalMs": 60_000, "baseEjectionTimeMs": 60_000, **fields}
    return {"outlierDetection": spec}


async def settle(gw: Gateway) -> None:
    """Wait (up to 2 s) for every in-flight count to return to 0, then check it did."""
    for _ in range(100):
        if all(e.inflight.requests == 0 for e in gw.datastore.all_endpoints()):
            break
        await asyncio.sleep(0.02)
    for e in gw.datastore.all_endpoints():
        assert e.inflight.requests == 0, (e.name, e.inflight)
        assert e.inflight.prompt_tokens == 0, (e.name, e.inflight)
        assert e.inflight.decode_tokens == 0, (e.name, e.inflight)


def ejections(gw: Gateway, endpoint: Endpoint, reason: str) -> float:
    value = gw.metrics.registry.get_sample_value(
        EJECTIONS, {"pool": endpoint.pool, "endpoint": endpoint.name, "reason": reason}
    )
    return value or 0.0


def ejected_gauge(gw: Gateway) -> float | None:
    return gw.metrics.registry.get_sample_value("sluicegate_endpoints_ejected", {"pool": "pool"})


async def stream(http: aiohttp.ClientSession, gw: Gateway, i: int) -> tuple[int, str]:
    body = {"model": BASE, "prompt": f"s{i}", "max_tokens": 12, "stream": True, "ignore_eos": True}
    async with http.post(url(gw), json=body) as r:
        return r.status, (await r.read()).decode()


async def whole(
    http: aiohttp.ClientSession, gw: Gateway, i: int, tokens: int = 5
) -> tuple[int, str]:
    body = {"model": BASE, "prompt": f"w{i}", "max_tokens": tokens, "ignore_eos": True}
    async with http.post(url(gw), json=body) as r:
        await r.read()
        return r.status, r.headers.get("x-inference-pod", "")


async def test_a_server_that_cuts_streams_is_ejected(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(reset_after_tokens=10)})
    gw = await gateway(cluster, settings=outlier())  # the default scheduler
    bad = gw.datastore.all_endpoints()[0]
    broken = 0
    for i in range(15):
        status, text = await stream(http, gw, i)
        assert status == 200
        broken += '"upstream_error"' in text
    # Consecutive gateway failures (3 by default) eject it; its later streams go elsewhere.
    assert bad.health.ejected
    assert 1 <= broken <= 3
    assert ejections(gw, bad, CONSECUTIVE_GATEWAY_FAILURE) == 1
    assert ejected_gauge(gw) == 1
    await settle(gw)


async def test_non_streaming_requests_to_a_resetting_server_are_not_lost(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(reset_after_tokens=2)})
    gw = await gateway(cluster, preset="round-robin", settings=outlier())
    results = await asyncio.gather(*(whole(http, gw, i) for i in range(24)))
    assert Counter(s for s, _ in results) == {200: 24}
    assert cluster.replicas[0].pod_name not in {pod for _, pod in results}
    bad = gw.datastore.all_endpoints()[0]
    assert bad.health.ejected
    # Each retry was paid for by one failed attempt there, and it stopped at the ejection.
    assert 3 <= gw.metrics.retries.value <= 3 + 24 // 3
    await settle(gw)


async def test_a_hung_server_costs_a_few_attempts_and_is_ejected(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(hang=True)})
    settings = {
        "firstByteTimeoutMs": 200,
        "nonStreamingFirstByteTimeoutMs": 200,
        **outlier(),
    }
    gw = await gateway(cluster, preset="round-robin", settings=settings)
    for i in range(12):
        if i % 2:
            status, text = await stream(http, gw, i)
            assert "[DONE]" in text
        else:
            status, _ = await whole(http, gw, i)
        assert status == 200  # the attempt on the hung server was retried elsewhere
    bad = gw.datastore.all_endpoints()[0]
    assert bad.health.ejected
    # Three attempts waited out the first-byte timeout there, then it was out.
    failures = dict(gw.metrics.upstream_failures.items())
    assert failures[(bad.name, "timeout")].value == 3
    assert sum(f.value for (name, _), f in failures.items() if name == bad.name) == 3
    # Every failed attempt was retried: the hung server's three, and on a loaded machine
    # a healthy server's first byte can miss the 200 ms too (one did in a CI run).
    assert gw.metrics.retries.value == sum(f.value for f in failures.values())
    assert ejections(gw, bad, CONSECUTIVE_GATEWAY_FAILURE) == 1
    await settle(gw)


async def test_every_server_hung_is_a_504_within_the_first_byte_timeouts(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, faults=Faults(hang=True))
    gw = await gateway(cluster, settings={"firstByteTimeoutMs": 150, **outlier()})
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, text = await stream(http, gw, 0)
    assert status == 504
    assert orjson.loads(text)["error"]["code"] == "upstream_timeout"
    assert loop.time() - started < 2.0  # two attempts of 150 ms, not requestTimeoutMs
    assert gw.metrics.retries.value == 1
    await settle(gw)


async def test_a_5xx_storm_ejects_and_the_server_returns_when_healthy(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(error_rate=1.0, error_status=503)})
    gw = await gateway(cluster, preset="round-robin", settings=outlier(baseEjectionTimeMs=1000))
    first, second, _ = gw.datastore.all_endpoints()
    for i in range(30):  # 503 is retried: the clients see none of it
        status, _ = await whole(http, gw, i, tokens=1)
        assert status == 200
        if first.health.ejected:
            break
    assert first.health.consecutive_5xx == 0  # counted afresh after an ejection
    assert ejections(gw, first, CONSECUTIVE_5XX) == 1
    assert gw.metrics.upstream_failures.labels(first.name, "status 503").value == 5
    # It recovers: once the ejection time is over it is sent requests again.
    cluster.replicas[0].faults.update({"error_rate": 0.0})
    for _ in range(100):
        if not first.health.ejected:
            break
        await asyncio.sleep(0.02)
    assert not first.health.ejected
    assert first.health.on_probation
    pods = Counter([pod for _, pod in [await whole(http, gw, i, 1) for i in range(3)]])
    assert pods[cluster.replicas[0].pod_name] == 1
    assert not first.health.on_probation  # a success ended it
    # A reload makes ejections longer (the test must not see the next one end)...
    spec = gw.config.gateway.outlier_detection.model_copy(update={"base_ejection_time_ms": 6e4})
    settings = gw.config.gateway.model_copy(update={"outlier_detection": spec})
    gw.apply_config(replace(gw.config, gateway=settings))
    # ...and a 500 storm on another replica: not retried, so its clients see 500 until it
    # is out.
    cluster.replicas[1].faults.update({"error_rate": 1.0, "error_status": 500})
    statuses: Counter[int] = Counter()
    for i in range(30):
        status, _ = await whole(http, gw, i, tokens=1)
        statuses[status] += 1
        if second.health.ejected:
            break
    assert statuses == {200: statuses[200], 500: 5}
    assert second.health.ejected_until is not None
    assert second.health.ejected_until - gw.clock.now() > 50.0  # the reloaded base time
    assert ejections(gw, second, CONSECUTIVE_5XX) == 1
    assert ejected_gauge(gw) == 1
    await settle(gw)


async def test_frozen_metrics_make_an_endpoint_stale(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, time_scale=1.0, faults={0: Faults(freeze_metrics=True)})
    gw = await gateway(
        cluster, preset="round-robin", settings={"metricsStalenessMs": 300, **outlier()}
    )
    frozen, live = gw.datastore.all_endpoints()
    body = {
        "model": BASE,
        "prompt": "go on",
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }

    async def long_stream() -> None:
        async with http.post(url(gw), json=body) as r:
            async for _ in r.content.iter_any():
                pass

    streams = [asyncio.create_task(long_stream()) for _ in range(2)]  # one on each
    try:
        for _ in range(150):  # up to 3 s: 300 ms of tokens against a frozen counter
            if frozen.health.metrics_frozen_at is not None:
                break
            await asyncio.sleep(0.02)
        now = gw.clock.now()
        assert frozen.health.metrics_frozen_at is not None
        assert frozen.is_stale(now, gw.staleness_s)
        assert live.health.metrics_frozen_at is None
        assert not live.is_stale(now, gw.staleness_s)
        assert not frozen.health.ejected  # stale, not failing: its requests still work
        # Its /metrics moves again: believed again at once.
        cluster.replicas[0].faults.update({"freeze_metrics": False})
        for _ in range(100):
            if frozen.health.metrics_frozen_at is None:
                break
            await asyncio.sleep(0.02)
        assert frozen.health.metrics_frozen_at is None
        assert not frozen.is_stale(gw.clock.now(), gw.staleness_s)
    finally:
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    await settle(gw)


async def test_a_host_without_a_proxy_reports_through_release(
    sim_cluster: Any, gateway: GatewayFactory
) -> None:
    cluster = await sim_cluster(replicas=3)
    gw = await gateway(cluster, preset="round-robin", settings=outlier())
    runtime = gw.runtime
    raw = orjson.dumps({"model": BASE, "prompt": "x", "max_tokens": 1})
    released = []
    for i in range(9):
        parsed = parse_request("completions", raw, {})
        dispatch = await runtime.acquire(parsed, f"r{i}", {})
        # What Envoy saw: 503 from the first endpoint, 200 from the others.
        status = 503 if dispatch.endpoint.name == "sim-0" else 200
        runtime.release(dispatch, status)
        runtime.release(dispatch, status)  # a second call counts nothing
        released.append(dispatch.endpoint.name)
    first = gw.datastore.all_endpoints()[0]
    assert released.count("sim-0") == 3
    assert first.health.consecutive_5xx == 3
    # An attempt the proxy reported is not counted again at release.
    parsed = parse_request("completions", raw, {})
    dispatch = await runtime.acquire(parsed, "r-proxy", {})
    runtime.report(dispatch, Result.SUCCESS)
    runtime.release(dispatch, 503)
    assert dispatch.endpoint.health.consecutive_5xx == 0
    await settle(gw)
