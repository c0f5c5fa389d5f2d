"""vLLM's KV-cache event wire structs, shared by the reader and the writer of the protocol.

The gateway's decoder (:mod:`sluicegate.datalayer.kvevents.wire`) reads these; the
simulator (:mod:`sluicegate.sim.kvevents`) writes the newest (map) layout with them, so
both sides of the protocol are one definition. The protocol — ``(topic, seq 8 bytes
big-endian, msgpack payload)`` on a PUB socket, ``(b"", seq, payload)`` answers and the
end marker ``seq = -1`` on the ROUTER replay socket — and the vLLM commits it was read
from are described in the decoder's module. Rank 0 of the import layers: imports nothing
of sluicegate.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

BlockHash = int | bytes
"""vLLM's ``ExternalBlockHash``: an int or the raw hash bytes, depending on version."""

SEQ_BYTES: Final = 8
END_SEQ: Final = -1
"""The replay socket's end-of-replay marker sequence."""


def encode_seq(seq: int) -> bytes:
    """A sequence frame: 8 bytes big-endian, signed so −1 is the replay end marker."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


# -- the wire structs, mirroring vLLM's -----------------------------------------------------
# extra_keys entries are tuples of whatever vLLM puts in a block's identity (str LoRA names,
# multimodal hashes, cache salts …): their element types are vLLM's business, so Any.


# Each event's fields are declared once; vLLM has sent both layouts of them (positional
# arrays and maps keyed by field name), so each has an array-like and a map subclass.


class _Stored(msgspec.Struct, omit_defaults=True):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, omit_defaults=True):
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


class _Batch(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class WireStoredArray(_Stored, array_like=True, tag="BlockStored"):
    pass


class WireRemovedArray(_Removed, array_like=True, tag="BlockRemoved"):
    pass


class WireClearedArray(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class WireStoredMap(_Stored, tag="BlockStored"):
    pass


class WireRemovedMap(_Removed, tag="BlockRemoved"):
    pass


class WireClearedMap(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class WireBatchArray(_Batch, array_like=True):
    pass


class WireBatchMap(_Batch):
    pass


WireArrayEvent = WireStoredArray | WireRemovedArray | WireClearedArray
WireMapEvent = WireStoredMap | WireRemovedMap | WireClearedMap
