"""A hung server (it accepts requests and never answers, its /metrics still answers) costs
one stall timeout to the requests sent there, not requestTimeoutMs: it is found stalled,
ejected, and its requests are retried on the other servers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from gw_support import GatewayFactory
from test_gateway_outlier import BASE, ejected_gauge, ejections, outlier, settle, url

from sluicegate.datalayer.outlier import STALLED
from sluicegate.gateway.app import Gateway
from sluicegate.sim.faults import Faults

STALL_MS = 300
SLOW_S = 2 * STALL_MS / 1000.0 + 0.7
"""A request that waited longer than this paid for more than one stall timeout (two, plus
slack for a busy machine: the requests of a wave queue on a loaded event loop too)."""
WAVE = 30


async def timed(
    http: aiohttp.ClientSession, gw: Gateway, i: int, stream: bool
) -> tuple[int, str, str, float]:
    """Status, serving pod, body and seconds taken of one request."""
    body = {"model": BASE, "prompt": f"h{i}", "max_tokens": 5, "ignore_eos": True}
    if stream:
        body["stream"] = True
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(url(gw), json=body) as r:
        text = (await r.read()).decode()
        return r.status, r.headers.get("x-inference-pod", ""), text, loop.time() - started


async def wave(
    http: aiohttp.ClientSession, gw: Gateway, first: int, stream: bool
) -> list[tuple[int, str, str, float]]:
    calls = (timed(http, gw, first + i, stream) for i in range(WAVE))
    # Bounded well under requestTimeoutMs: a request left on the hung server fails the test.
    return await asyncio.wait_for(asyncio.gather(*calls), 5.0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_hung_server_costs_one_stall_timeout_and_is_ejected(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession, stream: bool
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(hang=True)})
    settings = {"requestTimeoutMs": 20_000, **outlier(stallTimeoutMs=STALL_MS)}
    gw = await gateway(cluster, preset="round-robin", settings=settings)
    bad = gw.datastore.all_endpoints()[0]
    hung_pod = cluster.replicas[0].pod_name
    results = await wave(http, gw, 0, stream)
    assert [status for status, *_ in results] == [200] * WAVE
    assert hung_pod not in {pod for _, pod, _, _ in results}
    if stream:  # aborted before their first byte: retried whole, no error event
        assert all(text.rstrip().endswith("data: [DONE]") for _, _, text, _ in results)
        assert not any("upstream_error" in text for _, _, text, _ in results)
    else:
        assert all(orjson.loads(text)["choices"] for _, _, text, _ in results)
    # Found stalled and ejected once; each request it held was aborted and retried once.
    assert bad.health.ejected
    assert bad.health.ejection_reason == STALLED
    assert ejections(gw, bad, STALLED) == 1
    assert ejected_gauge(gw) == 1
    retried = gw.metrics.retries.value
    assert 1 <= retried <= WAVE // 3 + 1  # round-robin sent about a third there
    assert gw.metrics.upstream_failures.labels(bad.name, "read").value == retried
    # Those waited about one stall timeout, far from requestTimeoutMs (20 s).
    slowest = max(seconds for *_, seconds in results)
    assert STALL_MS / 1000.0 <= slowest < 2.0
    slow = sum(seconds > SLOW_S for *_, seconds in results)
    assert slow == 0, sorted(seconds for *_, seconds in results)
    # Once it is out, nothing waits on it.
    later = await wave(http, gw, WAVE, stream)
    assert [status for status, *_ in later] == [200] * WAVE
    assert max(seconds for *_, seconds in later) < SLOW_S
    assert gw.metrics.retries.value == retried
    await settle(gw)
    assert gw.upstream is not None
    assert gw.upstream.live_exchanges() == 0


async def test_stall_detection_off_leaves_hung_requests_to_the_request_timeout(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3, faults={0: Faults(hang=True)})
    settings = {"requestTimeoutMs": 1500, **outlier(stallTimeoutMs=0)}
    gw = await gateway(cluster, preset="round-robin", settings=settings)
    results = await asyncio.gather(*(timed(http, gw, i, False) for i in range(6)))
    # What the stall rule fixes: the hung server's share wait the whole timeout, then 504.
    timed_out = [seconds for status, _, _, seconds in results if status == 504]
    assert len(timed_out) == 2
    assert min(timed_out) >= 1.4
    assert ejections(gw, gw.datastore.all_endpoints()[0], STALLED) == 0
    await settle(gw)
