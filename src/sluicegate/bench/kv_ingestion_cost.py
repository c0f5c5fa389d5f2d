"""KV-event ingestion's cost: real ZeroMQ sockets on loopback; pre-encoded batches in vLLM
0.32's layout (an array envelope of map events, as recorded from a real server) published
to ``KVEventSubscribers``, which decode them and fill the ``PreciseIndex``; the process
CPU time per block event while the subscriber drains them (the publisher's send calls are
in the same process, so the figure is an upper bound). Reported by
:mod:`sluicegate.bench.tokenization_cost`."""

from __future__ import annotations

import asyncio
import random
import time

import msgspec
import zmq
import zmq.asyncio

from sluicegate.clock import MonotonicClock
from sluicegate.datalayer.kvevents import KVEventSource, KVEventSubscribers, PreciseIndex
from sluicegate.kv_wire import BlockHash, WireBatchArray, WireRemovedMap, WireStoredMap, encode_seq

BLOCK = 16
"""Tokens per block of the events."""


async def ingestion(messages: int, events_per_message: int, blocks_per_event: int) -> float:
    """Process CPU µs per block event, decoded and indexed from a real ZeroMQ stream."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    subs = KVEventSubscribers(PreciseIndex(default_capacity=50_000), clock=MonotonicClock())
    await subs.sync({"ep": KVEventSource(f"tcp://127.0.0.1:{port}")})
    encoder = msgspec.msgpack.Encoder()
    rng = random.Random(2)
    payloads: list[bytes] = []
    live: list[BlockHash] = []
    for _ in range(messages):
        events: list[msgspec.Raw] = []
        for _ in range(events_per_message):
            hashes: list[BlockHash] = [rng.getrandbits(63) for _ in range(blocks_per_event)]
            ids = [rng.randrange(100_000) for _ in range(blocks_per_event * BLOCK)]
            events.append(msgspec.Raw(encoder.encode(WireStoredMap(hashes, None, ids, BLOCK))))
            live.extend(hashes)
            gone, live[:blocks_per_event] = live[:blocks_per_event], []
            events.append(msgspec.Raw(encoder.encode(WireRemovedMap(gone))))
        payloads.append(encoder.encode(WireBatchArray(time.time(), events, 0)))
    stream = subs.streams["ep"]
    for _ in range(200):  # the slow joiner: wait until a probe batch arrives
        await pub.send_multipart([b"", encode_seq(0), encoder.encode(WireBatchArray(0.0, [], 0))])
        await asyncio.sleep(0.01)
        if stream.counters.decoded:
            break
    before = stream.counters.decoded
    cpu0 = time.process_time()
    for seq, payload in enumerate(payloads, start=1):
        await pub.send_multipart([b"", encode_seq(seq), payload])
        if seq % 50 == 0:
            await asyncio.sleep(0)
    for _ in range(60_000):  # at most a minute
        if stream.counters.decoded >= before + messages:
            break
        await asyncio.sleep(0.001)
    cpu = time.process_time() - cpu0
    await subs.close()
    pub.close(linger=0)
    ctx.term()
    return cpu * 1e6 / (messages * events_per_message * blocks_per_event * 2)


__all__ = ["BLOCK", "ingestion"]
