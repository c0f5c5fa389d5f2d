"""Flow control end to end: a gateway in front of simulated ``tiny`` servers, driven over
HTTP.

Priority under overload (Critical overtakes a Standard backlog, Sheddable is refused),
a queued request whose client leaves, time-to-live expiry, capacity, and the flow-control
metrics. Saturation is made deterministic where a test needs it: a ``concurrency-detector``
with ``maxConcurrency: 1`` on one replica makes the pool full as soon as one request is in
flight.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import pytest
from gw_support import (
    QUEUEING_ANNOTATION,
    gateway_doc,
    model_doc,
    picker_doc,
    pool_doc,
    wait_until_scraped,
)
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.api.loader import build_config
from sluicegate.flowcontrol.controller import FlowController
from sluicegate.framework import ItemState, QueueItem
from sluicegate.gateway.app import Gateway
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.runtime.waiting import FlowWaits, Waiter
from sluicegate.sim.server import SimCluster

BASE = "tiny-llama"
ADAPTER = "sql-lora"
CRITICAL, STANDARD, SHEDDABLE = "critical-chat", "standard-sql", "sheddable-bulk"
MODELS = [
    model_doc(CRITICAL, {BASE: 1}, "Critical"),  # priority 100
    model_doc(STANDARD, {ADAPTER: 1}, "Standard"),  # priority 0, a LoRA adapter
    model_doc(SHEDDABLE, {BASE: 1}, "Sheddable"),  # priority -10
]
ONE_AT_A_TIME = {
    "plugins": [
        {"name": "one", "type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}
    ],
    "saturationDetector": {"pluginRef": "one"},
}
"""Picker fields making a one-replica pool full while one request is in flight."""


class FlowGatewayFactory(Protocol):
    async def __call__(
        self, cluster: SimCluster, *, docs: Sequence[dict[str, Any]] = (), annotate: bool = True
    ) -> Gateway: ...


@pytest.fixture
async def fc_gateway() -> AsyncIterator[FlowGatewayFactory]:
    """Like ``gateway``, with the queueing annotation on the pool (``annotate``)."""
    started: list[Gateway] = []

    async def make(
        cluster: SimCluster, *, docs: Sequence[dict[str, Any]] = (), annotate: bool = True
    ) -> Gateway:
        annotations = {QUEUEING_ANNOTATION: "true"} if annotate else None
        config = build_config(
            [
                pool_doc(cluster.urls, annotations=annotations),
                gateway_doc(scrapeIntervalMs=20, metricsStalenessMs=2000),
                *docs,
            ]
        )
        gw = Gateway(config)
        await gw.start("127.0.0.1", 0)
        started.append(gw)
        await wait_until_scraped(gw)
        return gw

    yield make
    for gw in reversed(started):
        await gw.stop()


def url(gw: Gateway, path: str = "/v1/completions") -> str:
    return f"http://127.0.0.1:{gw.port}{path}"


@dataclass
class Outcome:
    """What a client saw. Times are ``time.monotonic()`` seconds."""

    model: str
    sent: float
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    first_token: float | None = None
    done: float | None = None
    completed: bool = False
    """A 200 stream that ended with ``data: [DONE]``."""
    error: dict[str, Any] | None = None


async def call(
    http: aiohttp.ClientSession,
    gw: Gateway,
    model: str,
    prompt: str,
    max_tokens: int = 20,
    stream: bool = True,
    on_first: Callable[[Outcome], None] | None = None,
) -> Outcome:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
    }
    out = Outcome(model, time.monotonic())
    async with http.post(url(gw), json=body) as r:
        out.status, out.headers = r.status, dict(r.headers)
        if r.status != 200:
            out.error = (await r.json())["error"]
        elif stream:
            async for line in r.content:
                if out.first_token is None and line.startswith(b"data: {"):
                    out.first_token = time.monotonic()
                    if on_first is not None:
                        on_first(out)
                if line.strip() == b"data: [DONE]":
                    out.completed = True
        else:
            await r.read()
            out.completed = True
    out.done = time.monotonic()
    return out


async def until(condition: Callable[[], bool], what: str, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(http: aiohttp.ClientSession, gw: Gateway) -> Samples:
    async with http.get(url(gw, "/metrics")) as r:
        assert r.status == 200
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"/metrics has no {name}{labels}"
    return samples[key]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s series that carry ``labels`` (among others: fairness id,
    model names)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert found, f"/metrics has no {name}{labels}"
    return sum(found)


QUEUE_SIZE = "inference_extension_flow_control_queue_size"
QUEUE_BYTES = "inference_extension_flow_control_queue_bytes"
SATURATION = "inference_extension_flow_control_pool_saturation"
QUEUE_WAIT = "inference_extension_flow_control_request_queue_duration_seconds"
REFUSED = "sluicegate_requests_refused_total"


def controller(gw: Gateway) -> FlowController:
    return gw.director.controllers()["pool"]


def waiting(gw: Gateway, priority: int | None = None) -> int:
    c = gw.director.controllers().get("pool")
    if c is None:
        return 0
    return sum(b.requests for b in c.bands() if priority is None or b.priority == priority)


def inflight(gw: Gateway) -> list[tuple[int, int, int]]:
    return [
        (e.inflight.requests, e.inflight.prompt_tokens, e.inflight.decode_tokens)
        for e in gw.datastore.all_endpoints()
    ]


async def assert_drained(http: aiohttp.ClientSession, gw: Gateway) -> Samples:
    """Nothing waits, nothing is in flight, and /metrics says so."""
    # A handler releases its dispatch just after the client has read the last byte.
    await until(lambda: all(x == (0, 0, 0) for x in inflight(gw)), "in-flight counts to drain")
    assert waiting(gw) == 0
    samples = await scrape(http, gw)
    for (name, labels), value in samples.items():
        if name in (QUEUE_SIZE, QUEUE_BYTES, "inference_objective_running_requests"):
            assert value == 0, (name, labels)
    return samples


# ========================================================================== overload


N_STANDARD = 120
N_CRITICAL = 10
N_SHEDDABLE = 8


async def test_critical_overtakes_a_standard_backlog_and_sheddable_is_refused(
    sim_cluster: Any, fc_gateway: FlowGatewayFactory, http: aiohttp.ClientSession
) -> None:
    # Two tiny replicas (16 sequences each) at 1/25 speed: a 20-token stream lasts about
    # a second, and the pool takes some 30 at a time, so 120 standard streams queue for
    # about four rounds.
    cluster = await sim_cluster(replicas=2, time_scale=25.0, lora=[ADAPTER])
    gw = await fc_gateway(cluster, docs=MODELS)

    # Strict priority, watched where it is decided: whenever a request leaves the queue,
    # no request of a higher priority may still be waiting (every request here can use
    # every endpoint, so "no room for it" would mean "no room for anyone").
    violations: list[tuple[int, list[tuple[int, int]]]] = []
    observe_wait = gw.runtime.observe.wait

    def watch(item: QueueItem, pool: str, outcome: str) -> None:
        if outcome == "dispatched":
            above = [
                (b.priority, b.requests)
                for b in controller(gw).bands()
                if b.priority > item.priority
            ]
            if any(n for _, n in above):
                violations.append((item.priority, above))
        observe_wait(item, pool, outcome)

    gw.runtime.observe.wait = watch  # type: ignore[method-assign]

    started: set[int] = set()  # standard requests that have their first token
    standard = [
        asyncio.create_task(
            call(http, gw, STANDARD, f"standard {i}", on_first=lambda o, i=i: started.add(i))
        )
        for i in range(N_STANDARD)
    ]
    # Overload: a round of standard streams running, most of the rest queued.
    await until(lambda: len(started) >= 10 and waiting(gw, 0) >= 60, "a standard backlog")

    during = await scrape(http, gw)
    assert total(during, QUEUE_SIZE, inference_pool="pool", priority="0") >= 60
    assert total(during, QUEUE_BYTES, inference_pool="pool", priority="0") > 0
    assert sample(during, SATURATION, inference_pool="pool") >= 1.0

    # Sheddable requests are refused at once while the pool is saturated.
    shed = await asyncio.gather(
        *(call(http, gw, SHEDDABLE, f"bulk {i}", stream=False) for i in range(N_SHEDDABLE))
    )
    assert waiting(gw, 0) > 0  # (still saturated: the premise held throughout)
    for o in shed:
        assert o.status == 429, o
        assert o.headers["Retry-After"] == "1"
        assert o.headers["x-sluicegate-dropped-reason"] == "rejected-saturated"
        assert o.error is not None
        assert o.error["type"] == "rate_limit_error"

    # Critical requests arrive behind the backlog and overtake it.
    t_critical = time.monotonic()
    backlog = [i for i in range(N_STANDARD) if i not in started]
    critical = await asyncio.gather(
        *(call(http, gw, CRITICAL, f"critical {i}") for i in range(N_CRITICAL))
    )
    results = await asyncio.gather(*standard)

    for o in [*results, *critical]:
        assert o.status == 200, o
        assert o.completed, o
    assert violations == []

    def ttft(o: Outcome) -> float:
        assert o.first_token is not None
        return o.first_token - t_critical

    critical_ttft = sorted(ttft(o) for o in critical)
    backlog_ttft = sorted(ttft(results[i]) for i in backlog)
    assert len(backlog) >= 50
    # Every critical request starts before most of the standard ones already waiting (it
    # waits for one round of running streams to end, the backlog for up to three), and on
    # average far sooner (observed: about half the time).
    assert critical_ttft[-1] < statistics.median(backlog_ttft), (critical_ttft, backlog_ttft)
    assert statistics.mean(critical_ttft) < 0.75 * statistics.mean(backlog_ttft), (
        critical_ttft,
        backlog_ttft,
    )

    after = await assert_drained(http, gw)
    labels = {"inference_pool": "pool"}
    assert total(after, QUEUE_SIZE, **labels, priority="100") == 0
    assert total(after, QUEUE_SIZE, **labels, priority="0") == 0
    assert total(after, QUEUE_BYTES, **labels, priority="0") == 0
    assert total(after, f"{QUEUE_WAIT}_count", priority="100", outcome="Dispatched") == N_CRITICAL
    assert total(after, f"{QUEUE_WAIT}_count", priority="0", outcome="Dispatched") == N_STANDARD
    assert total(after, f"{QUEUE_WAIT}_bucket", priority="0", outcome="Dispatched", le="+Inf") == (
        N_STANDARD
    )
    assert total(after, f"{QUEUE_WAIT}_sum", priority="0", outcome="Dispatched") > 0
    assert sample(after, REFUSED, reason="rejected-saturated") == N_SHEDDABLE


# ======================================================================= disconnects


async def test_queued_request_whose_client_leaves_is_removed(
    sim_cluster: Any, fc_gateway: FlowGatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, time_scale=1.0)
    gw = await fc_gateway(cluster, docs=[picker_doc(**ONE_AT_A_TIME)])
    long = {"model": BASE, "prompt": "hold", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as holder, holder.post(url(gw), json=long) as held:
        assert held.status == 200
        await held.content.readany()  # one request in flight: the pool is full

        body = b'{"model": "tiny-llama", "prompt": "waiting", "max_tokens": 5}'
        leaving = asyncio.create_task(
            http.post(url(gw), data=body, headers={"Content-Type": "application/json"})
        )
        await until(lambda: waiting(gw, 0) == 1, "the request to queue")
        during = await scrape(http, gw)
        assert total(during, QUEUE_SIZE, inference_pool="pool", priority="0") == 1
        assert total(during, QUEUE_BYTES, inference_pool="pool", priority="0") == len(body)
        assert sample(during, SATURATION, inference_pool="pool") == 1.0

        leaving.cancel()  # the client goes away while its request waits
        with pytest.raises(asyncio.CancelledError):
            await leaving
        await until(lambda: waiting(gw) == 0, "the queue to forget the request")
        samples = await scrape(http, gw)
        assert total(samples, QUEUE_SIZE, inference_pool="pool", priority="0") == 0
        assert (
            total(samples, f"{QUEUE_WAIT}_count", priority="0", outcome="EvictedContextCancelled")
            == 1
        )
        assert [n for n, _, _ in inflight(gw)] == [1]  # only the held request
    # The held stream is closed: its place is free again, and nothing leaked to fill it.
    await until(lambda: inflight(gw) == [(0, 0, 0)], "the held request to be released")
    async with http.post(url(gw), json={"model": BASE, "prompt": "after", "max_tokens": 2}) as r:
        assert r.status == 200
    await assert_drained(http, gw)


async def test_dispatched_just_as_the_client_leaves_is_released() -> None:
    # Regression: a request dispatched (its waiter resolved) in the same loop iteration in
    # which its client disconnected kept its in-flight charge forever — with a
    # concurrency limit, a lost place in the pool.
    config = build_config(
        [
            pool_doc(["127.0.0.1:9"], annotations={QUEUEING_ANNOTATION: "true"}),
            gateway_doc(),
            picker_doc(**ONE_AT_A_TIME),
        ]
    )
    gw = Gateway(config)  # not started: no I/O happens here
    director = gw.director
    waits = FlowWaits(director, gw.runtime.observe, gw.clock)

    def submit(name: str) -> tuple[QueueItem, Waiter]:
        parsed = parse_request("completions", b'{"model": "m", "prompt": "x"}', {})
        ticket = waits.ticket("pool")
        item = director.submit(director.admit(parsed, name, {}), ticket)
        assert isinstance(item, QueueItem)
        return item, ticket

    first, first_ticket = submit("first")
    first_waiter = first_ticket.future
    assert first.state is ItemState.DISPATCHED
    second, second_ticket = submit("second")
    assert second.state is ItemState.QUEUED
    handler = asyncio.create_task(waits.wait(second, second_ticket))
    await asyncio.sleep(0)  # the handler now waits for its turn
    first_waiter.result().finish(gw.clock.now())
    director.pump()  # the second request gets the place...
    assert second.state is ItemState.DISPATCHED
    handler.cancel()  # ...and its client leaves before the handler runs again
    with pytest.raises(asyncio.CancelledError):
        await handler
    endpoint = gw.datastore.all_endpoints()[0]
    assert endpoint.inflight.requests == 0
    third, _ = submit("third")
    assert third.state is ItemState.DISPATCHED  # the place was not lost
    waits.stop()


# ============================================================= time to live, capacity


async def test_ttl_expiry_is_503_with_an_openai_error_body(
    sim_cluster: Any, fc_gateway: FlowGatewayFactory, http: aiohttp.ClientSession
) -> None:
    # The adapter is loaded: a target no server lists is refused at once, never queued.
    cluster = await sim_cluster(replicas=1, time_scale=1.0, lora=[ADAPTER])
    picker = picker_doc(
        featureGates=["flowControl"],  # the gate: no annotation needed
        flowControl={"defaultRequestTTL": "1s", "maxRequests": 2},
        **ONE_AT_A_TIME,
    )
    gw = await fc_gateway(cluster, docs=[picker, *MODELS], annotate=False)
    long = {"model": BASE, "prompt": "hold", "max_tokens": 3000, "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as holder, holder.post(url(gw), json=long) as held:
        assert held.status == 200
        await held.content.readany()

        started = time.monotonic()
        expiring = [
            asyncio.create_task(call(http, gw, STANDARD, "plain", stream=False)),
            asyncio.create_task(call(http, gw, CRITICAL, "streamed", stream=True)),
        ]
        await until(lambda: waiting(gw) == 2, "two requests to queue")
        # The queue holds two requests (maxRequests): a third is refused at once.
        full = await call(http, gw, CRITICAL, "one too many", stream=False)
        assert full.status == 429
        assert full.headers["x-sluicegate-dropped-reason"] == "rejected-capacity"
        assert full.headers["Retry-After"] == "1"
        outcomes = await asyncio.gather(*expiring)
        elapsed = time.monotonic() - started

    assert 0.9 <= elapsed < 10.0
    for o in outcomes:
        assert o.status == 503, o
        assert o.headers["Content-Type"].startswith("application/json")
        assert o.headers["Retry-After"] == "1"
        assert o.headers["x-sluicegate-dropped-reason"] == "rejected-ttl-expired"
        assert o.error == {
            "message": "request timed out in queue",
            "type": "service_unavailable",
            "param": None,
            "code": "queue_timeout",
        }
    samples = await assert_drained(http, gw)
    assert sample(samples, REFUSED, reason="rejected-ttl-expired") == 2
    assert sample(samples, REFUSED, reason="rejected-capacity") == 1
    for priority in ("0", "100"):
        expired = {"priority": priority, "outcome": "EvictedTTL"}
        assert total(samples, f"{QUEUE_WAIT}_count", **expired) == 1
        assert total(samples, f"{QUEUE_WAIT}_sum", **expired) >= 1.0  # waited the full TTL
