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
  cache salt on the first block — medium ``"GPU"`` and ``group_idx`` 0), one
  ``BlockRemoved`` per block the allocator evicts, ``AllBlocksCleared`` at
  ``/reset_prefix_cache`` — the shapes a real vLLM 0.32 sends (recorded in
  ``tests/fixtures/kvevents/``).
- :class:`~sluicegate.sim.kvpublisher.KVEventPublisher` sends one batch per engine step
  that changed the cache (vLLM 0.32's layout: the batch a msgpack array, its events maps
  tagged ``"type"``) as ``(topic, seq, payload)`` on a PUB socket, keeps the last
  ``buffer_steps`` batches, and answers a replay request ``(b"", start)`` on its ROUTER
  socket with every buffered ``(b"", topic, seq, payload)`` from ``start`` on and the end
  marker ``(b"", b"", -1, b"")``.

Faults (``/admin/faults``): ``kv_events_drop_rate`` loses that share of batches on the PUB
socket (they stay buffered, so a replay finds them), ``kv_events_reorder_rate`` holds that
share back and sends each after the batch that follows it.

:func:`encode_payload` is the batch's bytes (the publisher's and the discrete-event lab's).

This module holds the configuration, the log and the encoding and imports no ZeroMQ, so the
engine and the discrete-event lab can use it without loading sockets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

import msgspec

from sluicegate.kv_wire import (
    BlockHash,
    WireBatchArray,
    WireClearedMap,
    WireMapEvent,
    WireRemovedMap,
    WireStoredMap,
)

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
    the list after each step. Each evicted block gets a ``BlockRemoved`` of its own, as in
    vLLM (``BlockPool._emit_block_removed_events``).
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
                group_idx=0,
            )
        )

    def removed(self, block_hash: BlockHash) -> None:
        self.events.append(WireRemovedMap(block_hashes=[block_hash], medium=GPU, group_idx=0))

    def cleared(self) -> None:
        self.events.append(WireClearedMap())

    def take(self) -> list[WireMapEvent]:
        """The events since the last call (and forget them)."""
        events, self.events = self.events, []
        return events


_ENCODER = msgspec.msgpack.Encoder()


def encode_payload(
    events: list[WireMapEvent], ts: float, encoder: msgspec.msgpack.Encoder | None = None
) -> bytes:
    """One batch's payload frame in vLLM 0.32's shape: the batch a msgpack array ``[ts
    (s since the epoch), events, data_parallel_rank 0]``, its events maps tagged
    ``"type"`` (what ``tests/fixtures/kvevents/`` recorded from a real server)."""
    batch = WireBatchArray(ts, events, 0)  # type: ignore[arg-type]  # Raw or struct: same bytes
    return (encoder or _ENCODER).encode(batch)


__all__ = [
    "KVEventLog",
    "KVEventsConfig",
    "connect_address",
    "encode_payload",
    "replica_endpoint",
]
