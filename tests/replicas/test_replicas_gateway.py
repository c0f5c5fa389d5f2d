"""Two gateways sharing state through a real Redis, in front of one simulated pool: they
agree on prefixes and load, and no request fails when Redis stops, freezes or returns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

pytest.importorskip("redis", reason="the shared-state tests need the redis client (dev extra)")

from redis_support import RedisServer

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.runtime import RuntimeOptions
from sluicegate.scheduling.config import load_preset
from sluicegate.sim.server import SimCluster

Start = Callable[..., Any]


def _docs(cluster: SimCluster, shared: dict[str, Any] | None) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {"scrapeIntervalMs": 20, "metricsStalenessMs": 2000}
    if shared is not None:
        spec["sharedState"] = shared
    return [
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool"},
            "spec": {
                "targetPorts": [{"number": 8000}],
                "endpoints": [
                    {"address": u, "name": f"sim-{i}"} for i, u in enumerate(cluster.urls)
                ],
            },
        },
        {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig", "spec": spec},
    ]


@pytest.fixture
async def gateways() -> AsyncIterator[Start]:
    started: list[Gateway] = []

    async def start(
        cluster: SimCluster, shared: dict[str, Any] | None, preset: str = "default"
    ) -> Gateway:
        config = build_config(_docs(cluster, shared))
        config.picker = load_preset(preset)
        # Each replica its own seed: equal seeds would make equal tie breaks, an agreement
        # that is no sharing at all.
        gw = Gateway(config, GatewayOptions(RuntimeOptions(seed=len(started))))
        await gw.start("127.0.0.1", 0)
        started.append(gw)
        assert gw.collector is not None
        for e in gw.datastore.all_endpoints():
            await gw.collector.refresh(e)
        return gw

    yield start
    for gw in reversed(started):
        await gw.stop()


def _shared(redis_server: RedisServer, timeout_ms: float = 1000, **more: Any) -> dict[str, Any]:
    # A generous timeout where a fallback is not under test: this machine's cores are shared.
    return {
        "redis": {"url": redis_server.url, "timeoutMs": timeout_ms},
        "inflightSyncMs": 10,
        "prefixFlushMs": 2,
        "leaseMs": 500,
        "retryMs": 50,
        **more,
    }


async def _complete(
    http: aiohttp.ClientSession, gw: Gateway, prompt: str, max_tokens: int = 2
) -> tuple[int, str]:
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    async with http.post(f"http://127.0.0.1:{gw.port}/v1/completions", json=body) as r:
        await r.read()
        return r.status, r.headers.get("x-inference-pod", "")


def _received(gw: Gateway) -> int:
    shared = gw.runtime.shared
    return shared.share.received if shared is not None and shared.share is not None else 0


async def _first_choices_agree(
    http: aiohttp.ClientSession, a: Gateway, b: Gateway, groups: int
) -> int:
    """Groups whose first request through ``b`` went where ``a`` had sent theirs."""
    agreed = 0
    for g in range(groups):
        prompt = f"system prompt {g}: " + f"context of group {g} " * 80
        before = _received(b)
        status, on_a = await _complete(http, a, prompt + "question 0")
        assert status == 200
        # Wait for the prefix batch's flush and delivery (a few ms) when b shares state.
        deadline = time.monotonic() + 2.0
        while b.runtime.shared is not None and _received(b) == before:
            assert time.monotonic() < deadline, "a's decision never reached b"
            await asyncio.sleep(0.002)
        status, on_b = await _complete(http, b, prompt + "question 1")
        assert status == 200
        agreed += on_a == on_b
    return agreed


async def test_replicas_agree_on_prefixes(
    redis_server: RedisServer, sim_cluster: Any, gateways: Start, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=4, time_scale=0.02)
    a = await gateways(cluster, _shared(redis_server, replicaId="a"))
    b = await gateways(cluster, _shared(redis_server, replicaId="b"))
    assert await _first_choices_agree(http, a, b, groups=8) == 8
    # The same through two independent gateways, for contrast: b knows nothing of a's
    # choices, so its first request of a group goes where load (or a tie break) sends it.
    c = await gateways(cluster, None)
    d = await gateways(cluster, None)
    independent = await _first_choices_agree(http, c, d, groups=8)
    assert independent < 8


async def test_a_burst_over_two_replicas_spreads_over_the_servers(
    redis_server: RedisServer, sim_cluster: Any, gateways: Start, http: aiohttp.ClientSession
) -> None:
    # Long answers stay in flight; least-request picks by in-flight requests alone, so
    # only the shared counts keep b off the servers a has just loaded (scrapes lag).
    cluster = await sim_cluster(replicas=4, time_scale=1.0)
    shared = _shared(redis_server)
    a = await gateways(cluster, shared, preset="least-request")
    b = await gateways(cluster, shared, preset="least-request")
    tasks: list[asyncio.Task[tuple[int, str]]] = []
    for i in range(4):
        gw, other = (a, b) if i % 2 == 0 else (b, a)
        tasks.append(asyncio.create_task(_complete(http, gw, f"burst {i}", max_tokens=200)))
        # Until the other replica has seen this one's new request (one sync interval
        # each side, a few ms; longer on a loaded machine). No scrape happens meanwhile
        # that could tell it either: the test's scrape interval is 20 ms, but the
        # simulator's queue counts only reach it with the next scrape after dispatch.
        mine = i // 2 + 1
        deadline = time.monotonic() + 2.0
        while sum(e.peers.requests for e in other.datastore.all_endpoints()) < mine:
            assert time.monotonic() < deadline, "the other replica never saw the request"
            await asyncio.sleep(0.002)
    results = await asyncio.gather(*tasks)
    assert [s for s, _ in results] == [200] * 4
    assert len({pod for _, pod in results}) == 4, results


async def _scrape(http: aiohttp.ClientSession, gw: Gateway) -> str:
    async with http.get(f"http://127.0.0.1:{gw.port}/metrics") as r:
        return await r.text()


def _value(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_no_request_fails_when_redis_stops_freezes_or_returns(
    redis_server: RedisServer, sim_cluster: Any, gateways: Start, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, time_scale=0.02)
    shared = _shared(redis_server, timeout_ms=100)
    a = await gateways(cluster, shared)
    b = await gateways(cluster, shared)
    statuses: list[int] = []
    answered = [0] * 6  # per client
    stop = asyncio.Event()

    async def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            gw = a if (i + k) % 2 == 0 else b
            status, _ = await _complete(http, gw, f"conversation {k % 5} turn {i}")
            statuses.append(status)
            answered[k] += 1
            i += 1

    async def each_client_answered(times: int) -> None:
        """Wait (up to 20 s) until every client got `times` more answers: counts, not a
        wall-clock window, so a loaded machine slows the test instead of failing it."""
        start = list(answered)
        deadline = time.monotonic() + 20.0
        while any(n - s < times for n, s in zip(answered, start, strict=True)):
            assert time.monotonic() < deadline, (start, answered)
            await asyncio.sleep(0.02)

    async def sharing(gw: Gateway) -> None:
        """Wait (up to 10 s) until ``gw`` shares state: on a loaded machine one sync can
        run into the 100 ms timeout and mark it down for a moment."""
        deadline = time.monotonic() + 10.0
        while _value(await _scrape(http, gw), "sluicegate_shared_state_up") != 1:
            assert time.monotonic() < deadline, "sharing did not start or resume"
            await asyncio.sleep(0.05)

    clients = [asyncio.create_task(client(k)) for k in range(6)]
    try:
        await asyncio.sleep(0.3)
        await sharing(a)
        redis_server.stop()
        await asyncio.sleep(0.5)
        await each_client_answered(2)
        down = await _scrape(http, a)
        assert _value(down, "sluicegate_shared_state_up") == 0
        assert _value(down, "sluicegate_shared_state_fallbacks_total") > 0
        assert all(e.peers.requests == 0 for e in a.datastore.all_endpoints())
        redis_server.start()
        await sharing(a)
        redis_server.pause()  # slow, not gone: every call runs into the timeout
        await asyncio.sleep(0.5)
        assert _value(await _scrape(http, b), "sluicegate_shared_state_up") == 0
        # The request path never waits on Redis: while it is frozen (every call runs into
        # the timeout) each of the six clients goes on being answered, several times.
        await each_client_answered(3)
        assert _value(await _scrape(http, b), "sluicegate_shared_state_up") == 0
        redis_server.resume()
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert set(statuses) == {200}
