"""Flow control's waiting counts shared through a real Redis server (BacklogSync): summed
over the other replicas, gone with a dead replica's lease or at once on a clean stop,
dropped (counted) while Redis is down and back when it returns; the snapshot layout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

pytest.importorskip("redis", reason="the shared-state tests need the redis client (dev extra)")

from redis_support import RedisServer

from sluicegate.api.settings import SharedStateSettings
from sluicegate.clock import MonotonicClock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.flowcontrol.peers import PeerYield
from sluicegate.runtime.shared import SharedState
from sluicegate.runtime.shared_backlog import (
    MAX_RECORDS,
    BacklogSync,
    decode_backlog,
    encode_backlog,
)
from sluicegate.runtime.shared_metrics import PeerYieldCollector
from sluicegate.runtime.shared_wire import WireError

CLOCK = MonotonicClock()


class Replica:
    """A SharedState, its BacklogSync, and the waiting counts it publishes (set by hand)."""

    def __init__(self, state: SharedState) -> None:
        self.state = state
        self.waiting: dict[str, dict[int, int]] = {}
        self.updates = 0
        self.sync = BacklogSync(state, lambda: self.waiting, CLOCK, self._updated)

    def _updated(self) -> None:
        self.updates += 1

    def above(self, pool: str, priority: int) -> int:
        return self.sync.view.above(pool, priority, CLOCK.now())[0]


Factory = Callable[..., Replica]


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[Factory]:
    made: list[Replica] = []

    def make(**overrides: Any) -> Replica:
        spec: dict[str, Any] = {
            "redis": {"url": redis_server.url, "timeoutMs": 100},
            "leaseMs": 400,
            "backlogSyncMs": 20,
            "inflight": False,
            "prefixIndex": False,
            "retryMs": 50,
            **overrides,
        }
        replica = Replica(SharedState(SharedStateSettings.model_validate(spec), Datastore()))
        made.append(replica)
        return replica

    yield make
    for replica in made:
        await replica.sync.stop()
        await replica.state.stop()


async def _until(check: Callable[[], bool], within_s: float) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within_s:
            pytest.fail(f"not within {within_s} s")
        await asyncio.sleep(0.005)
    return time.monotonic() - start


async def test_backlogs_are_summed_over_the_other_replicas(replicas: Factory) -> None:
    a, b, c = (replicas(replicaId=n) for n in "abc")
    a.waiting = {"pool": {100: 3, 0: 5}}
    b.waiting = {"pool": {100: 2}, "other": {100: 7}}
    for _ in range(2):  # the second round: everyone has seen everyone's snapshot
        for r in (a, b, c):
            assert await r.sync.sync()
    assert c.sync.view.reading(CLOCK.now()) == {"pool": {100: 5, 0: 5}, "other": {100: 7}}
    assert c.above("pool", 0) == 5
    assert c.above("pool", -10) == 10
    assert a.above("pool", 0) == 2  # its own requests are never counted
    assert b.above("pool", 0) == 3
    assert c.updates == 2


async def test_a_dead_replicas_backlog_vanishes_within_its_lease(replicas: Factory) -> None:
    dead, alive = replicas(replicaId="dead", leaseMs=300), replicas(replicaId="alive")
    dead.waiting = {"pool": {100: 4}}
    dead.sync.start()
    alive.sync.start()
    await _until(lambda: alive.above("pool", 0) == 4, within_s=2.0)
    task = dead.sync._task
    assert task is not None
    task.cancel()  # dies without a word: nothing removes its key
    await asyncio.gather(task, return_exceptions=True)
    dead.sync._task = None
    lease_s = 0.3
    vanished = await _until(lambda: alive.above("pool", 0) == 0, within_s=10 * lease_s)
    assert lease_s / 3 < vanished < 5 * lease_s


async def test_a_clean_stop_leaves_at_once(replicas: Factory) -> None:
    leaving, alive = replicas(replicaId="leaving", leaseMs=5000), replicas(replicaId="alive")
    leaving.waiting = {"pool": {100: 4}}
    assert await leaving.sync.sync()
    assert await alive.sync.sync()
    assert alive.above("pool", 0) == 4
    await leaving.sync.stop()
    assert await alive.sync.sync()
    assert alive.above("pool", 0) == 0  # long before its 5 s lease


async def test_redis_down_drops_the_reading_counts_it_and_resumes(
    replicas: Factory, redis_server: RedisServer
) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    a.waiting = {"pool": {100: 2}}
    a.sync.start()
    b.sync.start()
    await _until(lambda: b.above("pool", 0) == 2, within_s=2.0)
    redis_server.stop()
    await _until(lambda: b.sync.view.as_of is None, within_s=2.0)
    assert b.above("pool", 0) == 0  # on its own: nothing holds for the peers
    assert b.state.fallbacks.get("backlog", 0) >= 1
    assert not b.state.up
    redis_server.start()  # empty: the replicas publish again
    await _until(lambda: b.above("pool", 0) == 2, within_s=5.0)
    assert b.state.up


async def test_a_malformed_snapshot_is_skipped_and_counted(replicas: Factory) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    b.waiting = {"pool": {100: 1}}
    assert await b.sync.sync()
    await a.state.client.set(a.sync.snapshot_prefix + "junk", b"\x05\x00")
    await a.state.client.zadd(a.sync.replicas_key, {"junk": time.time() * 1000 + 60_000})
    assert await a.sync.sync()
    assert a.sync.bad_snapshots == 1
    assert a.above("pool", 0) == 1  # the good one still counts


def test_snapshot_round_trip_and_bounds() -> None:
    backlog = {"pool": {100: 3, 0: 2, -10: 0}, "ü-pool": {-(2**31): 1, 2**31: 9}}
    rows = decode_backlog(encode_backlog(backlog))
    assert sorted(rows) == sorted([("pool", 100, 3), ("pool", 0, 2), ("ü-pool", -(2**31), 1)])
    assert encode_backlog({}) == b""
    assert decode_backlog(b"") == []
    too_many = {"p": dict.fromkeys(range(MAX_RECORDS + 5), 1)}
    assert len(decode_backlog(encode_backlog(too_many))) == MAX_RECORDS
    with pytest.raises(WireError):
        decode_backlog(b"\x05\x00\x00")
    with pytest.raises(WireError):
        decode_backlog(encode_backlog({"pool": {1: 1}})[:-1])
    with pytest.raises(WireError):
        decode_backlog(b"\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\xff")  # not UTF-8
    with pytest.raises(WireError):
        decode_backlog(encode_backlog({"p": dict.fromkeys(range(MAX_RECORDS), 1)}) * 2)


async def test_without_queues_the_sync_leaves_and_calls_redis_no_more(
    replicas: Factory,
) -> None:
    active = True
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    a.sync.active = lambda: active
    a.waiting = {"pool": {100: 2}}
    a.sync.start()

    async def seen_by_b() -> int:
        assert await b.sync.sync()
        return b.above("pool", 0)

    deadline = time.monotonic() + 2.0
    while await seen_by_b() != 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    # a's own sync has returned (b can read a's snapshot a moment before a reads the reply)
    await _until(lambda: a.sync.view.as_of is not None, within_s=1.0)
    active = False  # no queue on a any more: its snapshot goes at once
    await _until(lambda: a.sync.view.as_of is None, within_s=1.0)  # cleared once it left
    assert await seen_by_b() == 0
    assert not await a.state.client.exists(a.sync.key)
    before = await _script_calls(a)
    await asyncio.sleep(0.2)  # ten sync intervals
    assert await _script_calls(a) == before


async def _script_calls(r: Replica) -> int:
    stats = await r.state.client.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )


async def test_metrics_show_the_peer_backlog_and_the_rule(replicas: Factory) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    a.waiting = {"pool": {100: 3}}
    assert await a.sync.sync()
    assert await b.sync.sync()
    rule = PeerYield(b.sync.view)
    rule.yielded[("pool", 0)] = 4
    rule.released[("pool", 0)] = 1
    registry = CollectorRegistry()
    registry.register(PeerYieldCollector(b.sync, lambda: rule, CLOCK))
    text = generate_latest(registry).decode()
    assert (
        'sluicegate_flow_control_peer_queue_size{inference_pool="pool",priority="100"} 3.0' in text
    )
    assert (
        'sluicegate_flow_control_peer_yields_total{inference_pool="pool",priority="0"} 4.0' in text
    )
    assert (
        'sluicegate_flow_control_peer_yield_releases_total{inference_pool="pool",priority="0"} 1.0'
        in text
    )
    b.sync.view.clear()  # Redis down: no peer backlog is shown
    assert "sluicegate_flow_control_peer_queue_size{" not in generate_latest(registry).decode()
