"""The simulator's KV-event sockets (see :mod:`sluicegate.sim.kvevents` for the protocol).

:class:`KVEventPublisher` binds one replica's PUB socket and, when configured, its ROUTER
replay socket; the replica creates it at start only when events are on (this module
loads ZeroMQ, so nothing imports it otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque

import msgspec
import zmq
import zmq.asyncio

from sluicegate.kv_wire import WireMapEvent, encode_seq
from sluicegate.sim.faults import Faults
from sluicegate.sim.kvevents import (
    KVEventsConfig,
    connect_address,
    encode_payload,
    replica_endpoint,
)

log = logging.getLogger("sluicegate.sim")


class KVEventPublisher:
    """One replica's PUB and ROUTER replay sockets. Create and use inside the event loop."""

    def __init__(
        self,
        config: KVEventsConfig,
        index: int,
        faults: Faults,
        *,
        binds: tuple[str, str | None] | None = None,
        seed: int = 0,
    ) -> None:
        """``binds``: the PUB and replay addresses to bind (default: the config's, offset
        for replica ``index``); a restarted replica passes the :attr:`bound` of its last run."""
        if binds is None:
            replay = config.replay_endpoint
            binds = (
                replica_endpoint(config.endpoint, index),
                None if replay is None else replica_endpoint(replay, index),
            )
        self.config = config
        self.index = index
        self.faults = faults
        self.topic = config.topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        """The last ``buffer_steps`` batches (seq, payload), for replay."""
        self.sent = 0
        """Batches sent on the PUB socket."""
        self.dropped = 0
        """Batches the drop fault (or a full send queue) kept off the PUB socket."""
        self.reordered = 0
        """Batches the reorder fault sent after their successor."""
        self._held: list[bytes] | None = None
        self._rng = random.Random(seed * 1_000_003 + index)
        self._encoder = msgspec.msgpack.Encoder()
        self._ctx = zmq.asyncio.Context()
        # PUB never blocks (it drops at the high-water mark), so a plain socket is used
        # from the step loop; the replay socket is read by an asyncio task
        self._pub: zmq.Socket[bytes] = zmq.Socket(self._ctx, zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.bind(binds[0])
        bound_pub = self._last_endpoint(self._pub)
        self.pub_address = connect_address(bound_pub)
        self.replay_address: str | None = None
        bound_replay: str | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        if binds[1] is not None:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(binds[1])
            self._replay = router
            bound_replay = self._last_endpoint(router)
            self.replay_address = connect_address(bound_replay)
            self._task = asyncio.get_running_loop().create_task(
                self._serve_replays(router), name=f"sim-kv-replay-{index}"
            )
        self.bound: tuple[str, str | None] = (bound_pub, bound_replay)
        """The addresses bound (a free port where the config said 0)."""

    @staticmethod
    def _last_endpoint(sock: zmq.Socket[bytes] | zmq.asyncio.Socket) -> str:
        value = sock.getsockopt(zmq.LAST_ENDPOINT)
        return value.decode() if isinstance(value, bytes) else str(value)

    def publish(self, events: list[WireMapEvent]) -> None:
        """Send one batch (an engine step's events) and buffer it for replay."""
        payload = encode_payload(events, time.time(), self._encoder)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        frames = [self.topic, encode_seq(seq), payload]
        faults = self.faults
        if faults.kv_events_drop_rate and self._rng.random() < faults.kv_events_drop_rate:
            self.dropped += 1
            return
        if self._held is None and (
            faults.kv_events_reorder_rate and self._rng.random() < faults.kv_events_reorder_rate
        ):
            self._held = frames
            self.reordered += 1
            return
        self._send(frames)
        if self._held is not None:
            held, self._held = self._held, None
            self._send(held)

    def _send(self, frames: list[bytes]) -> None:
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:  # not raised by PUB in practice: it drops at the mark itself
            self.dropped += 1

    async def _serve_replays(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("replica %d: invalid kv-events replay request skipped", self.index)
                continue
            client, _, start_frame = frames
            start = int.from_bytes(start_frame, "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await router.send_multipart([client, b"", self.topic, encode_seq(seq), payload])
            await router.send_multipart([client, b"", b"", encode_seq(-1), b""])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._replay is not None:
            self._replay.close(linger=0)
        self._pub.close(linger=0)
        self._ctx.term()


__all__ = ["KVEventPublisher"]
