"""An in-process publisher speaking vLLM's KV-event protocol over real ZeroMQ sockets.

:class:`FakeVLLMPublisher` binds, like ``ZmqEventPublisher`` in vLLM's
``vllm/distributed/kv_events.py``, a PUB socket (an XPUB here: the same wire for a
subscriber, and it lets a test wait until one has subscribed) and a ROUTER replay socket
on free ports of 127.0.0.1. It sends ``(topic, seq 8 bytes big-endian, payload)``, keeps a
replay buffer, and answers a replay request ``(identity, b"", start)`` with every buffered
``(b"", seq, payload)`` at or after ``start`` and the end marker ``(b"", -1, b"")``.

Test knobs: ``publish(..., send=False)`` loses a batch on the way (it is still buffered
for replay), ``answer_replays = False`` makes replays time out, ``buffer_steps`` bounds the
replay buffer, ``restart()`` starts counting from 0 with an empty buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec
import zmq
import zmq.asyncio

from sluicegate.datalayer.kvevents import wire

Layout = Literal["map", "array"]
WireEvent = wire.WireArrayEvent | wire.WireMapEvent

_encoder = msgspec.msgpack.Encoder()


def stored(
    hashes: Sequence[wire.BlockHash],
    parent: wire.BlockHash | None,
    tokens: Sequence[int],
    block_size: int,
    *,
    layout: Layout = "map",
    lora_name: str | None = None,
    extra_keys: list[list[object] | None] | None = None,
    medium: str | None = "GPU",
    group_idx: int | None = None,
) -> WireEvent:
    """A ``BlockStored`` in vLLM's struct layout (newest: map; early: array)."""
    cls = wire.WireStoredMap if layout == "map" else wire.WireStoredArray
    return cls(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=lora_name,
        extra_keys=extra_keys,  # type: ignore[arg-type]
        group_idx=group_idx,
    )


def removed(hashes: Sequence[wire.BlockHash], *, layout: Layout = "map") -> WireEvent:
    """A ``BlockRemoved`` of GPU blocks."""
    cls = wire.WireRemovedMap if layout == "map" else wire.WireRemovedArray
    return cls(block_hashes=list(hashes), medium="GPU")


def cleared(*, layout: Layout = "map") -> WireEvent:
    """An ``AllBlocksCleared``."""
    return wire.WireClearedMap() if layout == "map" else wire.WireClearedArray()


def encode_batch(events: Sequence[WireEvent], *, layout: Layout = "map", rank: int = 0) -> bytes:
    """A payload as vLLM's ``msgspec.msgpack.Encoder().encode(KVEventBatch(...))`` makes it."""
    raws = [msgspec.Raw(_encoder.encode(e)) for e in events]
    batch = (
        wire.WireBatchMap(time.time(), raws, rank)
        if layout == "map"
        else wire.WireBatchArray(time.time(), raws, rank)
    )
    return _encoder.encode(batch)


class FakeVLLMPublisher:
    """vLLM's publisher, in the test's event loop. Use ``await FakeVLLMPublisher.start()``."""

    def __init__(self, ctx: zmq.asyncio.Context, *, topic: str = "", buffer_steps: int = 10_000):
        self.topic = topic.encode()
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        # vLLM's own default high-water mark (its `hwm`): a burst of test batches to a
        # subscriber slowed by a loaded machine is queued, not dropped as a gap.
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.pub_address = f"tcp://127.0.0.1:{port}"
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        rport = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_address = f"tcp://127.0.0.1:{rport}"
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self.answer_replays = True
        self.replay_requests: list[int] = []
        self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    async def wait_subscribed(self, within: float = 5.0) -> None:
        """Until a subscriber's subscription message arrives (XPUB hands it over)."""
        async with asyncio.timeout(within):
            while True:
                message = await self.pub.recv()
                if message[:1] == b"\x01":
                    return

    async def publish(
        self, events: Sequence[WireEvent], *, layout: Layout = "map", send: bool = True
    ) -> int:
        """Publish one batch; returns its sequence number."""
        return await self.publish_raw(encode_batch(events, layout=layout), send=send)

    async def publish_raw(self, payload: bytes, *, send: bool = True) -> int:
        """Publish a payload as it is (hand-built or malformed)."""
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def send_frames(self, frames: list[bytes]) -> None:
        """Send arbitrary frames on the PUB socket (malformed messages)."""
        await self.pub.send_multipart(frames)

    def restart(self) -> None:
        """As a new server process: sequence from 0, nothing buffered."""
        self.seq = 0
        self.buffer.clear()

    async def _serve_replays(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            begin = int.from_bytes(start, "big")
            self.replay_requests.append(begin)
            if not self.answer_replays:
                continue
            for seq, payload in list(self.buffer):
                if seq >= begin:
                    await self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart(
                [client, b"", (-1).to_bytes(8, "big", signed=True), b""]
            )

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(linger=0)
        self.router.close(linger=0)


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Wait (polling every 5 ms) until ``condition()`` holds; fails the test after ``within`` s."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
