"""Paged KV-cache blocks with automatic prefix caching, as vLLM manages them.

A fixed number of blocks, each ``block_size`` tokens. A block holding a full, computed
block of tokens is registered under the chained hash of its prefix, so a later request
with the same prefix reuses it instead of recomputing it. Blocks whose reference count
drops to zero go to the back of a free queue but keep their hash: they are reused by a
prefix hit until the allocator takes them from the front of the queue (least recently
freed first), which evicts their hash.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluicegate.sim.kvevents import KVEventLog

_NO_HASH = -1


class BlockPool:
    """KV blocks, their reference counts and the prefix-cache index (hash -> block)."""

    __slots__ = ("_block_hash", "_cached", "_free", "_ref", "kv_events", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._block_hash = [_NO_HASH] * num_blocks
        # Free blocks in eviction order: the front is taken first.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}
        self.kv_events: KVEventLog | None = None
        """Where evictions and clears are logged when KV events are on."""

    @property
    def num_free(self) -> int:
        """Blocks not referenced by any request (cached or empty)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks registered in the prefix-cache index."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests, 0..1 (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / self.num_blocks

    def longest_cached_prefix(self, hashes: list[int], limit: int) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes[:limit]``."""
        cached = self._cached
        out: list[int] = []
        for h in hashes[:limit]:
            block = cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def free_after_touch(self, blocks: list[int]) -> int:
        """How many free blocks would remain after taking a reference on ``blocks``."""
        ref = self._ref
        return len(self._free) - sum(1 for b in blocks if ref[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached ``blocks`` (a prefix hit)."""
        ref, free = self._ref, self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue, evicting their hashes."""
        if n > len(self._free):
            raise MemoryError(f"need {n} KV blocks, {len(self._free)} free")
        free, ref, block_hash, cached = self._free, self._ref, self._block_hash, self._cached
        events = self.kv_events
        out: list[int] = []
        for _ in range(n):
            b, _none = free.popitem(last=False)
            h = block_hash[b]
            if h != _NO_HASH:
                if cached.get(h) == b:
                    del cached[h]
                    if events is not None:
                        events.removed(h)
                block_hash[b] = _NO_HASH
            ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block; blocks reaching zero become free.

        Blocks are released tail first so that a request's last blocks, the least likely
        to be shared, are evicted before its first ones.
        """
        ref, free = self._ref, self._free
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
            elif ref[b] < 0:
                raise RuntimeError(f"KV block {b} released more often than referenced")

    def register(self, block: int, block_hash: int) -> bool:
        """Record that ``block`` holds the full block identified by ``block_hash``; False
        when it was not entered (the block has a hash, or another block holds this one)."""
        if self._block_hash[block] != _NO_HASH or block_hash in self._cached:
            return False
        self._cached[block_hash] = block
        self._block_hash[block] = block_hash
        return True

    def fork(self) -> BlockPool:
        """An independent copy, for what-if simulations."""
        twin = BlockPool.__new__(BlockPool)
        twin.num_blocks = self.num_blocks
        twin._ref = list(self._ref)
        twin._block_hash = list(self._block_hash)
        twin._free = self._free.copy()
        twin._cached = dict(self._cached)
        twin.kv_events = None  # what-ifs publish nothing
        return twin

    def referenced_blocks(self) -> int:
        """Blocks with a non-zero reference count (for invariant checks)."""
        return sum(1 for r in self._ref if r > 0)

    def cached_hashes(self) -> set[int]:
        """The hashes of every block in the prefix cache (tests compare the KV-event index)."""
        return set(self._cached)

    def clear_cache(self) -> None:
        """Forget every cached hash (vLLM's reset_prefix_cache); referenced blocks stay."""
        if self.kv_events is not None:
            self.kv_events.cleared()
        for h, b in self._cached.items():
            if self._block_hash[b] == h:
                self._block_hash[b] = _NO_HASH
        self._cached.clear()
