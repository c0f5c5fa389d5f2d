"""Subscribers over real ZeroMQ sockets on loopback, against a publisher in vLLM's format."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgpack
import pytest
import zmq.asyncio
from kv_support import FakeVLLMPublisher, cleared, encode_batch, removed, stored, until

from sluicegate.clock import ManualClock
from sluicegate.datalayer.kvevents.index import PreciseIndex, block_keys
from sluicegate.datalayer.kvevents.subscriber import (
    KVEventSource,
    KVEventSubscribers,
    SubscriberSettings,
    View,
)
from sluicegate.datalayer.kvevents.wire import BlockStored

BS = 4
TOKENS = list(range(1000, 1032))  # 8 blocks
KEYS = block_keys(TOKENS, BS)


def _block(i: int) -> list[int]:
    return TOKENS[i * BS : (i + 1) * BS]


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def publisher(ctx: zmq.asyncio.Context) -> AsyncIterator[FakeVLLMPublisher]:
    pub = FakeVLLMPublisher(ctx)
    yield pub
    await pub.close()


@pytest.fixture
async def subs() -> AsyncIterator[KVEventSubscribers]:
    subscribers = KVEventSubscribers(
        PreciseIndex(default_capacity=1000),
        SubscriberSettings(replay_timeout=0.3, turnover_blocks=4),
        clock=ManualClock(),
    )
    yield subscribers
    await subscribers.close()


async def _join(
    subs: KVEventSubscribers, pub: FakeVLLMPublisher, key: str = "a", replay: bool = True
) -> None:
    await subs.sync({key: KVEventSource(pub.pub_address, pub.replay_address if replay else None)})
    await pub.wait_subscribed()


async def _store(pub: FakeVLLMPublisher, i: int, *, send: bool = True) -> int:
    """Publish block i of TOKENS (its vLLM hash is 100 + i, parent block i − 1)."""
    parent = None if i == 0 else 100 + i - 1
    return await pub.publish([stored([100 + i], parent, _block(i), BS)], send=send)


def _matched(subs: KVEventSubscribers, key: str = "a") -> int:
    return subs.index.longest_prefix(KEYS).get(key, 0)


async def test_in_order_stream_is_applied_and_synced(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    await _join(subs, publisher)
    for i in range(3):
        await _store(publisher, i)
    await publisher.publish([removed([102])])
    stream = subs.streams["a"]
    await until(lambda: stream.counters.decoded == 4)
    assert _matched(subs) == 2
    assert subs.view("a") is View.SYNCED
    assert stream.counters.gaps == stream.counters.dropped == 0
    assert publisher.replay_requests == []


async def test_hand_built_msgpack_frame_over_the_wire(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    # vLLM's newest layout built with the msgpack library, int hashes then bytes hashes
    await _join(subs, publisher)
    h0, h1 = b"\x01" * 32, b"\x02" * 32
    payload = msgpack.packb(
        {
            "ts": 1.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [h0, h1],
                    "parent_block_hash": None,
                    "token_ids": TOKENS[:8],
                    "block_size": BS,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                }
            ],
            "data_parallel_rank": 0,
        }
    )
    await publisher.publish_raw(payload)
    await publisher.publish_raw(msgpack.packb([2.0, [["BlockRemoved", [h1], "GPU"]]]))
    await until(lambda: subs.streams["a"].counters.decoded == 2)
    assert _matched(subs) == 1


async def test_gap_is_filled_by_replay(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    await _join(subs, publisher)
    await _store(publisher, 0)
    await _store(publisher, 1, send=False)  # lost on the way
    await _store(publisher, 2, send=False)
    await _store(publisher, 3)  # shows the gap
    stream = subs.streams["a"]
    await until(lambda: stream.counters.decoded == 4)
    assert publisher.replay_requests == [1]
    assert (stream.counters.gaps, stream.counters.replays) == (1, 1)
    assert _matched(subs) == 4
    assert subs.view("a") is View.SYNCED


async def test_failed_replay_drops_entries_then_recovers(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    await _join(subs, publisher)
    await _store(publisher, 0)
    await _store(publisher, 1)
    stream = subs.streams["a"]
    await until(lambda: stream.counters.decoded == 2)
    publisher.answer_replays = False
    await publisher.publish([removed([101])], send=False)  # a lost removal
    await publisher.publish([stored([200], None, [7, 7, 7, 7], BS)])
    await until(lambda: stream.counters.decoded == 3)  # after the replay timed out
    assert stream.counters.replay_failures == 1
    assert subs.view("a") is View.UNKNOWN
    assert _matched(subs) == 0  # block 0 and 1 dropped: 101's removal could not be known
    assert subs.index.size("a") == 1  # what came after the loss is kept
    # the cache turns over (turnover_blocks=4 stores) → synced again
    for i in range(3):
        await _store(publisher, i)
    await until(lambda: stream.counters.decoded == 6)
    assert subs.view("a") is View.SYNCED
    assert _matched(subs) == 3


async def test_replay_buffer_too_short_is_a_failure_and_a_clear_recovers(
    ctx: zmq.asyncio.Context, subs: KVEventSubscribers
) -> None:
    pub = FakeVLLMPublisher(ctx, buffer_steps=2)
    try:
        await _join(subs, pub)
        await _store(pub, 0)
        await _store(pub, 1, send=False)
        await _store(pub, 2, send=False)  # with 3, pushes 1 out of the replay buffer
        await _store(pub, 3)
        stream = subs.streams["a"]
        await until(lambda: stream.counters.decoded == 2)
        assert stream.counters.replay_failures == 1
        assert subs.view("a") is View.UNKNOWN
        await pub.publish([cleared(), stored([100], None, _block(0), BS)])
        await until(lambda: stream.counters.decoded == 3)
        assert subs.view("a") is View.SYNCED
        assert _matched(subs) == 1
    finally:
        await pub.close()


async def test_joining_late_replays_from_zero(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    await _store(publisher, 0, send=False)  # before anyone listened
    await _store(publisher, 1, send=False)
    await _join(subs, publisher)
    await _store(publisher, 2)
    await until(lambda: subs.streams["a"].counters.decoded == 3)
    assert publisher.replay_requests == [0]
    assert subs.view("a") is View.SYNCED
    assert _matched(subs) == 3


async def test_joining_late_without_replay_is_unknown(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    await _store(publisher, 0, send=False)
    await _join(subs, publisher, replay=False)
    await _store(publisher, 1)  # parent 100 never seen: an orphan
    await until(lambda: subs.streams["a"].counters.decoded == 1)
    assert subs.view("a") is View.UNKNOWN
    assert subs.index.counters.orphans == 1


async def test_publisher_restart_drops_entries(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    await _join(subs, publisher)
    for i in range(3):
        await _store(publisher, i)
    stream = subs.streams["a"]
    await until(lambda: stream.counters.decoded == 3)
    publisher.restart()
    await publisher.publish([stored([500], None, [9, 9, 9, 9], BS)])  # seq 0 again
    await until(lambda: stream.counters.decoded == 4)
    assert stream.counters.restarts == 1
    assert _matched(subs) == 0
    assert subs.index.size("a") == 1
    assert subs.view("a") is View.SYNCED  # complete from the new process's seq 0


async def test_malformed_messages_are_counted_and_skipped(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher, caplog: pytest.LogCaptureFixture
) -> None:
    await _join(subs, publisher)
    await _store(publisher, 0)
    stream = subs.streams["a"]
    await until(lambda: stream.counters.decoded == 1)
    with caplog.at_level(logging.WARNING, "sluicegate.datalayer.kvevents.subscriber"):
        await publisher.send_frames([b"", b"short"])  # two frames
        await publisher.send_frames([b"", b"\x00" * 3, b"x"])  # bad sequence frame
        await until(lambda: stream.counters.dropped == 2)
        assert subs.view("a") is View.SYNCED  # nothing was lost that a sequence showed
        await publisher.publish_raw(b"\xc1 garbage")  # a batch with a sequence, unreadable
        await until(lambda: stream.counters.dropped == 3)
    assert subs.view("a") is View.UNKNOWN  # its events may have held removals
    assert subs.index.size("a") == 0
    malformed = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(malformed) == 1  # rate-limited: the clock did not move
    await _store(publisher, 0)  # carries on
    await until(lambda: stream.counters.decoded == 2)
    assert _matched(subs) == 1
    assert stream.counters.gaps == 0  # the unreadable batch's sequence was consumed


class _FaultyIndex(PreciseIndex):
    """Raises on the first store it is given (a bug of ours, simulated)."""

    faults = 1

    def store(self, endpoint: str, event: BlockStored) -> None:
        if self.faults:
            self.faults -= 1
            raise RuntimeError("simulated fault")
        super().store(endpoint, event)


async def test_an_unexpected_fault_loses_the_view_not_the_stream(
    publisher: FakeVLLMPublisher,
) -> None:
    subs = KVEventSubscribers(_FaultyIndex(default_capacity=100), clock=ManualClock())
    try:
        await _join(subs, publisher)
        await _store(publisher, 0)  # the fault
        stream = subs.streams["a"]
        await until(lambda: subs.view("a") is View.UNKNOWN and stream.next_seq is None)
        await _store(publisher, 0)  # seq 1: replayed from 0, whose store now works
        await until(lambda: stream.counters.decoded == 2)
        assert subs.view("a") is View.SYNCED
        assert _matched(subs) == 1
    finally:
        await subs.close()


async def test_endpoints_come_and_go(
    ctx: zmq.asyncio.Context, subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    other = FakeVLLMPublisher(ctx)
    try:
        await subs.sync(
            {
                "a": KVEventSource(publisher.pub_address, publisher.replay_address),
                "b": KVEventSource(other.pub_address, None, capacity_blocks=2),
            }
        )
        await publisher.wait_subscribed()
        await other.wait_subscribed()
        await _store(publisher, 0)
        for i in range(3):
            await _store(other, i)
        await until(lambda: subs.streams["b"].counters.decoded == 3)
        await until(lambda: subs.streams["a"].counters.decoded == 1)
        assert subs.index.size("b") == 2  # its capacity
        assert subs.index.longest_prefix(KEYS) == {"a": 1}  # b's block 0 was evicted
        await subs.sync({"a": KVEventSource(publisher.pub_address, publisher.replay_address)})
        assert "b" not in subs.streams
        assert subs.index.endpoints() == ["a"]
        # a changed source is a new subscriber: entries of the old one are gone
        await subs.sync({"a": KVEventSource(publisher.pub_address, None)})
        assert subs.index.size("a") == 0
        assert subs.view("a") is View.UNKNOWN
        assert subs.view("nobody") is View.UNKNOWN
    finally:
        await other.close()


async def test_topic_filters_messages(ctx: zmq.asyncio.Context, subs: KVEventSubscribers) -> None:
    pub = FakeVLLMPublisher(ctx, topic="kv@a")
    try:
        await subs.sync({"a": KVEventSource(pub.pub_address, None, topic="kv@a")})
        await pub.wait_subscribed()
        await pub.send_frames([b"other", (0).to_bytes(8, "big"), b"\xc1"])  # filtered by zmq
        await pub.send_frames([b"kv@ab", (0).to_bytes(8, "big"), b"\xc1"])  # prefix matches
        await _store(pub, 0)
        counters = subs.streams["a"].counters
        await until(lambda: counters.decoded == 1)
        assert (counters.received, counters.other_topic, counters.dropped) == (2, 1, 0)
    finally:
        await pub.close()


async def test_ingestion_cost_report(
    subs: KVEventSubscribers, publisher: FakeVLLMPublisher
) -> None:
    """Reports the cost of one batch over loopback: receive, decode, apply (16-block store
    and a 16-block removal per batch, as a busy server's step might publish)."""
    await _join(subs, publisher)
    n = 2000
    payloads = []
    for b in range(n):
        hashes = [b * 16 + j for j in range(16)]
        tokens = [(b * 16 + j) % 50_000 for j in range(16 * 16)]
        events = [stored(hashes, None, tokens, 16)]
        if b:
            events.append(removed([h - 16 for h in hashes]))
        payloads.append(encode_batch(events))
    stream = subs.streams["a"]
    loop = asyncio.get_running_loop()
    start = loop.time()
    for payload in payloads:
        await publisher.publish_raw(payload)
    await until(lambda: stream.counters.decoded == n, within=60)
    per_batch_us = (loop.time() - start) / n * 1e6
    # Printed, not asserted: a cost is a benchmark's to judge (docs/benchmarks/scheduling.md),
    # and this machine's load is not the test's to control.
    print(f"\ningest (publish + receive + decode + apply) per batch: {per_batch_us:.0f} µs")
    assert stream.counters.gaps == 0
    assert subs.index.size("a") == 16
