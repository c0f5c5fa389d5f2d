"""KV-cache events from the simulator, on vLLM's ZeroMQ protocol.

Turned on as vLLM turns it on: ``sluicegate sim --kv-events-config '{"enable_kv_cache_events":
true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``
(the fields of vLLM's ``KVEventsConfig``, ``vllm/config/kv_events.py`` at
``00634b8acf93e413a1c380288665a543b98be7ea``; the socket protocol of ``ZmqEventPublisher``
in ``vllm/distributed/kv_events.py``, described in :mod:`sluicegate.kv_wire`'s reader).

- Replica *i* binds ``endpoint`` and ``replay_endpoint`` with their port plus *i* (vLLM's
  rule for data-parallel ranks, ``offset_endpoint_port``); ``inproc://``/``ipc://``
  endpoints get the suffix ``_dp<i>`` for *i* > 0. Port 0 takes a free port (tests); the
  replica reports the addresses it bound.
- :class:`KVEventLog` collects what the engine's KV cache does during a step, in order:
  ``BlockStored`` when full blocks enter the prefix cache (the sim's own block hashes,
  their parent's hash, the built-in tokenizer's ids of the blocks, ``block_size``, the
  LoRA adapter's id and name, the extra keys vLLM puts in a block's identity — LoRA name,
  cache salt on the first block — and medium ``"GPU"``), ``BlockRemoved`` when the
  allocator evicts cached blocks, ``AllBlocksCleared`` at ``/reset_prefix_cache``.
- :class:`KVEventPublisher` sends one batch per engine step that changed the cache
  (vLLM's newest layout: msgpack maps tagged ``"type"``) as ``(topic, seq, payload)`` on a
  PUB socket, keeps the last ``buffer_steps`` batches, and answers a replay request
  ``(b"", start)`` on its ROUTER socket with every buffered ``(b"", seq, payload)`` from
  ``start`` on and the end marker ``(b"", -1, b"")``.

Faults (``/admin/faults``): ``kv_events_drop_rate`` loses that share of batches on the PUB
socket (they stay buffered, so a replay finds them), ``kv_events_reorder_rate`` holds that
share back and sends each after the batch that follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from sluicegate.kv_wire import (
    BlockHash,
    WireBatchMap,
    WireClearedMap,
    WireMapEvent,
    WireRemovedMap,
    WireStoredMap,
    encode_seq,
)
from sluicegate.sim.faults import Faults

log = logging.getLogger("sluicegate.sim")

GPU = "GPU"


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's ``KVEventsConfig``: ``publisher`` defaults to ``"zmq"`` when events are
    enabled (``"null"`` otherwise); ``buffer_steps`` batches are kept for replay; ``hwm``
    is the PUB socket's send high-water mark (messages); ``max_queue_size`` bounds vLLM's
    queue to its publisher thread — the simulator publishes in its step loop and keeps no
    such queue, so it is accepted and unused."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def active(self) -> bool:
        """True when the replicas publish."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @staticmethod
    def parse(text: str) -> KVEventsConfig:
        """The config from vLLM's ``--kv-events-config`` JSON; ``ValueError`` on bad input."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        return KVEventsConfig.from_mapping(raw)

    @staticmethod
    def from_mapping(raw: dict[str, Any]) -> KVEventsConfig:
        known = {f.name for f in fields(KVEventsConfig)}
        for key in raw:
            if key not in known:
                raise ValueError(f"unknown kv-events field {key!r}; known: {sorted(known)}")
        enabled = raw.get("enable_kv_cache_events", False)
        if not isinstance(enabled, bool):
            raise ValueError("enable_kv_cache_events must be true or false")
        publisher = raw.get("publisher") or ("zmq" if enabled else "null")
        if publisher not in ("zmq", "null"):
            raise ValueError(f"publisher must be 'zmq' or 'null', not {publisher!r}")
        for name in ("endpoint", "topic"):
            if name in raw and not isinstance(raw[name], str):
                raise ValueError(f"{name} must be a string")
        replay = raw.get("replay_endpoint")
        if replay is not None and not isinstance(replay, str):
            raise ValueError("replay_endpoint must be a string or null")
        ints = {}
        defaults = KVEventsConfig()
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = raw.get(name, getattr(defaults, name))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer")
            ints[name] = value
        config = KVEventsConfig(
            enable_kv_cache_events=enabled,
            publisher=publisher,
            endpoint=raw.get("endpoint", "tcp://*:5557"),
            replay_endpoint=replay or None,
            topic=raw.get("topic", ""),
            **ints,
        )
        if config.active:
            replica_endpoint(config.endpoint, 0)  # a bad address fails here, not at start
            if config.replay_endpoint:
                replica_endpoint(config.replay_endpoint, 0)
        return config


def replica_endpoint(endpoint: str, index: int) -> str:
    """The address replica ``index`` binds: a TCP port plus ``index`` (port 0 stays 0, a
    free port), an ``inproc://``/``ipc://`` name with ``_dp<index>`` for index > 0."""
    if endpoint.startswith(("inproc://", "ipc://")):
        return endpoint if index == 0 else f"{endpoint}_dp{index}"
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"kv-events endpoint {endpoint!r}: tcp://, ipc:// or inproc:// only")
    host, sep, port_text = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"kv-events endpoint {endpoint!r} needs host:port")
    port = int(port_text)
    if port == 0:
        return endpoint
    if port + index > 65_535:
        raise ValueError(
            f"kv-events endpoint {endpoint!r}: port {port + index} for replica {index}"
        )
    return f"tcp://{host}:{port + index}"


def connect_address(bound: str) -> str:
    """An address a local subscriber can connect to, from the one a socket bound."""
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"):
        if bound.startswith(wildcard):
            return "tcp://127.0.0.1:" + bound[len(wildcard) :]
    return bound


class KVEventLog:
    """The KV-cache events of the current engine step, in the order they happened.

    The engine and its block pool write here only when events are on; the driver takes
    the list after each step. Consecutive evictions go into one ``BlockRemoved``.
    """

    __slots__ = ("_lora_ids", "events")

    def __init__(self) -> None:
        self.events: list[WireMapEvent] = []
        self._lora_ids: dict[str, int] = {}

    def stored(
        self,
        hashes: list[int],
        parent: BlockHash | None,
        token_ids: list[int],
        block_size: int,
        lora_name: str | None,
        extra_keys: list[list[str] | None] | None,
    ) -> None:
        lora_id = None
        if lora_name is not None:
            # vLLM sends its LoRA request's integer id; the sim numbers adapters as it meets them
            lora_id = self._lora_ids.setdefault(lora_name, len(self._lora_ids) + 1)
        self.events.append(
            WireStoredMap(
                block_hashes=list[BlockHash](hashes),
                parent_block_hash=parent,
                token_ids=token_ids,
                block_size=block_size,
                lora_id=lora_id,
                medium=GPU,
                lora_name=lora_name,
                extra_keys=extra_keys,
            )
        )

    def removed(self, block_hash: BlockHash) -> None:
        events = self.events
        if events and isinstance(events[-1], WireRemovedMap):
            events[-1].block_hashes.append(block_hash)
        else:
            events.append(WireRemovedMap(block_hashes=[block_hash], medium=GPU))

    def cleared(self) -> None:
        self.events.append(WireClearedMap())

    def take(self) -> list[WireMapEvent]:
        """The events since the last call (and forget them)."""
        events, self.events = self.events, []
        return events


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
        payload = self._encoder.encode(WireBatchMap(time.time(), events, 0))  # type: ignore[arg-type]
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
                    await router.send_multipart([client, b"", encode_seq(seq), payload])
            await router.send_multipart([client, b"", encode_seq(-1), b""])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._replay is not None:
            self._replay.close(linger=0)
        self._pub.close(linger=0)
        self._ctx.term()


__all__ = [
    "KVEventLog",
    "KVEventPublisher",
    "KVEventsConfig",
    "connect_address",
    "replica_endpoint",
]
