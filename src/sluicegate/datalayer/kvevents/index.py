"""The precise block index: which endpoints hold which KV block, from their own events.

Keys are sluicegate's, recomputed from token ids (vLLM's block hashes are seeded per
process, so two servers name the same prefix differently): block *i*'s key is
``xxh3_64(len(tokens) ‖ tokens as uint32 ‖ extra, seed=key of block i−1)`` with the root
seed :data:`ROOT_KEY`; ``extra`` is :func:`~sluicegate.datalayer.kvevents.wire.extra_key_bytes`
of what besides tokens names the block (LoRA name, multimodal hashes, cache salt on the
first block), so a key names its whole prefix. :func:`block_keys` is the one chain both
ingestion and the request path use.

Per endpoint the index maps vLLM's hash → our key (so removals, which carry only vLLM's
hashes, work) in store order; across endpoints it maps our key → the endpoints holding it.
Each endpoint holds at most its capacity (its ``num_gpu_blocks`` plus a margin): storing
beyond it evicts that endpoint's oldest entry (counted in ``evictions``) — the server must
have evicted something the index missed. Only GPU-tier blocks (``medium`` None or
``"GPU"``) of the first KV-cache group (``group_idx`` None or 0) are indexed; others are
counted in ``ignored``. A stored block whose parent the endpoint's entries do not hold
cannot be keyed and is counted in ``orphans``. vLLM may cache one hash in several physical
blocks (it does not de-duplicate) and removes each on its own: copies are counted, and
the entry goes with the last.

Measured (CPython 3.11 on the shared 2-core development machine; the tests print them):

- memory, tracemalloc, 100,000 single-block entries: about 195 bytes per entry on the
  first endpoint holding a block, about 140 more per further endpoint holding it
  (``tests/datalayer/test_dl_kvevents_index.py::test_cost_report``);
- ``longest_prefix`` over 64 matched blocks held by 8 endpoints: about 6–9 µs (same test);
- applying a 16-block store: about 21 µs (1.3 µs per block, hashing included), a
  16-block removal about 11 µs (a loop over 5,000 such events).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import xxhash

from sluicegate.datalayer.kvevents.wire import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEvent,
    extra_key_bytes,
)

ROOT_KEY: Final = 0x5A17_C0DE_B10C_0000
"""The seed of every prefix's first block."""

_xxh3 = xxhash.xxh3_64_intdigest
_GPU_MEDIA: Final = frozenset({None, "GPU"})


def block_key(parent: int, tokens: Sequence[int], extra: bytes | None = None) -> int:
    """One block's key from its parent's key, its token ids and its extra identity bytes.

    Raises ``OverflowError`` for a token id outside 0 … 2³²−1.
    """
    return block_keys(tokens, len(tokens), None if extra is None else [extra], parent)[0]


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    extras: Sequence[bytes | None] | None = None,
    parent: int = ROOT_KEY,
) -> list[int]:
    """The keys of every *full* block of ``token_ids`` (a trailing partial block has none);
    ``extras[i]`` is block *i*'s extra identity (missing entries: none).

    Raises ``OverflowError`` for a token id outside 0 … 2³²−1.
    """
    if block_size < 1:
        raise ValueError(f"block size must be ≥ 1 token, got {block_size}")
    n = len(token_ids) // block_size
    # one conversion for the whole prompt, then a bytes slice per block: ~4× cheaper than
    # converting block by block
    raw = array("I", token_ids[: n * block_size] if len(token_ids) > n * block_size else token_ids)
    data = raw.tobytes()
    step = 4 * block_size
    prefix = block_size.to_bytes(4, "little")
    keys: list[int] = []
    for i in range(n):
        chunk = prefix + data[i * step : (i + 1) * step]
        extra = extras[i] if extras is not None and i < len(extras) else None
        if extra is not None:
            chunk += extra
        parent = _xxh3(chunk, seed=parent)
        keys.append(parent)
    return keys


@dataclass
class IndexCounters:
    """Totals since start (for metrics), in blocks: indexed, removed, evicted for capacity,
    not keyable (parent unknown), not indexed (another medium or group), and malformed
    (token count ≠ blocks × block size, extra keys not one per block, token ids ≥ 2³²)."""

    stored: int = 0
    removed: int = 0
    evictions: int = 0
    orphans: int = 0
    ignored: int = 0
    invalid: int = 0


class _Blocks:
    """One endpoint's entries: vLLM hash → our key, oldest first; ``bit`` is its bit in
    the index's holder masks."""

    __slots__ = ("bit", "block_size", "by_hash", "capacity", "copies", "dup")

    def __init__(self, capacity: int, bit: int, block_size: int = 0) -> None:
        self.by_hash: OrderedDict[BlockHash, int] = OrderedDict()
        self.capacity = capacity
        self.bit = bit
        self.block_size = block_size
        """Tokens per block of the endpoint's last valid store (0: none yet)."""
        # vLLM hashes stored more than once → extra copies. vLLM does not de-duplicate: two
        # requests computing the same prefix at once cache two physical blocks under one
        # hash, each stored and later removed on its own (vllm/v1/core/block_pool.py). Kept
        # out of the common path (one copy), as is ``dup``: keys this endpoint holds under
        # more than one vLLM hash → extra holdings.
        self.copies: dict[BlockHash, int] = {}
        self.dup: dict[int, int] = {}


@dataclass(eq=False)
class PreciseIndex:
    """Exact endpoint ↔ block index; ``default_capacity`` is in blocks per endpoint.
    Not thread-safe: one event loop (the subscribers') writes it, the scheduler on the same
    loop reads it.

    Holders are kept as a bit mask per key (one bit per endpoint, bits reused when an
    endpoint leaves): a set per key would cost ~200 bytes, and a prefix lookup is then
    a chain of integer ANDs.
    """

    default_capacity: int
    counters: IndexCounters = field(default_factory=IndexCounters)
    _holders: dict[int, int] = field(default_factory=dict, repr=False)
    _endpoints: dict[str, _Blocks] = field(default_factory=dict, repr=False)
    _names: list[str | None] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.default_capacity < 1:
            raise ValueError(f"capacity must be ≥ 1 block, got {self.default_capacity}")

    def set_capacity(self, endpoint: str, blocks: int) -> None:
        """Bound ``endpoint``'s entries to ``blocks``, evicting its oldest beyond it."""
        if blocks < 1:
            raise ValueError(f"capacity must be ≥ 1 block, got {blocks}")
        entries = self._entries(endpoint)
        entries.capacity = blocks
        while len(entries.by_hash) > blocks:
            self._evict_oldest(entries)

    def apply(self, endpoint: str, event: KVEvent) -> None:
        """Apply one event the endpoint published."""
        if isinstance(event, BlockStored):
            self.store(endpoint, event)
        elif isinstance(event, BlockRemoved):
            if event.medium in _GPU_MEDIA and not event.group_idx:
                self.remove(endpoint, event.block_hashes)
            else:
                self.counters.ignored += len(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.drop_endpoint(endpoint, keep_capacity=True)

    def store(self, endpoint: str, event: BlockStored) -> None:
        """Index the event's blocks (already validated: tokens = blocks × block_size)."""
        n = len(event.block_hashes)
        if event.medium not in _GPU_MEDIA or event.group_idx:
            self.counters.ignored += n
            return
        size = event.block_size
        tokens = event.token_ids
        extras = event.extra_keys
        if size <= 0 or len(tokens) != size * n or (extras is not None and len(extras) != n):
            self.counters.invalid += n
            return
        entries = self._entries(endpoint)
        entries.block_size = size
        by_hash = entries.by_hash
        if event.parent_block_hash is None:
            parent = ROOT_KEY
        else:
            known = by_hash.get(event.parent_block_hash)
            if known is None:
                self.counters.orphans += n
                return
            parent = known
        if extras is None and event.lora_name is not None:
            # versions that send lora_name but no extra_keys: the LoRA name is the identity
            # (a cache salt, if any, is then unknown and such blocks simply never match)
            extras = (extra_key_bytes((event.lora_name,)),) * n
        holders = self._holders
        bit = entries.bit
        try:
            keys = block_keys(tokens, size, extras, parent)
        except OverflowError:  # a token id array("I") cannot hold
            self.counters.invalid += n
            return
        # locals and one counter update per event: this loop is the ingestion's hot path
        get, held = by_hash.get, holders.get
        capacity = entries.capacity
        stored = 0
        for vllm_hash, key in zip(event.block_hashes, keys, strict=True):
            old = get(vllm_hash)
            if old is not None:
                by_hash.move_to_end(vllm_hash)
                if old == key:
                    entries.copies[vllm_hash] = entries.copies.get(vllm_hash, 0) + 1
                    continue
                # the same vLLM hash for other content: the newer store wins
                entries.copies.pop(vllm_hash, None)
                self._release(entries, old)
            by_hash[vllm_hash] = key
            mask = held(key, 0)
            if mask & bit:
                entries.dup[key] = entries.dup.get(key, 0) + 1
            else:
                holders[key] = mask | bit
            stored += 1
            if len(by_hash) > capacity:
                self._evict_oldest(entries)
        self.counters.stored += stored

    def remove(self, endpoint: str, block_hashes: Iterable[BlockHash]) -> None:
        """Forget the given vLLM hashes on ``endpoint`` (unknown ones are ignored)."""
        entries = self._endpoints.get(endpoint)
        if entries is None:
            return
        copies, pop = entries.copies, entries.by_hash.pop
        holders, keep, plain = self._holders, ~entries.bit, not entries.dup
        removed = 0
        for vllm_hash in block_hashes:
            if copies:
                extra = copies.get(vllm_hash)
                if extra is not None:  # another physical copy remains
                    if extra > 1:
                        copies[vllm_hash] = extra - 1
                    else:
                        del copies[vllm_hash]
                    removed += 1
                    continue
            key = pop(vllm_hash, None)
            if key is None:
                continue
            removed += 1
            if plain:  # _release inlined: no key held twice by this endpoint
                mask = holders.get(key, 0) & keep
                if mask:
                    holders[key] = mask
                else:
                    holders.pop(key, None)
            else:
                self._release(entries, key)
                plain = not entries.dup
        self.counters.removed += removed

    def drop_endpoint(self, endpoint: str, *, keep_capacity: bool = False) -> None:
        """Remove every entry of ``endpoint`` (it left, cleared, restarted or lost events);
        ``keep_capacity`` keeps its configured capacity (it stays, empty)."""
        entries = self._endpoints.get(endpoint)
        if entries is None:
            return
        holders = self._holders
        keep = ~entries.bit
        for key in entries.by_hash.values():
            mask = holders.get(key, 0) & keep
            if mask:
                holders[key] = mask
            else:
                holders.pop(key, None)
        if keep_capacity:
            self._endpoints[endpoint] = _Blocks(entries.capacity, entries.bit, entries.block_size)
        else:
            del self._endpoints[endpoint]
            self._names[entries.bit.bit_length() - 1] = None

    def longest_prefix(self, keys: Sequence[int]) -> dict[str, int]:
        """For every endpoint holding ``keys[0]``, how many leading blocks of ``keys`` it
        holds. Cost: one dict lookup and AND per matched block, plus one step per endpoint
        in the answer; stops at the first block no endpoint still matching holds."""
        holders = self._holders
        if not keys:
            return {}
        mask = holders.get(keys[0], 0)
        matched: dict[str, int] = {}
        depth = 1
        while mask and depth < len(keys):
            still = mask & holders.get(keys[depth], 0)
            if still != mask:
                self._record(mask & ~still, depth, matched)
                mask = still
            depth += 1
        self._record(mask, depth, matched)
        return matched

    def holder_mask(self, key: int) -> int:
        """The bit mask of the endpoints holding ``key`` (bits as :meth:`mask_of` gives;
        one dict lookup, safe to call from another thread)."""
        return self._holders.get(key, 0)

    @property
    def holder_masks(self) -> Mapping[int, int]:
        """Key → holder bit mask, read-only (a walk over many keys looks them up here
        rather than through :meth:`holder_mask`, one call fewer per key)."""
        return self._holders

    def names_of(self, mask: int, depth: int, into: dict[str, int]) -> None:
        """Set ``into[name] = depth`` for every endpoint whose bit is in ``mask`` (a bit
        whose endpoint has left meanwhile — a mask read from another thread — is
        skipped)."""
        names = self._names
        while mask:
            low = mask & -mask
            slot = low.bit_length() - 1
            name = names[slot] if slot < len(names) else None
            if name is not None:
                into[name] = depth
            mask ^= low

    @property
    def bit_width(self) -> int:
        """Bit positions the endpoints' masks use: every bit of a holder mask is below
        ``1 << bit_width`` (an endpoint joining meanwhile may take the next one)."""
        return len(self._names)

    def mask_of(self, endpoints: Iterable[str]) -> int:
        """The bits of ``endpoints`` (those without entries have none)."""
        mask = 0
        for name in endpoints:
            entries = self._endpoints.get(name)
            if entries is not None:
                mask |= entries.bit
        return mask

    def holders(self, key: int) -> frozenset[str]:
        """The endpoints holding the block named ``key``."""
        found: dict[str, int] = {}
        self._record(self._holders.get(key, 0), 1, found)
        return frozenset(found)

    def size(self, endpoint: str) -> int:
        """How many blocks ``endpoint`` holds in the index."""
        entries = self._endpoints.get(endpoint)
        return 0 if entries is None else len(entries.by_hash)

    def block_size(self, endpoint: str) -> int:
        """Tokens per block in ``endpoint``'s events (vLLM sends its ``block_size`` with
        every store); 0 before its first valid store."""
        entries = self._endpoints.get(endpoint)
        return 0 if entries is None else entries.block_size

    def entries(self, endpoint: str) -> dict[BlockHash, int]:
        """A copy of ``endpoint``'s vLLM hash → key entries (tests, debugging)."""
        entries = self._endpoints.get(endpoint)
        return {} if entries is None else dict(entries.by_hash)

    def endpoints(self) -> list[str]:
        """Endpoints with an entry table (holding blocks or a capacity set)."""
        return list(self._endpoints)

    def keys_held(self) -> int:
        """How many distinct keys some endpoint holds."""
        return len(self._holders)

    def _record(self, mask: int, depth: int, into: dict[str, int]) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            name = names[low.bit_length() - 1]
            assert name is not None  # a bit in a mask always belongs to a present endpoint
            into[name] = depth
            mask ^= low

    def _entries(self, endpoint: str) -> _Blocks:
        entries = self._endpoints.get(endpoint)
        if entries is None:
            names = self._names
            try:
                slot = names.index(None)
                names[slot] = endpoint
            except ValueError:
                slot = len(names)
                names.append(endpoint)
            entries = self._endpoints[endpoint] = _Blocks(self.default_capacity, 1 << slot)
        return entries

    def _evict_oldest(self, entries: _Blocks) -> None:
        vllm_hash, key = entries.by_hash.popitem(last=False)
        entries.copies.pop(vllm_hash, None)
        self._release(entries, key)
        self.counters.evictions += 1

    def _release(self, entries: _Blocks, key: int) -> None:
        extra = entries.dup.get(key)
        if extra is not None:
            if extra > 1:
                entries.dup[key] = extra - 1
            else:
                del entries.dup[key]
            return
        mask = self._holders.get(key, 0) & ~entries.bit
        if mask:
            self._holders[key] = mask
        else:
            self._holders.pop(key, None)
