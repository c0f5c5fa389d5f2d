"""The approximate prefix-cache index: which endpoint probably holds which prompt blocks.

The gateway cannot see model servers' KV caches, so it remembers what it sent where: after
a request is scheduled, the chained hashes of its prompt blocks are recorded for the chosen
endpoint. A later request sharing a prefix finds, per endpoint, how many of its leading
blocks were sent there.

Memory is bounded: each endpoint keeps at most ``capacity`` block hashes in LRU order (its
KV capacity in blocks, when known), and the reverse map only holds hashes some endpoint
still keeps. The reverse map stores, per hash, a bit mask of the endpoints holding it: plain
integers, which the garbage collector never has to walk (a set per hash made gen-2
collections take milliseconds with a full index) and which intersect in one operation.
An entry costs roughly 225 bytes (tracemalloc: the hash, its LRU slot and stamp, its share of
the reverse map), so 100 endpoints × 31,250 blocks is about 700 MB at worst; lower
``lruCapacityPerServer`` for larger pools.

Each entry also keeps its endpoint's count of blocks recorded as of its last use, so
:meth:`PrefixIndex.distance` tells how many blocks were sent there since: a measure of the
traffic that pushes a prefix out of the server's cache, which evicts in LRU order and has
far less than its whole KV capacity free to keep old prefixes while requests run. A prefix
the index still holds may be long gone there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class PrefixIndex:
    """Per-endpoint LRU sets of block hashes plus a reverse map for matching."""

    __slots__ = (
        "_bit",
        "_by_hash",
        "_free_bits",
        "_lru",
        "_names",
        "_stamps",
        "default_capacity",
    )

    def __init__(self, default_capacity: int) -> None:
        if default_capacity <= 0:
            raise ValueError("default_capacity must be positive")
        self.default_capacity = default_capacity
        self._lru: dict[str, OrderedDict[int, int]] = {}
        """Per endpoint: block hash → the endpoint's block count when last recorded."""
        self._stamps: dict[str, int] = {}
        """Per endpoint: blocks recorded there so far (repeats included)."""
        self._by_hash: dict[int, int] = {}
        """Block hash → bit mask of the endpoints holding it."""
        self._bit: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._free_bits: list[int] = []

    def __len__(self) -> int:
        """Entries (endpoint, hash) held in total."""
        return sum(len(lru) for lru in self._lru.values())

    @property
    def distinct_hashes(self) -> int:
        return len(self._by_hash)

    def match(self, hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``hashes`` recorded for each endpoint (0 when none)."""
        matched: dict[str, int] = {}
        alive = 0
        bits = self._bit
        for name in endpoints:
            matched[name] = 0
            bit = bits.get(name)
            if bit is not None:
                alive |= 1 << bit
        if not alive:
            return matched
        by_hash = self._by_hash
        names = self._names
        for i, h in enumerate(hashes):
            still = alive & by_hash.get(h, 0)
            if still != alive:
                # Endpoints dropping out here matched the i blocks before this one.
                gone = alive & ~still
                while gone:
                    low = gone & -gone
                    matched[names[low.bit_length() - 1]] = i
                    gone ^= low
                if not still:
                    return matched
                alive = still
        n = len(hashes)
        while alive:
            low = alive & -alive
            matched[names[low.bit_length() - 1]] = n
            alive ^= low
        return matched

    def insert(self, endpoint: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        """Record ``hashes`` as cached on ``endpoint`` (most recently used).

        The chain is recorded tail first, so its head ends most recent: when a prompt is
        longer than the endpoint's capacity, what stays is the prefix a later request can
        match, not an unreachable tail.
        """
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
            bit = self._free_bits.pop() if self._free_bits else len(self._bit)
            self._bit[endpoint] = bit
            self._names[bit] = endpoint
        mask = 1 << self._bit[endpoint]
        by_hash = self._by_hash
        stamp = self._stamps.get(endpoint, 0)
        for h in reversed(hashes):
            stamp += 1
            if h in lru:
                lru.move_to_end(h)
                lru[h] = stamp
                continue
            lru[h] = stamp
            by_hash[h] = by_hash.get(h, 0) | mask
        self._stamps[endpoint] = stamp
        limit = capacity if capacity and capacity > 0 else self.default_capacity
        while len(lru) > limit:
            old, _ = lru.popitem(last=False)
            self._forget(old, mask)

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything recorded for ``endpoint``."""
        lru = self._lru.pop(endpoint, None)
        self._stamps.pop(endpoint, None)
        if lru is None:
            return
        bit = self._bit.pop(endpoint)
        del self._names[bit]
        mask = 1 << bit
        for h in lru:
            self._forget(h, mask)
        self._free_bits.append(bit)

    def distance(self, endpoint: str, block_hash: int) -> int | None:
        """Blocks recorded for ``endpoint`` after ``block_hash`` was last recorded there
        (0: none since), or None when the index does not hold it there.

        Every block sent counts, held already or not: a request whose prompt the server
        has cached still makes it allocate blocks for its output, so the blocks sent track
        the allocations that evict old prefixes. (Counting only blocks new to the index was
        measured worse: Llama-3-8B TTFT MAPE 8.4 % against 7.7 %, SLO attainment +7 against
        +13 points in ``slo-mixed`` at 85 req/s.) A prompt's own blocks count too: it is
        recorded tail first, so its first block is n − 1 blocks after its last."""
        lru = self._lru.get(endpoint)
        stamp = lru.get(block_hash) if lru is not None else None
        return None if stamp is None else self._stamps[endpoint] - stamp

    def endpoint_size(self, endpoint: str) -> int:
        lru = self._lru.get(endpoint)
        return len(lru) if lru is not None else 0

    def _forget(self, h: int, mask: int) -> None:
        holders = self._by_hash.get(h, 0) & ~mask
        if holders:
            self._by_hash[h] = holders
        else:
            self._by_hash.pop(h, None)
