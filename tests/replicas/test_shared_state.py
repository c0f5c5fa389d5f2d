"""SharedState against a real Redis server: in-flight leases, the shared prefix stream,
degrading to local state and coming back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

pytest.importorskip("redis", reason="the shared-state tests need the redis client (dev extra)")

from redis_support import RedisServer

from sluicegate.api.settings import SharedStateSettings
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.sharing import PrefixRecord
from sluicegate.runtime.shared import SharedState, redacted
from sluicegate.runtime.shared_metrics import SharedStateCollector
from sluicegate.scheduling.approximate import ApproximatePrefix

NAMES = ["sim-0", "sim-1", "sim-2"]

Factory = Callable[..., SharedState]


def _datastore() -> Datastore:
    ds = Datastore()
    ds.set_endpoints(
        "pool",
        [EndpointSpec(name=n, host="127.0.0.1", port=9000 + i) for i, n in enumerate(NAMES)],
    )
    return ds


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[Factory]:
    made: list[SharedState] = []

    def make(**overrides: Any) -> SharedState:
        spec: dict[str, Any] = {
            "redis": {"url": redis_server.url, "timeoutMs": 100},
            "leaseMs": 400,
            "inflightSyncMs": 20,
            "prefixFlushMs": 2,
            "retryMs": 50,
            **overrides,
        }
        state = SharedState(SharedStateSettings.model_validate(spec), _datastore())
        made.append(state)
        return state

    yield make
    for state in made:
        await state.stop()


async def _until(check: Callable[[], bool], within_s: float) -> float:
    """Seconds until ``check()`` held; fails past ``within_s``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within_s:
            pytest.fail(f"not within {within_s} s")
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def _endpoint(state: SharedState, name: str) -> Endpoint:
    return next(e for e in state.datastore.all_endpoints() if e.name == name)


async def test_inflight_is_summed_over_the_other_replicas(replicas: Factory) -> None:
    a, b, c = replicas(replicaId="a"), replicas(replicaId="b"), replicas(replicaId="c")
    _endpoint(a, "sim-0").inflight.dispatch(100, 50)
    _endpoint(a, "sim-0").inflight.dispatch(20, 10)
    _endpoint(b, "sim-0").inflight.dispatch(7, 3)
    _endpoint(b, "sim-2").inflight.dispatch(1, 1)
    for state in (a, b, c):
        assert await state.sync_inflight()
    for state in (a, b, c):  # a second round: everyone has seen everyone's snapshot
        assert await state.sync_inflight()
    c0 = _endpoint(c, "sim-0")
    assert (c0.peers.requests, c0.peers.prompt_tokens, c0.peers.decode_tokens) == (3, 127, 63)
    assert c0.dispatched_requests == 3
    assert _endpoint(c, "sim-2").peers.requests == 1
    assert _endpoint(c, "sim-1").peers.requests == 0
    # Own counts are never counted twice: a sees only b's.
    a0 = _endpoint(a, "sim-0")
    assert a0.peers.requests == 1
    assert a0.dispatched_requests == 3
    assert a0.waiting == 3  # never scraped: all of it assumed waiting
    assert c.peer_replicas == 2


async def test_a_dead_replicas_counts_vanish_within_its_lease(replicas: Factory) -> None:
    dead, alive = replicas(replicaId="dead", leaseMs=300), replicas(replicaId="alive")
    dead.start()
    alive.start()
    _endpoint(dead, "sim-1").inflight.dispatch(10, 10)
    seen = _endpoint(alive, "sim-1")
    await _until(lambda: seen.peers.requests == 1, within_s=2.0)
    # The writer dies without a word: its task is gone, nothing removes its key.
    for task in dead._tasks:
        task.cancel()
    await asyncio.gather(*dead._tasks, return_exceptions=True)
    dead._tasks.clear()
    lease_s = 0.3
    vanished = await _until(lambda: seen.peers.requests == 0, within_s=10 * lease_s)
    # Gone within a few leases (generous for a loaded machine), and not before the lease
    # could have run out (a third of it: the last sync may have come just before the kill).
    assert lease_s / 3 < vanished < 5 * lease_s
    assert alive.peer_replicas == 0


async def test_a_clean_stop_leaves_at_once(replicas: Factory) -> None:
    leaving, staying = replicas(replicaId="x", leaseMs=5000), replicas(replicaId="y")
    _endpoint(leaving, "sim-0").inflight.dispatch(1, 1)
    assert await leaving.sync_inflight()
    assert await staying.sync_inflight()
    assert _endpoint(staying, "sim-0").peers.requests == 1
    await leaving.stop()
    assert await staying.sync_inflight()
    assert _endpoint(staying, "sim-0").peers.requests == 0


async def test_peers_inflight_is_a_per_endpoint_gauge_only_with_inflight_sharing(
    replicas: Factory,
) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    _endpoint(a, "sim-0").inflight.dispatch(10, 5)
    _endpoint(a, "sim-0").inflight.dispatch(10, 5)
    for _ in range(2):
        for state in (a, b):
            assert await state.sync_inflight()
    registry = CollectorRegistry()
    registry.register(SharedStateCollector(b))
    name = "sluicegate_endpoint_peer_inflight_requests"
    labels = {"name": "pool", "model_server_pod": "sim-0"}
    assert registry.get_sample_value(name, labels) == 2
    assert registry.get_sample_value(name, {**labels, "model_server_pod": "sim-1"}) == 0
    own = CollectorRegistry()
    own.register(SharedStateCollector(a))
    assert own.get_sample_value(name, labels) == 0  # a's own requests are not its peers'
    prefix_only = CollectorRegistry()
    prefix_only.register(SharedStateCollector(replicas(replicaId="c", inflight=False)))
    assert name not in generate_latest(prefix_only).decode()
    assert prefix_only.get_sample_value("sluicegate_shared_state_up") is not None


def _matcher(state: SharedState) -> ApproximatePrefix:
    m = ApproximatePrefix(16, 0, 1000, auto_tune=False)
    assert state.share is not None
    m.share(state.share, "approx/16")
    return m


async def test_prefix_decisions_reach_the_other_replicas(replicas: Factory) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    ma, mb = _matcher(a), _matcher(b)
    a.start()
    b.start()
    hashes = [11, 22, 33, 44]
    assert a.share is not None
    ma.index.insert("sim-1", hashes)
    a.share.publish("approx/16", "sim-1", hashes, None)
    await _until(lambda: mb.index.match(hashes, NAMES)["sim-1"] == 4, within_s=2.0)
    assert mb.index.match(hashes, NAMES) == {"sim-0": 0, "sim-1": 4, "sim-2": 0}
    assert a.batches_written >= 1
    assert b.batches_read >= 1
    # a skipped its own batch: its index holds the blocks once.
    assert ma.index.endpoint_size("sim-1") == 4
    # A replica that starts later replays the stream.
    late = replicas(replicaId="late")
    ml = _matcher(late)
    late.start()
    await _until(lambda: ml.index.match(hashes, NAMES)["sim-1"] == 4, within_s=2.0)


async def test_records_for_unknown_endpoints_or_spaces_are_ignored(replicas: Factory) -> None:
    b = replicas(replicaId="b")
    mb = _matcher(b)
    assert b.share is not None
    b._names = frozenset(NAMES)
    assert not b.share.deliver(PrefixRecord("approx/16", "not-ours", [1, 2], None))
    assert not b.share.deliver(PrefixRecord("other/64", "sim-0", [1, 2], None))
    assert b.share.deliver(PrefixRecord("approx/16", "sim-0", [1, 2], None))
    assert len(mb.index) == 2


async def test_the_stream_is_bounded(replicas: Factory, redis_server: RedisServer) -> None:
    a = replicas(replicaId="a", prefixStreamMaxEntries=16)
    assert a.share is not None
    for i in range(200):
        a.share.publish("approx/16", "sim-0", list(range(i * 2000, i * 2000 + 2000)), None)
        if i % 10 == 9:
            assert await a.flush_prefix()
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        length = await client.xlen(a.stream_key)
        ttl_ms = await client.pttl(a.stream_key)
    finally:
        await client.aclose()
    # MAXLEN ~ trims whole macro nodes (100 entries by default): approximately 16.
    assert length <= 16 + 100
    assert 0 < ttl_ms <= 600_000


async def test_redis_down_falls_back_logs_once_and_resumes(
    replicas: Factory, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    _endpoint(a, "sim-0").inflight.dispatch(5, 5)
    assert await a.sync_inflight()
    assert await b.sync_inflight()
    assert _endpoint(b, "sim-0").peers.requests == 1
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="sluicegate.shared"):
        for _ in range(5):
            assert not await b.sync_inflight()
        assert b.share is not None
        b.share.publish("approx/16", "sim-0", [1, 2, 3], None)
        assert not b.share.outbox  # not queued while down
    assert not b.up
    assert b.fallbacks["inflight"] == 5
    assert _endpoint(b, "sim-0").peers.requests == 0  # local state only
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "unavailable" in warnings[0].getMessage()
    redis_server.start()  # empty: the snapshots are gone with the old process
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sluicegate.shared"):
        assert await a.sync_inflight()
        assert await b.sync_inflight()
    assert b.up
    assert _endpoint(b, "sim-0").peers.requests == 1
    assert "sharing resumed" in caplog.text


async def test_a_frozen_redis_costs_one_timeout(
    replicas: Factory, redis_server: RedisServer
) -> None:
    timeout_s = 0.08
    a = replicas(replicaId="a", redis={"url": redis_server.url, "timeoutMs": timeout_s * 1000})
    assert await a.sync_inflight()
    redis_server.pause()
    try:
        start = time.monotonic()
        assert not await a.sync_inflight()
        took = time.monotonic() - start
    finally:
        redis_server.resume()
    # One timeout, not a retry series: one fallback counted, and the time taken is the
    # timeout (the upper bound is generous for a loaded machine: 25 timeouts).
    assert a.fallbacks["inflight"] == 1
    assert timeout_s * 0.9 <= took < timeout_s * 25
    # Answers again: the next call succeeds (the timed-out connection was dropped).
    assert await a.sync_inflight()


async def test_the_password_is_never_logged(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    guarded = RedisServer(redis_server.binary, tmp_path, password="the-right-Pa55word")
    try:
        guarded.start()
        ok = SharedStateSettings.model_validate({"redis": {"url": guarded.url}})
        state = SharedState(ok, _datastore())
        assert await state.sync_inflight()  # a URL's password is used
        await state.stop()
        secret = "s3cret-Pa55word-xyz"
        url = f"redis://:{secret}@127.0.0.1:{guarded.port}/0"
        assert redacted(url) == f"redis://127.0.0.1:{guarded.port}/0"
        spec = SharedStateSettings.model_validate({"redis": {"url": url}})
        assert secret not in repr(spec)
        state = SharedState(spec, _datastore())
        with caplog.at_level(logging.DEBUG):
            state.start()
            # A wrong password: AUTH fails, and the failure is logged.
            await _until(lambda: bool(state.fallbacks), within_s=5.0)
            await state.stop()
    finally:
        guarded.stop()
    assert any("unavailable" in r.getMessage() for r in caplog.records)
    leaked = [r.getMessage() for r in caplog.records if secret in r.getMessage()]
    assert not leaked
    assert secret not in caplog.text


def test_the_wire_round_trips_and_refuses_garbage() -> None:
    import random

    from sluicegate.runtime.shared_wire import (
        MAX_BATCH_BYTES,
        WireError,
        decode_load,
        decode_prefix,
        encode_load,
        encode_prefix,
    )

    records = [
        PrefixRecord("approx/64", f"sim-{i % 3}", [(i * 7919 + k) % 2**64 for k in range(i)], i)
        for i in range(1, 300)
    ] + [PrefixRecord("approx/64", "sim-0", [2**64 - 1], None)]
    batches = list(encode_prefix(records))
    assert len(batches) > 1  # split at about MAX_BATCH_BYTES
    assert all(len(b) < MAX_BATCH_BYTES + 8 * 300 + 64 for b in batches)
    back = [r for b in batches for r in decode_prefix(b)]
    assert [(r.space, r.endpoint, list(r.hashes), r.capacity) for r in back] == [
        (r.space, r.endpoint, list(r.hashes), r.capacity) for r in records
    ]
    totals: dict[str, list[int]] = {}
    decode_load(encode_load([("sim-0", 2, 30, 40), ("sim-1", 0, 0, 0)]), totals)
    decode_load(encode_load([("sim-0", 1, 1, 1)]), totals)
    assert totals == {"sim-0": [3, 31, 41]}
    rng = random.Random(7)
    for _ in range(300):
        junk = rng.randbytes(rng.randrange(1, 200))
        with contextlib.suppress(WireError):  # refused, or (rarely) read as records
            decode_prefix(junk)
        before = {k: list(v) for k, v in totals.items()}
        try:
            decode_load(junk, totals)
        except WireError:
            assert totals == before  # a bad snapshot adds nothing
    with pytest.raises(WireError):
        decode_prefix(batches[0][:-3])
