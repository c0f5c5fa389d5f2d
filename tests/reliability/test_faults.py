"""Faults upstream, injected through the simulator (``/admin/faults`` and start options)
and by killing processes. Every test checks what the client sees, that no non-streaming
request is lost where a retry was possible, and that the in-flight gauges return to 0.
Tests whose docstring starts with "Issue 14" need outlier detection (ejection on
consecutive 5xx answers and gateway failures, with a return after ``baseEjectionTimeMs``).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from support import (
    AUTH,
    BASE,
    M_EJECTED,
    M_EJECTIONS,
    M_RETRIES,
    OUTLIER_SETTINGS,
    S_FIRST_BYTE_TIMEOUT,
    S_MAX_RETRIES,
    S_OUTLIER,
    S_REQUEST_TIMEOUT,
    GatewayFactory,
    assert_inflight_zero,
    child_env,
    samples,
)

from sluicegate.gateway.app import Gateway
from sluicegate.sim.faults import Faults
from sluicegate.sim.server import SimCluster

HEADERS = {"authorization": AUTH}
_serial = itertools.count()
"""Every prompt differs: a shared prefix would pin requests to one server by affinity."""


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


def _url(gw: Gateway, path: str = "/v1/completions") -> str:
    return f"http://127.0.0.1:{gw.port}{path}"


async def complete(
    http: aiohttp.ClientSession, gw: Gateway, max_tokens: int = 4, stream: bool = False
) -> tuple[int, str, bytes]:
    """One completion: (status, endpoint that served it or "", body)."""
    prompt = f"request {next(_serial)}: fault test"
    body = {"model": BASE, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        body["stream"] = True
    async with http.post(_url(gw), json=body, headers=HEADERS) as r:
        data = await r.read()
        return r.status, r.headers.get("x-gateway-destination-endpoint-served", ""), data


async def burst(
    http: aiohttp.ClientSession,
    gw: Gateway,
    n: int,
    concurrency: int = 4,
    max_tokens: int = 4,
    stream: bool = False,
) -> list[tuple[int, str, bytes]]:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> tuple[int, str, bytes]:
        async with sem:
            return await complete(http, gw, max_tokens, stream)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def metrics(http: aiohttp.ClientSession, gw: Gateway) -> str:
    async with http.get(_url(gw, "/metrics"), headers=HEADERS) as r:
        assert r.status == 200
        return await r.text()


async def settled(http: aiohttp.ClientSession, gw: Gateway) -> None:
    """The in-flight gauges read 0 (a request is released just after its answer: wait up
    to 1 s for the last ones)."""
    deadline = time.monotonic() + 1.0
    while True:
        text = await metrics(http, gw)
        try:
            assert_inflight_zero(text)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


def stream_failed(body: bytes) -> bool:
    """A streamed answer that ended with the gateway's error event instead of [DONE]."""
    return b'"error"' in body and not body.rstrip().endswith(b"data: [DONE]")


def served_by(results: list[tuple[int, str, bytes]], cluster: SimCluster) -> Counter[int]:
    ports = {str(r.port): i for i, r in enumerate(cluster.replicas)}
    return Counter(ports.get(addr.rsplit(":", 1)[-1], -1) for _, addr, _ in results)


async def ready_pods(http: aiohttp.ClientSession, gw: Gateway) -> float:
    return sum(v for _, v in samples(await metrics(http, gw), "inference_pool_ready_pods"))


# ---------------------------------------------------------------------------- crashes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_sim_process(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "sim", "--profile", "tiny", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )


async def _until_up(http: aiohttp.ClientSession, port: int) -> None:
    """Wait for a simulator process's /health (its start-up: seconds on a busy machine)."""
    for _ in range(200):
        try:
            async with http.get(f"http://127.0.0.1:{port}/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"the simulator on port {port} did not start")


async def test_a_killed_server_process_costs_no_non_streaming_request(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """SIGKILL of a model server process under load: every non-streaming request is
    answered 200 (retried elsewhere), the dead one stops being ready within a second;
    started again, it is ready and serving again; nothing stays in flight."""
    port = _free_port()
    proc = _start_sim_process(port)
    try:
        await _until_up(http, port)
        healthy = await sim_cluster(replicas=1, time_scale=1.0)
        gw = await relgw([f"127.0.0.1:{port}", *healthy.urls])
        done = 0

        async def one() -> tuple[int, str, bytes]:
            nonlocal done
            result = await complete(http, gw, max_tokens=60)
            done += 1
            if done == 4:
                proc.kill()
            return result

        sem = asyncio.Semaphore(8)

        async def bounded() -> tuple[int, str, bytes]:
            async with sem:
                return await one()

        results = await asyncio.gather(*(bounded() for _ in range(32)))
        assert Counter(s for s, _, _ in results) == {200: 32}
        assert proc.wait(5) is not None
        for _ in range(40):  # scrapes fail every 20 ms: ejected within a second
            if await ready_pods(http, gw) == 1:
                break
            await asyncio.sleep(0.05)
        assert await ready_pods(http, gw) == 1
        await settled(http, gw)
        proc = _start_sim_process(port)  # the server comes back on its address
        await _until_up(http, port)
        for _ in range(100):
            if await ready_pods(http, gw) == 2:
                break
            await asyncio.sleep(0.05)
        assert await ready_pods(http, gw) == 2
        later = await burst(http, gw, 16, concurrency=8, max_tokens=30)
        assert Counter(s for s, _, _ in later) == {200: 16}
        assert len({addr for _, addr, _ in later}) == 2, "the restarted server got no traffic"
        await settled(http, gw)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


async def test_a_server_stopped_mid_stream_ends_the_stream_with_an_error_event(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, time_scale=1.0)
    gw = await relgw(cluster.urls)
    body = {"model": BASE, "prompt": "long", "max_tokens": 400, "ignore_eos": True, "stream": True}
    async with http.post(_url(gw), json=body, headers=HEADERS) as r:
        assert r.status == 200
        first = await r.content.readuntil(b"\n\n")
        assert first.startswith(b"data: ")
        await cluster.replicas[0].stop()
        rest = await asyncio.wait_for(r.content.read(), 5)
    assert stream_failed(first + rest), rest[-300:]
    await cluster.replicas[0].start("127.0.0.1", cluster.replicas[0].port)
    await settled(http, gw)


async def test_reset_after_tokens_is_retried_for_whole_answers(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """A server that cuts every connection after 2 tokens: non-streaming requests are
    retried on the other server and all succeed."""
    cluster = await sim_cluster(replicas=2, faults={0: Faults(reset_after_tokens=2)})
    gw = await relgw(cluster.urls)
    results = await burst(http, gw, 24, max_tokens=8)
    assert Counter(s for s, _, _ in results) == {200: 24}
    assert served_by(results, cluster)[0] == 0
    await settled(http, gw)


async def test_reset_after_tokens_mid_stream_ends_streams_cleanly(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """Streams cut after 3 tokens end with an error event (never hang, never a 500);
    streams on the healthy server complete."""
    cluster = await sim_cluster(replicas=2, faults={0: Faults(reset_after_tokens=3)})
    gw = await relgw(cluster.urls)
    results = await asyncio.wait_for(burst(http, gw, 16, max_tokens=12, stream=True), 20)
    assert {s for s, _, _ in results} == {200}
    broken = [stream_failed(b) for _, _, b in results]
    by = [addr for _, addr, _ in results]
    bad_port = str(cluster.replicas[0].port)
    for failed, addr in zip(broken, by, strict=True):
        assert failed == addr.endswith(":" + bad_port), (failed, addr)
    await settled(http, gw)


async def test_a_hung_server_times_out_and_nothing_stays_in_flight(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """A server that accepts requests and never answers: those requests are answered 504
    at the request timeout, the others 200."""
    cluster = await sim_cluster(replicas=2, faults={0: Faults(hang=True)})
    gw = await relgw(cluster.urls, {S_REQUEST_TIMEOUT: 400})
    started = time.monotonic()
    results = await burst(http, gw, 12, concurrency=6)
    assert time.monotonic() - started < 5
    statuses = Counter(s for s, _, _ in results)
    assert set(statuses) <= {200, 504}, statuses
    assert statuses[200] >= 1
    for status, _, body in results:
        if status == 504:
            assert orjson.loads(body)["error"]["code"]
    await settled(http, gw)


# ---------------------------------------------------------------------------- storms


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_a_retryable_5xx_storm_loses_no_request(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession, status: int
) -> None:
    """One server answering only ``status``: every request is retried and served."""
    faults = {0: Faults(error_rate=1.0, error_status=status)}
    cluster = await sim_cluster(replicas=2, faults=faults)
    gw = await relgw(cluster.urls, {S_MAX_RETRIES: 2})
    results = await burst(http, gw, 30)
    assert Counter(s for s, _, _ in results) == {200: 30}
    await settled(http, gw)


# ---------------------------------------------------------------------------- metrics


async def test_frozen_metrics_do_not_draw_all_the_traffic(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """A server whose /metrics text froze while idle keeps looking idle: the gateway's
    own in-flight count still spreads a burst, and every request succeeds."""
    cluster = await sim_cluster(replicas=2, time_scale=1.0, faults={0: Faults(freeze_metrics=True)})
    gw = await relgw(cluster.urls)
    results = await burst(http, gw, 24, concurrency=12, max_tokens=40)
    assert Counter(s for s, _, _ in results) == {200: 24}
    share = served_by(results, cluster)
    assert share[1] >= 4, share
    await settled(http, gw)


# ---------------------------------------------------------------------------- outages


async def test_all_servers_down_then_one_comes_back(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """With every server dead, requests get a prompt 502/503 error body (not a hang, not
    a 500) and /ready says 503; a server that comes back serves again."""
    cluster = await sim_cluster(replicas=2)
    gw = await relgw(cluster.urls)
    ports = [r.port for r in cluster.replicas]
    await cluster.stop()
    started = time.monotonic()
    results = await burst(http, gw, 8)
    assert time.monotonic() - started < 5
    for status, _, body in results:
        assert status in (502, 503), status
        assert orjson.loads(body)["error"]["message"]
    for _ in range(40):
        async with http.get(_url(gw, "/ready")) as r:
            if r.status == 503:
                break
        await asyncio.sleep(0.05)
    assert r.status == 503
    await cluster.replicas[1].start("127.0.0.1", ports[1])
    deadline = time.monotonic() + 5
    while (await complete(http, gw))[0] != 200:
        assert time.monotonic() < deadline, "the server that came back gets no traffic"
        await asyncio.sleep(0.05)
    later = await burst(http, gw, 10)
    assert Counter(s for s, _, _ in later) == {200: 10}
    await settled(http, gw)


# ---------------------------------------------------------------------------- issue 14
# The hardening work's promises: these fail until its branches are merged.


async def _ejected(http: aiohttp.ClientSession, gw: Gateway) -> tuple[float, float]:
    """(ejections of server 0 so far, servers ejected now)."""
    text = await metrics(http, gw)
    ejections = sum(v for labels, v in samples(text, M_EJECTIONS) if "sim-0" in labels)
    ejected = sum(v for _, v in samples(text, M_EJECTED))
    return ejections, ejected


_5XX = OUTLIER_SETTINGS["consecutive5xx"]
_GATEWAY = OUTLIER_SETTINGS["consecutiveGatewayFailure"]
# A 500 is passed to the client; 502-504 and resets are retried on the other server,
# unseen, and so are the requests a hung server holds: found stalled, it is ejected and
# their connections are cut, so they are retried elsewhere before any byte reached them.
EJECTING_FAULTS: dict[str, tuple[dict[str, Any], int, bool]] = {
    # fault on server 0 -> (its fields, failures in a row that eject, the client sees them)
    "500": ({"error_rate": 1.0, "error_status": 500}, _5XX, True),
    "502": ({"error_rate": 1.0, "error_status": 502}, _5XX, False),
    "503": ({"error_rate": 1.0, "error_status": 503}, _5XX, False),
    "504": ({"error_rate": 1.0, "error_status": 504}, _5XX, False),
    "reset": ({"reset_after_tokens": 0}, _GATEWAY, False),
    "hang": ({"hang": True}, _GATEWAY, False),
}
HEALTHY = {"error_rate": 0.0, "reset_after_tokens": None, "hang": False}


@pytest.mark.parametrize("fault", list(EJECTING_FAULTS))
async def test_a_failing_server_is_ejected_and_returns_after_recovery(
    sim_cluster: Any, relgw: GatewayFactory, http: aiohttp.ClientSession, fault: str
) -> None:
    """Issue 14: a server failing every request (a 5xx storm, resets, a hang) is ejected
    after ``consecutive5xx`` / ``consecutiveGatewayFailure`` failures in a row: it fails
    at most that many requests per ejection, and the client sees none of them where a
    retry was possible. Healthy again, it gets traffic back after ``baseEjectionTimeMs``."""
    changes, in_a_row, seen_by_client = EJECTING_FAULTS[fault]
    cluster = await sim_cluster(replicas=2)
    cluster.replicas[0].faults.update(changes)
    gw = await relgw(cluster.urls, {S_OUTLIER: OUTLIER_SETTINGS, S_FIRST_BYTE_TIMEOUT: 300})
    failed = []
    most_ejected = 0.0
    for _ in range(16):  # one at a time: countable
        status, _, _ = await complete(http, gw)
        if status != 200:
            failed.append(status)
        most_ejected = max(most_ejected, (await _ejected(http, gw))[1])
    retried = sum(v for _, v in samples(await metrics(http, gw), M_RETRIES))
    ejections = (await _ejected(http, gw))[0]
    assert ejections >= 1
    assert most_ejected == 1
    assert len(failed) + retried <= in_a_row * ejections, (failed, retried, ejections)
    if not seen_by_client:
        assert not failed, failed
    cluster.replicas[0].faults.update(HEALTHY)
    # Back after the ejection time (which may grow with each ejection, as Envoy's does).
    deadline = time.monotonic() + 4 * OUTLIER_SETTINGS["baseEjectionTimeMs"] / 1000 + 1.0
    while True:
        later = await burst(http, gw, 8)
        assert Counter(s for s, _, _ in later) == {200: 8}
        if served_by(later, cluster)[0] > 0:
            break
        assert time.monotonic() < deadline, "the recovered server got no traffic back"
        await asyncio.sleep(0.1)
    assert (await _ejected(http, gw))[1] == 0
    await settled(http, gw)
