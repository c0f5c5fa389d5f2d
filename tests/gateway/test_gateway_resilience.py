"""Failures upstream: dead replicas, stale metrics, errors, hangs, cut streams, disconnects."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import orjson
from gw_support import GatewayFactory

from sluicegate.gateway.app import Gateway
from sluicegate.sim.faults import Faults

BASE = "tiny-llama"


def url(gw: Gateway, path: str = "/v1/completions") -> str:
    return f"http://127.0.0.1:{gw.port}{path}"


def assert_no_inflight(gw: Gateway) -> None:
    for e in gw.datastore.all_endpoints():
        assert e.inflight.requests == 0, (e.name, e.inflight)
        assert e.inflight.prompt_tokens == 0, (e.name, e.inflight)
        assert e.inflight.decode_tokens == 0, (e.name, e.inflight)


async def test_killed_replica_costs_no_failed_non_streaming_request(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, time_scale=0.5)
    gw = await gateway(cluster)
    statuses: Counter[int] = Counter()
    started = asyncio.Event()

    async def one(i: int) -> None:
        body = {"model": BASE, "prompt": f"request {i} " * 8, "max_tokens": 30, "ignore_eos": True}
        async with http.post(url(gw), json=body) as r:
            await r.read()
            statuses[r.status] += 1
        if i == 10:
            started.set()

    async def killer() -> None:
        await started.wait()
        await cluster.replicas[0].stop()

    sem = asyncio.Semaphore(12)

    async def bounded(i: int) -> None:
        async with sem:
            await one(i)

    await asyncio.gather(killer(), *(bounded(i) for i in range(60)))
    assert statuses == {200: 60}
    dead = gw.datastore.all_endpoints()[0]
    assert dead.health.consecutive_failures > 0
    assert gw.metrics.retries.value > 0
    assert_no_inflight(gw)


async def test_stale_idle_metrics_do_not_attract_a_burst(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=4, time_scale=1.0)
    # Scrapes stay fresh however late a starved event loop runs them: an endpoint whose
    # scrape went stale is left out of the choice (by design), which would decide where
    # the burst goes instead of what this test is about.
    gw = await gateway(cluster, settings={"metricsStalenessMs": 30000})
    # Replica 0 keeps reporting the idle scrape it showed before the burst...
    cluster.replicas[0].faults.update({"freeze_metrics": True})
    await http.get(f"{cluster.replicas[0].url}/metrics")
    # ...while the others report real queues from load that bypasses the gateway.
    background = [
        asyncio.create_task(
            http.post(
                f"{r.url}/v1/completions",
                json={
                    "model": BASE,
                    "prompt": f"background {i}",
                    "max_tokens": 3000,
                    "ignore_eos": True,
                },
            )
        )
        for r in cluster.replicas[1:]
        for i in range(20)
    ]

    def loaded() -> list[int]:
        """What the gateway's last scrapes say waits on each of replicas 1-3."""
        return [
            e.metrics.waiting if e.metrics is not None else 0
            for e in gw.datastore.all_endpoints()[1:]
        ]

    for _ in range(1500):  # up to 30 s on a busy machine; a few scrapes normally
        if all(n > 0 for n in loaded()):
            break
        await asyncio.sleep(0.02)
    # The premise: the gateway has seen the others' queues (else they look as idle as
    # replica 0, and where the burst goes says nothing).
    assert all(n > 0 for n in loaded()), loaded()
    burst = [
        asyncio.create_task(
            http.post(
                url(gw),
                json={
                    "model": BASE,
                    "prompt": f"burst request number {i}",
                    "max_tokens": 3000,
                },
            )
        )
        for i in range(48)
    ]
    # Count where the burst landed on the servers themselves (background: 20 each on 1-3).
    already = [0, 20, 20, 20]
    for _ in range(1000):  # up to 10 s on a busy machine
        placed = [r.engine.num_requests - a for r, a in zip(cluster.replicas, already, strict=True)]
        if sum(placed) == 48:
            break
        await asyncio.sleep(0.01)
    for task in background + burst:
        task.cancel()
    await asyncio.gather(*background, *burst, return_exceptions=True)
    # Going by its scrape alone, every request would go to the "idle" replica 0; the
    # gateway's own in-flight count shows the queue it is building there.
    assert sum(placed) == 48, placed
    assert placed[0] <= 48 // 2, placed
    assert all(n > 0 for n in placed), placed
    for _ in range(100):
        if all(e.inflight.requests == 0 for e in gw.datastore.all_endpoints()):
            break
        await asyncio.sleep(0.02)
    assert_no_inflight(gw)


async def test_upstream_errors_are_retried_elsewhere(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(error_rate=1.0, error_status=503)})
    gw = await gateway(cluster, preset="round-robin")
    pods: Counter[str] = Counter()
    for i in range(12):
        async with http.post(
            url(gw), json={"model": BASE, "prompt": f"x{i}", "max_tokens": 1}
        ) as r:
            assert r.status == 200
            pods[r.headers["x-inference-pod"]] += 1
    assert cluster.replicas[0].pod_name not in pods
    assert gw.metrics.retries.value >= 3
    assert_no_inflight(gw)


async def test_every_upstream_failing_is_502(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, faults=Faults(error_rate=1.0, error_status=503))
    gw = await gateway(cluster)
    async with http.post(url(gw), json={"model": BASE, "prompt": "x", "max_tokens": 1}) as r:
        # Every endpoint answered 503: the last answer is relayed as it is.
        assert r.status == 503
    await cluster.stop()
    async with http.post(url(gw), json={"model": BASE, "prompt": "y", "max_tokens": 1}) as r:
        assert r.status in (502, 503)
        assert (await r.json())["error"]["message"]
    assert_no_inflight(gw)


async def test_hung_upstream_is_504(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, faults=Faults(hang=True))
    gw = await gateway(cluster, settings={"requestTimeoutMs": 300})
    async with http.post(url(gw), json={"model": BASE, "prompt": "x", "max_tokens": 1}) as r:
        assert r.status == 504
        assert (await r.json())["error"]["code"] == "upstream_timeout"
    assert_no_inflight(gw)


async def test_stream_cut_mid_way_ends_with_an_error_event(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, faults=Faults(reset_after_tokens=3))
    gw = await gateway(cluster)
    body = {
        "model": BASE,
        "prompt": "tell me a story",
        "max_tokens": 20,
        "stream": True,
        "ignore_eos": True,
    }
    async with http.post(url(gw), json=body) as r:
        assert r.status == 200
        text = (await r.read()).decode()
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    tokens = [orjson.loads(e) for e in events[:-1]]
    assert len(tokens) == 3
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_error"
    assert "[DONE]" not in text
    assert_no_inflight(gw)
    # Counted as a failed request (502), not as a success the latency metrics learn from.
    failed = gw.metrics.registry.get_sample_value(
        "inference_objective_request_error_total",
        {"model_name": BASE, "target_model_name": BASE, "error_code": "502"},
    )
    assert failed == 1


async def test_non_streaming_request_cut_mid_way_is_retried(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, faults={0: Faults(reset_after_tokens=2)})
    gw = await gateway(cluster, preset="round-robin")
    for i in range(6):
        body = {"model": BASE, "prompt": f"p{i}", "max_tokens": 5, "ignore_eos": True}
        async with http.post(url(gw), json=body) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["completion_tokens"] == 5
            assert r.headers["x-inference-pod"] == cluster.replicas[1].pod_name
    assert_no_inflight(gw)


async def test_client_disconnect_aborts_the_upstream_request(
    sim_cluster: Any, gateway: GatewayFactory
) -> None:
    cluster = await sim_cluster(replicas=1, time_scale=1.0)
    gw = await gateway(cluster)
    engine = cluster.replicas[0].engine
    body = {
        "model": BASE,
        "prompt": "a long answer please",
        "max_tokens": 2000,
        "stream": True,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as session, session.post(url(gw), json=body) as r:
        assert r.status == 200
        await r.content.readany()
        assert engine.num_requests == 1
    for _ in range(100):
        if engine.num_requests == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.num_requests == 0
    assert engine.pool.usage == 0.0
    for _ in range(50):
        if gw.datastore.all_endpoints()[0].inflight.requests == 0:
            break
        await asyncio.sleep(0.02)
    assert_no_inflight(gw)
