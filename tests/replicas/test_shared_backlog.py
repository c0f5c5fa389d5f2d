"""Applying the peers' prefix batches shares the event loop, and an outage resumes where
the reader stopped: against a real Redis server."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("redis", reason="the shared-state tests need the redis client (dev extra)")

from redis_support import RedisServer

from sluicegate.api.settings import SharedStateSettings
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.sharing import PrefixRecord
from sluicegate.runtime.shared import APPLY_SLICE_BATCHES, SharedState
from sluicegate.runtime.shared_wire import MAX_RECORD_BLOCKS, encode_prefix, later_id
from sluicegate.scheduling.approximate import ApproximatePrefix

NAMES = ["sim-0", "sim-1"]
Factory = Callable[..., SharedState]


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[Factory]:
    made: list[SharedState] = []

    def make(**overrides: Any) -> SharedState:
        spec: dict[str, Any] = {
            "redis": {"url": redis_server.url, "timeoutMs": 200},
            "leaseMs": 400,
            "inflightSyncMs": 20,
            "prefixFlushMs": 2,
            "retryMs": 50,
            **overrides,
        }
        ds = Datastore()
        specs = [EndpointSpec(name=n, host="127.0.0.1", port=9000 + i) for i, n in enumerate(NAMES)]
        ds.set_endpoints("pool", specs)
        state = SharedState(SharedStateSettings.model_validate(spec), ds)
        made.append(state)
        return state

    yield make
    for state in made:
        await state.stop()


def _matcher(state: SharedState) -> ApproximatePrefix:
    m = ApproximatePrefix(16, 0, 100_000, auto_tune=False)
    assert state.share is not None
    m.share(state.share, "approx/16")
    return m


async def _until(check: Callable[[], bool], within_s: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not check():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


async def test_a_large_backlog_is_applied_in_slices(replicas: Factory) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    _matcher(b)
    total = 96
    for i in range(total):  # 96 full batches (64 KiB each) waiting in the stream
        hashes = list(range(i * MAX_RECORD_BLOCKS, (i + 1) * MAX_RECORD_BLOCKS))
        (batch,) = encode_prefix([PrefixRecord("approx/16", "sim-0", hashes, None)])
        await a.client.xadd(a.stream_key, {"r": "a", "d": batch})
    seen: list[int] = []  # b.batches_read at each tick of another coroutine
    done = False

    async def ticker() -> None:
        while not done:
            seen.append(b.batches_read)
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    last = "0-0"
    while b.batches_read < total:
        after = await b.read_prefix(last, None)
        assert after is not None
        last = after
    done = True
    await tick
    # The other coroutine ran between every few batches, never only between reads.
    jumps = [y - x for x, y in itertools.pairwise(seen)]
    assert max(jumps) <= APPLY_SLICE_BATCHES
    assert len(set(seen)) >= total // APPLY_SLICE_BATCHES


async def test_after_an_outage_the_reader_resumes_where_it_stopped(
    replicas: Factory, redis_server: RedisServer
) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    ma, mb = _matcher(a), _matcher(b)
    assert a.share is not None
    a.start()
    b.start()
    a.share.publish("approx/16", "sim-1", [1, 2, 3], None)
    await _until(lambda: b.batches_read == 1, within_s=5.0)
    redis_server.pause()
    try:
        await _until(lambda: b.fallbacks.get("prefix-read", 0) >= 1, within_s=5.0)
    finally:
        redis_server.resume()
    await _until(lambda: b.up and a.up, within_s=5.0)
    a.share.publish("approx/16", "sim-1", [4, 5], None)
    await _until(lambda: mb.index.endpoint_size("sim-1") == 5, within_s=5.0)
    assert b.batches_read == 2  # the first batch was not applied again (no replay)
    assert ma.index.endpoint_size("sim-1") == 0


def test_later_id_compares_stream_ids() -> None:
    assert later_id("5-1", "5-0") == "5-1"
    assert later_id("10-0", "9-99") == "10-0"
    assert later_id("0-0", "1700000000000-0") == "1700000000000-0"


async def test_two_replicas_with_one_replica_id_are_warned_about(
    replicas: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    one, two, other = replicas(replicaId="x"), replicas(replicaId="x"), replicas(replicaId="y")
    for _ in range(3):
        for state in (one, two, other):
            assert await state.sync_inflight()
    assert one.id_clashes >= 2
    assert two.id_clashes >= 2
    assert other.id_clashes == 0
    warned = [r for r in caplog.records if "replicaId 'x'" in r.getMessage()]
    assert len(warned) == 2  # once per replica
    # A replica that leaves frees its id at once: a restart under it is no clash.
    await one.stop()
    await two.stop()
    again = replicas(replicaId="x")
    assert await again.sync_inflight()
    assert again.id_clashes == 0
