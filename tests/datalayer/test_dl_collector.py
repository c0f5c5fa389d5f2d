"""The collector: scrape loops, /v1/models discovery, ejection and recovery, task lifetime.

Model servers are small aiohttp servers whose answers each test scripts (``fake_server``
in this folder's conftest); time stamps come from a :class:`ManualClock`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest

from sluicegate.clock import ManualClock
from sluicegate.datalayer.collector import (
    MAX_LISTED_ENTRY_BYTES,
    MAX_LISTED_MODELS,
    Collector,
    CollectorSettings,
    parse_models,
)
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint, ServedModels
from sluicegate.upstream import UpstreamPool

POOL = "pool"
FAST = CollectorSettings(
    scrape_interval_s=0.01, scrape_timeout_s=2.0, models_interval_s=0.02, eject_after=3
)


async def wait_for(condition: Callable[[], bool], within: float = 3.0) -> None:
    """Poll ``condition`` until it holds; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def collector_tasks() -> list[asyncio.Task[Any]]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith(("scrape-", "models-")) and not t.done()
    ]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def datastore() -> Datastore:
    return Datastore()


@pytest.fixture
async def make_collector(
    datastore: Datastore, upstream: UpstreamPool, clock: ManualClock
) -> AsyncIterator[Callable[..., Collector]]:
    made: list[Collector] = []

    def make(settings: CollectorSettings = FAST) -> Collector:
        collector = Collector(datastore, upstream, clock, settings)
        made.append(collector)
        return collector

    yield make
    for collector in made:
        await collector.stop()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A local port that refuses connections (bound, never listening)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def add(datastore: Datastore, *endpoints: tuple[str, int], engine: str = "vllm") -> list[Endpoint]:
    specs = [EndpointSpec(f"ep-{port}", host, port, engine_type=engine) for host, port in endpoints]
    datastore.set_endpoints(POOL, specs)
    return datastore.pools[POOL].endpoints


# --------------------------------------------------------------------------- scraping


async def test_refresh_fills_metrics_and_models(
    fake_server: Any,
    datastore: Datastore,
    make_collector: Any,
    clock: ManualClock,
    gauges: Any,
    models_payload: Any,
) -> None:
    server = await fake_server()
    server.set_metrics(gauges(waiting=2, running=5, kv=0.25))
    server.set_models(models_payload("llama", "sql-lora", "chat-lora"))
    (ep,) = add(datastore, server.address)
    ep.inflight.dispatch(100, 10)
    collector = make_collector()

    await collector.refresh(ep)

    assert ep.metrics is not None
    assert (ep.metrics.waiting, ep.metrics.running, ep.metrics.kv_usage) == (2, 5, 0.25)
    assert ep.metrics.scraped_at == 100.0
    assert ep.inflight.requests_since_scrape == 0
    assert ep.inflight.prompt_tokens_since_scrape == 0
    assert ep.inflight.requests == 1  # only the since-scrape counters reset
    assert ep.inflight.prompt_tokens == 100
    assert ep.models == ServedModels(
        frozenset({"llama"}), frozenset({"sql-lora", "chat-lora"}), 100.0
    )
    assert ep.models.known
    assert ep.models.serves("sql-lora")
    assert not ep.models.serves("other")


async def test_real_vllm_scrape_over_http(
    fake_server: Any, datastore: Datastore, make_collector: Any, vllm_scrape: str
) -> None:
    server = await fake_server()
    server.set_metrics(vllm_scrape)
    (ep,) = add(datastore, server.address)
    await make_collector().refresh(ep)
    assert ep.metrics is not None
    assert (ep.metrics.block_size, ep.metrics.num_gpu_blocks) == (128, 8192)
    assert ep.kv_capacity_tokens == 128 * 8192


async def test_scrape_loop_uses_injected_clock(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector()
    collector.start()
    await wait_for(lambda: ep.metrics is not None)
    assert ep.metrics is not None
    assert ep.metrics.scraped_at == 100.0

    server.set_metrics(gauges(waiting=9))
    clock.advance(2.5)
    ep.inflight.dispatch(40, 4)
    assert ep.inflight.requests_since_scrape == 1
    await wait_for(lambda: ep.metrics is not None and ep.metrics.waiting == 9)
    assert ep.metrics is not None
    assert ep.metrics.scraped_at == 102.5
    await wait_for(lambda: ep.inflight.requests_since_scrape == 0)
    assert ep.inflight.prompt_tokens_since_scrape == 0
    assert not ep.is_stale(clock.now(), 1.0)


async def test_models_loop_discovers_adapters(
    fake_server: Any, datastore: Datastore, make_collector: Any, models_payload: Any
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    make_collector().start()
    await wait_for(lambda: ep.models.known)
    assert ep.models.base_models == frozenset({"base"})
    assert ep.models.adapters == frozenset()

    server.set_models(models_payload("base", "new-lora"))
    await wait_for(lambda: "new-lora" in ep.models.adapters)
    assert ep.models.base_models == frozenset({"base"})


async def test_models_failures_keep_the_last_list(
    fake_server: Any, datastore: Datastore, make_collector: Any, models_payload: Any
) -> None:
    server = await fake_server()
    server.set_models(models_payload("base", "a"))
    (ep,) = add(datastore, server.address)
    collector = make_collector()
    await collector.refresh(ep)
    before = ep.models
    for body, status in [(b"not json", 200), (b'{"data": 5}', 200), (b"{}", 500)]:
        server.set_models(body, status)
        await collector.refresh(ep)
        assert ep.models is before
    # /v1/models failures do not count as connection failures.
    assert ep.health.consecutive_failures == 0


async def test_endpoints_added_after_start_are_scraped(
    fake_server: Any, datastore: Datastore, make_collector: Any
) -> None:
    a, b = await fake_server(), await fake_server()
    collector = make_collector()
    add(datastore, a.address)
    collector.start()
    first, second = add(datastore, a.address, b.address)
    await wait_for(lambda: first.metrics is not None and second.metrics is not None)
    assert b.hits["/metrics"] >= 1


async def test_not_started_collector_does_not_scrape(
    fake_server: Any, datastore: Datastore, make_collector: Any
) -> None:
    server = await fake_server()
    make_collector()
    (ep,) = add(datastore, server.address)
    await asyncio.sleep(0.05)
    assert server.hits["/metrics"] == 0
    assert ep.metrics is None
    assert collector_tasks() == []


# --------------------------------------------------------------------------- failures


FailureSetup = Callable[[Any], Awaitable[None]]


async def _status_500(server: Any) -> None:
    server.set_metrics("internal error", status=500)


async def _timeout(server: Any) -> None:
    server.set_metrics("vllm:num_requests_waiting 1\n", delay=0.25)


async def _garbage(server: Any) -> None:
    server.set_metrics(b"\x00\xff<html>definitely not prometheus</html>")


async def _malformed(server: Any) -> None:
    server.set_metrics('vllm:num_requests_waiting{engine="0" 3\n')


async def _non_finite(server: Any) -> None:
    server.set_metrics("vllm:num_requests_waiting +Inf\n")


async def _stopped(server: Any) -> None:
    await server.stop()


@pytest.mark.parametrize(
    "fail",
    [_status_500, _timeout, _garbage, _malformed, _non_finite, _stopped],
    ids=["500", "timeout", "garbage", "malformed", "non-finite", "connection-refused"],
)
async def test_failures_eject_and_keep_old_snapshot(
    fake_server: Any,
    datastore: Datastore,
    make_collector: Any,
    clock: ManualClock,
    fail: FailureSetup,
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    timeout = 0.1 if fail is _timeout else 2.0
    collector = make_collector(
        CollectorSettings(scrape_interval_s=0.01, scrape_timeout_s=timeout, eject_after=3)
    )
    for _ in range(20):  # a loaded machine may miss a 0.1 s deadline now and then
        await collector.refresh(ep)
        if ep.metrics is not None:
            break
    assert ep.health.consecutive_failures == 0
    snapshot = ep.metrics
    assert snapshot is not None
    ep.inflight.dispatch(10, 10)

    await fail(server)
    for failures in (1, 2, 3, 4):
        clock.advance(1.0)
        await collector.refresh(ep)
        assert ep.health.consecutive_failures == failures
        assert ep.health.ejected is (failures >= 3)
        assert ep.health.last_error.startswith("scrape: ")
        assert ep.metrics is snapshot  # the old snapshot stays, with its old time stamp
    # ... so it is stale by age, never mistaken for a fresh idle scrape.
    assert ep.is_stale(clock.now(), 1.0)
    # Since-scrape accounting is not reset by a failed scrape.
    assert ep.inflight.requests_since_scrape == 1


async def test_success_unejects(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector()
    server.set_metrics("oops", status=503)
    for _ in range(3):
        await collector.refresh(ep)
    assert ep.health.ejected
    assert ep.metrics is None

    server.set_metrics(gauges(running=1))
    clock.advance(5.0)
    await collector.refresh(ep)
    assert not ep.health.ejected
    assert ep.health.consecutive_failures == 0
    assert ep.metrics is not None
    assert ep.metrics.scraped_at == 105.0


async def test_loop_ejects_then_recovers(
    fake_server: Any, datastore: Datastore, make_collector: Any, gauges: Any
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    make_collector().start()
    await wait_for(lambda: ep.metrics is not None)
    server.set_metrics("down", status=500)
    await wait_for(lambda: ep.health.ejected)
    assert ep.health.consecutive_failures >= 3
    # Ejected endpoints are still probed, and come back on the first success.
    server.set_metrics(gauges())
    await wait_for(lambda: not ep.health.ejected)
    assert ep.health.consecutive_failures == 0


async def test_connection_refused_from_the_start(
    datastore: Datastore, make_collector: Any, refused_port: int
) -> None:
    (ep,) = add(datastore, ("127.0.0.1", refused_port))
    collector = make_collector()
    for _ in range(3):
        await collector.refresh(ep)
    assert ep.health.ejected
    assert ep.metrics is None
    assert not ep.models.known
    assert "ClientConnectorError" in ep.health.last_error or "Connect" in ep.health.last_error


async def test_record_scrape_failure_and_success(
    datastore: Datastore, make_collector: Any, caplog: pytest.LogCaptureFixture
) -> None:
    (ep,) = add(datastore, ("127.0.0.1", 1))
    collector = make_collector(CollectorSettings(eject_after=2))
    with caplog.at_level(logging.INFO, logger="sluicegate.datalayer"):
        collector.record_failure(ep, "connect: refused")
        assert not ep.health.ejected
        collector.record_failure(ep, "connect: refused again")
        assert ep.health.ejected
        assert ep.health.last_error == "connect: refused again"
        collector.record_failure(ep, "third")
        assert ep.health.consecutive_failures == 3
        collector.record_success(ep)
    assert not ep.health.ejected
    assert ep.health.consecutive_failures == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("ejected after 2 failed scrapes" in m for m in messages) == 1  # logged once
    assert any("answers its scrapes again" in m for m in messages)


async def test_a_good_scrape_does_not_end_a_request_failure_ejection(
    datastore: Datastore, make_collector: Any
) -> None:
    (ep,) = add(datastore, ("127.0.0.1", 1))
    collector = make_collector(CollectorSettings(eject_after=2))
    ep.health.ejected_until = 100.0  # the outlier detector's
    ep.health.consecutive_gateway_failures = 2
    ep.health.sync()
    collector.record_failure(ep, "scrape: refused")
    collector.record_failure(ep, "scrape: refused")
    collector.record_success(ep)
    assert ep.health.ejected
    assert not ep.health.scrape_ejected
    assert ep.health.consecutive_gateway_failures == 2


async def test_unknown_engine_type_is_not_scraped(
    fake_server: Any, datastore: Datastore, make_collector: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address, engine="tgi")
    with caplog.at_level(logging.ERROR, logger="sluicegate.datalayer"):
        make_collector().start()
        await wait_for(lambda: ep.models.known)  # models are still listed
    assert server.hits["/metrics"] == 0
    assert ep.metrics is None
    assert any("unknown engine type 'tgi'" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- task lifetime


async def test_removed_endpoints_stop_being_scraped(
    fake_server: Any, datastore: Datastore, make_collector: Any
) -> None:
    a, b = await fake_server(), await fake_server()
    collector = make_collector()
    collector.start()
    ep_a, ep_b = add(datastore, a.address, b.address)
    await wait_for(lambda: ep_a.metrics is not None and ep_b.metrics is not None)
    assert len(collector_tasks()) == 4

    add(datastore, b.address)  # a leaves the pool
    b_tasks = {f"scrape-{ep_b.name}", f"models-{ep_b.name}"}
    await wait_for(lambda: {t.get_name() for t in collector_tasks()} == b_tasks)
    await asyncio.sleep(0.02)  # let a request that was already sent reach the server
    hits = a.hits["/metrics"]
    seen_b = b.hits["/metrics"]
    await asyncio.sleep(0.08)
    assert a.hits["/metrics"] == hits
    assert b.hits["/metrics"] > seen_b

    await collector.stop()
    assert collector_tasks() == []


async def test_stop_leaves_no_task_after_removals(
    fake_server: Any, datastore: Datastore, make_collector: Any
) -> None:
    server = await fake_server()
    collector = make_collector()
    collector.start()
    (ep,) = add(datastore, server.address)
    await wait_for(lambda: ep.metrics is not None)
    datastore.remove_pool(POOL)
    # stop() right away, without yielding to the loop first: the tasks cancelled on removal
    # must be finished when it returns too.
    await collector.stop()
    assert collector_tasks() == []


async def test_stop_cancels_tasks_mid_request(
    fake_server: Any, datastore: Datastore, make_collector: Any
) -> None:
    server = await fake_server()
    server.set_metrics("vllm:num_requests_waiting 1\n", delay=0.3)
    server.set_models(b"{}", delay=0.3)
    collector = make_collector(CollectorSettings(scrape_timeout_s=5.0))
    collector.start()
    add(datastore, server.address)
    await wait_for(lambda: server.hits["/metrics"] >= 1 and server.hits["/v1/models"] >= 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await collector.stop()
    assert loop.time() - started < 0.5
    assert collector_tasks() == []
    # Adding endpoints to a stopped collector's datastore starts nothing.
    add(datastore, server.address, ("127.0.0.1", 9))
    assert collector_tasks() == []


async def test_start_twice_does_not_duplicate_tasks(
    fake_server: Any, datastore: Datastore, make_collector: Any
) -> None:
    server = await fake_server()
    add(datastore, server.address)
    collector = make_collector()
    collector.start()
    collector.start()
    assert len(collector_tasks()) == 2


# --------------------------------------------------------------------------- parse_models


@pytest.mark.parametrize(
    "payload",
    [None, [], "models", 3, {}, {"data": None}, {"data": {"id": "x"}}, {"object": "list"}],
)
def test_parse_models_malformed(payload: object) -> None:
    assert parse_models(payload, 1.0) is None


def test_parse_models_skips_bad_entries() -> None:
    payload = {
        "data": [
            {"id": "base", "parent": None},
            {"id": "lora-a", "parent": "base"},
            {"id": 7},
            "string-entry",
            None,
            {"name": "no-id"},
            {"id": "empty-parent", "parent": ""},
            {"id": "no-parent-key"},
        ]
    }
    models = parse_models(payload, 3.0)
    assert models == ServedModels(
        frozenset({"base", "empty-parent", "no-parent-key"}), frozenset({"lora-a"}), 3.0
    )


def test_parse_models_empty_list_is_known_but_serves_nothing() -> None:
    models = parse_models({"object": "list", "data": []}, 0.0)
    assert models is not None
    assert models.known
    assert not models.serves("anything")


def test_parse_models_real_vllm_shape() -> None:
    raw = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": "meta-llama/Llama-3.1-8B-Instruct",
                    "object": "model",
                    "created": 1,
                    "owned_by": "vllm",
                    "root": "meta-llama/Llama-3.1-8B-Instruct",
                    "parent": None,
                    "max_model_len": 8192,
                    "permission": [{"id": "modelperm-1", "object": "model_permission"}],
                },
                {
                    "id": "sql-lora",
                    "object": "model",
                    "created": 1,
                    "owned_by": "vllm",
                    "root": "/adapters/sql",
                    "parent": "meta-llama/Llama-3.1-8B-Instruct",
                    "max_model_len": None,
                    "permission": [],
                },
            ],
        }
    )
    models = parse_models(orjson.loads(raw), 0.0)
    assert models is not None
    assert models.base_models == frozenset({"meta-llama/Llama-3.1-8B-Instruct"})
    assert models.adapters == frozenset({"sql-lora"})


# --------------------------------------------------------------------------- frozen metrics


def with_tokens(gauges: Any, generated: float, running: int = 1) -> str:
    counter = f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {generated}\n'
    return gauges(running=running) + counter


async def relayed_but_not_counted(
    collector: Collector, ep: Endpoint, clock: ManualClock, counter_at_dispatch: float, n: int
) -> None:
    """``n`` scrapes 0.25 s apart, each after an answer dispatched on the count of
    ``counter_at_dispatch`` was relayed, none counting it: the endpoint is judged frozen."""
    for _ in range(n):
        ep.inflight.relayed(counter_at_dispatch)
        clock.advance(0.25)
        await collector.refresh(ep)
    assert ep.health.metrics_frozen_at is not None


async def test_a_frozen_token_counter_under_relayed_tokens_turns_stale(
    fake_server: Any,
    datastore: Datastore,
    make_collector: Any,
    clock: ManualClock,
    gauges: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector(CollectorSettings(frozen_after_s=1.0, frozen_recheck_s=30.0))
    server.set_metrics(with_tokens(gauges, 10))
    await collector.refresh(ep)
    assert ep.metrics is not None
    # Idle and saying so: an unchanged counter with nothing relayed is believed.
    for _ in range(5):
        clock.advance(0.5)
        await collector.refresh(ep)
        assert ep.metrics.scraped_at == clock.now()
    believed_at = clock.now()
    # Tokens relayed, counter stuck: not believed, dated from the last believable scrape.
    with caplog.at_level(logging.WARNING, logger="sluicegate.datalayer"):
        for _ in range(4):
            clock.advance(0.25)
            ep.inflight.relayed(10)  # an answer to a request dispatched on the count of 10
            ep.inflight.dispatch(10, 5)
            await collector.refresh(ep)
            assert ep.metrics.scraped_at == believed_at
    assert ep.is_stale(clock.now() + 0.01, 1.0)
    assert ep.health.metrics_frozen_at == clock.now()  # 1 s of it
    assert ep.inflight.requests_since_scrape == 4  # a frozen scrape does not count them
    assert sum("frozen" in r.getMessage() for r in caplog.records) == 1
    # Sticky: with nothing relayed any more (it gets no traffic), still not believed...
    clock.advance(5.0)
    ep.inflight.token_check = None
    await collector.refresh(ep)
    assert ep.metrics.scraped_at == believed_at
    # ...until the counter moves again.
    server.set_metrics(with_tokens(gauges, 11))
    clock.advance(0.05)
    await collector.refresh(ep)
    assert ep.metrics.scraped_at == clock.now()
    assert ep.health.metrics_frozen_at is None
    assert ep.inflight.token_check is None


async def test_an_answer_relayed_after_a_scrape_counted_it_is_not_frozen(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    """The counter moves while the tokens are generated, before the answer is relayed: a
    scrape between the two already counts them. The endpoint then idles, its counter
    standing still; it stays believed (it was judged frozen and went stale, out of
    routing for the recheck time, when relays were compared with the last scrape)."""
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector(CollectorSettings(frozen_after_s=1.0, frozen_recheck_s=30.0))
    server.set_metrics(with_tokens(gauges, 10, running=0))
    await collector.refresh(ep)
    counter_at_dispatch = 10.0  # the request is dispatched on this scrape
    server.set_metrics(with_tokens(gauges, 14, running=1))  # its 4 tokens generated...
    clock.advance(0.05)
    await collector.refresh(ep)  # ...and counted by a scrape
    ep.inflight.relayed(counter_at_dispatch)  # then its answer is relayed
    server.set_metrics(with_tokens(gauges, 14, running=0))
    for _ in range(20):  # idle for 5 s
        clock.advance(0.25)
        await collector.refresh(ep)
        assert ep.metrics is not None
        assert ep.metrics.scraped_at == clock.now()
    assert ep.health.metrics_frozen_at is None
    assert ep.inflight.token_check is None
    # Relayed again on a dispatch after the count of 14, nothing counted: judged frozen.
    await relayed_but_not_counted(collector, ep, clock, 14, 5)


async def test_a_restarted_server_whose_counter_stands_on_the_check_is_believed(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    """A request dispatched on the count of 0 is answered and the process dies before a
    scrape counts the answer; restarted, the server counts from 0 again, exactly the
    check. Its counter went back, so that is a restart, not a frozen /metrics (it was
    judged frozen at once, the last believed scrape being seconds old, and got no traffic
    for the recheck time: the killed-server reliability test's flake)."""
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector(CollectorSettings(frozen_after_s=1.0, frozen_recheck_s=30.0))
    server.set_metrics(with_tokens(gauges, 0, running=0))
    await collector.refresh(ep)  # a request is dispatched on this count of 0
    server.set_metrics(with_tokens(gauges, 240, running=4))  # its tokens are generated
    clock.advance(0.05)
    await collector.refresh(ep)
    ep.inflight.relayed(0.0)  # its answer is relayed; then the process is killed
    server.set_metrics("", status=503)
    for _ in range(2):  # fewer failures than eject it: the check stays
        clock.advance(1.0)
        await collector.refresh(ep)
    assert not ep.health.scrape_ejected
    assert ep.inflight.token_check == 0.0
    server.set_metrics(with_tokens(gauges, 0, running=0))  # restarted: counting from 0
    clock.advance(0.05)
    await collector.refresh(ep)
    assert ep.health.metrics_frozen_at is None
    assert ep.metrics is not None
    assert ep.metrics.scraped_at == clock.now()
    assert ep.inflight.token_check is None
    # It is watched as before: relays on the new count of 0 that nothing counts freeze it.
    await relayed_but_not_counted(collector, ep, clock, 0.0, 6)


async def test_a_server_restarted_on_the_count_it_last_showed_is_believed(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    """Killed right after an answer dispatched on the count of 0, before any scrape saw
    the counter move; restarted, it shows 0 again: the same count as the check *and* as
    the last scrape. The outage ejected it, and relays before an outage are not checked
    against what answers after it."""
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector(CollectorSettings(frozen_after_s=1.0, frozen_recheck_s=30.0))
    server.set_metrics(with_tokens(gauges, 0, running=0))
    await collector.refresh(ep)
    ep.inflight.relayed(0.0)
    server.set_metrics("", status=503)
    for _ in range(3):
        clock.advance(1.0)
        await collector.refresh(ep)
    assert ep.health.scrape_ejected
    server.set_metrics(with_tokens(gauges, 0, running=0))
    clock.advance(0.05)
    await collector.refresh(ep)
    assert ep.health.metrics_frozen_at is None
    assert ep.metrics is not None
    assert ep.metrics.scraped_at == clock.now()


async def test_a_frozen_endpoint_gets_another_chance_after_the_recheck_time(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    server = await fake_server()
    (ep,) = add(datastore, server.address)
    collector = make_collector(CollectorSettings(frozen_after_s=1.0, frozen_recheck_s=30.0))
    server.set_metrics(with_tokens(gauges, 10))
    await collector.refresh(ep)
    await relayed_but_not_counted(collector, ep, clock, 10, 5)
    clock.advance(30.0)
    await collector.refresh(ep)
    assert ep.health.metrics_frozen_at is None
    assert ep.metrics is not None
    assert ep.metrics.scraped_at == clock.now()


async def test_engines_without_a_token_counter_are_not_judged_frozen(
    fake_server: Any, datastore: Datastore, make_collector: Any, clock: ManualClock, gauges: Any
) -> None:
    server = await fake_server()
    server.set_metrics(gauges(running=3))  # no generation counter in the text
    (ep,) = add(datastore, server.address)
    collector = make_collector(CollectorSettings(frozen_after_s=1.0))
    for _ in range(10):
        ep.inflight.relayed(0.0)
        await collector.refresh(ep)
        assert ep.metrics is not None
        assert ep.metrics.scraped_at == clock.now()
        clock.advance(0.5)
    assert ep.health.metrics_frozen_at is None


def test_parse_models_keeps_the_entries_bounded() -> None:
    card = {"id": "base", "object": "model", "root": "/m", "parent": None, "max_model_len": 8}
    huge = {"id": "huge", "blob": "x" * (MAX_LISTED_ENTRY_BYTES + 1)}
    many = [{"id": f"a{i}", "parent": "base"} for i in range(MAX_LISTED_MODELS + 5)]
    models = parse_models({"data": [card, huge, *many]}, 1.0)
    assert models is not None
    assert models.entries[0] == card  # as the server wrote it
    assert all(e["id"] != "huge" for e in models.entries)  # too long to keep
    assert len(models.entries) == MAX_LISTED_MODELS
    assert "huge" in models.base_models  # still served: only the entry is not kept
    assert len(models.adapters) == MAX_LISTED_MODELS + 5
