"""The bytes gateway replicas exchange through Redis: prefix batches and in-flight snapshots.

Both are little-endian binary, built with :mod:`struct` and :mod:`array` (one copy per
batch, no per-field objects), and decoded defensively: a replica of another version, or any
other writer, can only make a batch be skipped (:class:`WireError`), never crash the reader.

Prefix batch (one Redis stream entry; a batch holds whole records and is closed once it
reaches :data:`MAX_BATCH_BYTES`): records, each
``u16 space_len, u16 endpoint_len, u32 blocks, i32 capacity (-1: none)``, then the space and
endpoint names (UTF-8), then ``blocks`` × u64 block hashes, head first (at most
:data:`MAX_RECORD_BLOCKS`; a batch with a longer record is refused whole).

In-flight snapshot (one Redis string per replica, exchanged by :data:`SYNC_SCRIPT`): records, each
``u16 endpoint_len, u32 requests, u32 prompt_tokens, u32 decode_tokens``, then the name.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Iterator

from sluicegate.datalayer.sharing import PrefixRecord

MAX_BATCH_BYTES = 64 * 1024
"""A prefix batch is closed once it holds this many bytes (one record may exceed it alone)."""

MAX_RECORD_BLOCKS = 8192
"""Block hashes per record, at most (64 KiB of hashes: a 131,072-token prompt in 16-token
blocks). The writer keeps a longer prompt's head, the part later requests can match."""

_PREFIX_HEAD = struct.Struct("<HHIi")
_LOAD_HEAD = struct.Struct("<HIII")
_U32 = 0xFFFF_FFFF
_BIG = sys.byteorder == "big"


class WireError(ValueError):
    """A batch or snapshot that is not in this layout."""


# KEYS[1]: the replicas' sorted set; KEYS[2]: this replica's snapshot key; KEYS[3]: its id
# claim. ARGV: replica id, lease (ms), snapshot, snapshot key prefix, this process's nonce.
# Lease ends are Redis's own clock (TIME), so replicas need no synchronised clocks. The
# reply's first element is '1' when another process claimed the same replica id since the
# last sync (two replicas configured with one replicaId overwrite each other's counts).
SYNC_SCRIPT = """
local claimed = redis.call('GET', KEYS[3])
local clash = '0'
if claimed and claimed ~= ARGV[5] then clash = '1' end
redis.call('SET', KEYS[3], ARGV[5], 'PX', tonumber(ARGV[2]))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
if ARGV[3] == '' then
  redis.call('SET', KEYS[2], '', 'PX', lease)
else
  redis.call('SET', KEYS[2], ARGV[3], 'PX', lease)
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], lease * 4)
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {clash}
for _, id in ipairs(ids) do
  if id ~= ARGV[1] then
    local v = redis.call('GET', ARGV[4] .. id)
    if v then out[#out + 1] = v end
  end
end
return out
"""
"""The in-flight sync, one script call (run by :mod:`sluicegate.runtime.shared`)."""


def _hashes_bytes(hashes: Iterable[int]) -> bytes:
    arr = array("Q", hashes)
    if _BIG:
        arr.byteswap()
    return arr.tobytes()


def encode_prefix(records: Iterable[PrefixRecord]) -> Iterator[bytes]:
    """``records`` packed into batches of about :data:`MAX_BATCH_BYTES` each."""
    parts: list[bytes] = []
    size = 0
    for r in records:
        space = r.space.encode()
        endpoint = r.endpoint.encode()
        if len(space) > 0xFFFF or len(endpoint) > 0xFFFF:
            continue  # not a name any configuration produces
        cap = -1 if r.capacity is None else min(r.capacity, 0x7FFF_FFFF)
        hashes = r.hashes[:MAX_RECORD_BLOCKS]
        head = _PREFIX_HEAD.pack(len(space), len(endpoint), len(hashes), cap)
        body = _hashes_bytes(hashes)
        parts += (head, space, endpoint, body)
        size += len(head) + len(space) + len(endpoint) + len(body)
        if size >= MAX_BATCH_BYTES:
            yield b"".join(parts)
            parts, size = [], 0
    if parts:
        yield b"".join(parts)


def decode_prefix(data: bytes) -> list[PrefixRecord]:
    """The records of one batch; :class:`WireError` when it is not one."""
    out: list[PrefixRecord] = []
    view = memoryview(data)
    at, end = 0, len(data)
    try:
        while at < end:
            space_len, endpoint_len, blocks, cap = _PREFIX_HEAD.unpack_from(view, at)
            at += _PREFIX_HEAD.size
            space = bytes(view[at : at + space_len]).decode()
            at += space_len
            endpoint = bytes(view[at : at + endpoint_len]).decode()
            at += endpoint_len
            if blocks > MAX_RECORD_BLOCKS:
                raise WireError(f"prefix record of {blocks} blocks (at most {MAX_RECORD_BLOCKS})")
            stop = at + 8 * blocks
            if stop > end:
                raise WireError("prefix batch cut short")
            arr = array("Q")
            arr.frombytes(view[at:stop])
            if _BIG:
                arr.byteswap()
            at = stop
            out.append(PrefixRecord(space, endpoint, arr.tolist(), None if cap < 0 else cap))
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"not a prefix batch: {exc}") from exc
    return out


def encode_load(counts: Iterable[tuple[str, int, int, int]]) -> bytes:
    """One replica's in-flight snapshot: (endpoint, requests, prompt tokens, decode tokens);
    endpoints with nothing in flight are left out (absent reads as zero)."""
    parts: list[bytes] = []
    for name, requests, prompt, decode in counts:
        if not (requests or prompt or decode):
            continue
        raw = name.encode()
        if len(raw) > 0xFFFF:
            continue
        head = _LOAD_HEAD.pack(len(raw), min(requests, _U32), min(prompt, _U32), min(decode, _U32))
        parts += (head, raw)
    return b"".join(parts)


def decode_load(data: bytes, into: dict[str, list[int]]) -> None:
    """Add one snapshot's counts into ``into`` (endpoint → [requests, prompt, decode])."""
    view = memoryview(data)
    at, end = 0, len(data)
    rows: list[tuple[str, int, int, int]] = []
    try:
        while at < end:
            n, requests, prompt, decode = _LOAD_HEAD.unpack_from(view, at)
            at += _LOAD_HEAD.size
            if at + n > end:
                raise WireError("in-flight snapshot cut short")
            rows.append((bytes(view[at : at + n]).decode(), requests, prompt, decode))
            at += n
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"not an in-flight snapshot: {exc}") from exc
    # Added only once the whole snapshot decoded: a bad one adds nothing.
    for name, requests, prompt, decode in rows:
        total = into.get(name)
        if total is None:
            into[name] = [requests, prompt, decode]
        else:
            total[0] += requests
            total[1] += prompt
            total[2] += decode


def later_id(a: str, b: str) -> str:
    """The later of two Redis stream ids (``ms-seq``)."""

    def key(entry_id: str) -> tuple[int, int]:
        ms, _, seq = entry_id.partition("-")
        return int(ms), int(seq or 0)

    return a if key(a) >= key(b) else b


__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_RECORD_BLOCKS",
    "SYNC_SCRIPT",
    "WireError",
    "decode_load",
    "decode_prefix",
    "encode_load",
    "encode_prefix",
    "later_id",
]
