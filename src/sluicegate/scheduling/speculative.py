"""Speculative prefix entries: blocks a request was just sent to compute, before the
server's own KV events say it holds them.

Between a dispatch and the ``BlockStored`` events of its prefill lie the queue wait, the
prefill and the event delivery — tens of milliseconds to seconds under load. A burst of
requests sharing a new prefix would, on the precise index alone, scatter over the pool,
each computing the prefix again. The reference router's ``speculativeIndexing`` (off by
default there) inserts the chosen endpoint's blocks at dispatch with a short time to live;
this is that store.

Entries are (block key, endpoint) with an expiry ``ttl_s`` after insertion; one TTL for
all, so insertion order is expiry order and expired entries are dropped from the oldest
end on every call (amortised O(1)). At most ``max_entries`` are kept (the oldest go
first). Real events take over: a lookup counts the blocks the precise index holds first
and consults these entries only beyond them, so once the server's ``BlockStored`` arrives
the entry is redundant and lapses unused; a guess no event confirms simply expires. A
removal the server reports does not clear a speculative entry — it lapses with its TTL,
which bounds how long a wrong guess can attract requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

SpecKey = tuple[int, str]
"""(block key, endpoint name)."""


class SpeculativeEntries:
    """Blocks recently dispatched to an endpoint, each valid for ``ttl_s`` seconds.

    Memory: one ordered-dict entry (a 2-tuple key and a float) per (block, endpoint), about
    200 bytes on CPython 3.11; ``max_entries`` bounds it.
    """

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        if ttl_s <= 0:
            raise ValueError(f"speculative TTL must be > 0 s, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"speculative entries must be ≥ 1, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._expiry: OrderedDict[SpecKey, float] = OrderedDict()
        self.inserted = 0
        """Entries inserted since start (re-insertions included)."""
        self.expired = 0
        """Entries dropped at their TTL or for room (never confirmed by a lookup)."""

    def __len__(self) -> int:
        return len(self._expiry)

    def insert(self, endpoint: str, keys: Sequence[int], now: float) -> None:
        """Mark ``keys`` as held by ``endpoint`` until ``now + ttl_s``."""
        self._expire(now)
        expiry = self._expiry
        until = now + self.ttl_s
        for key in keys:
            k = (key, endpoint)
            if k in expiry:
                expiry.move_to_end(k)
            expiry[k] = until
        self.inserted += len(keys)
        while len(expiry) > self.max_entries:
            expiry.popitem(last=False)
            self.expired += 1

    def extend(self, endpoint: str, keys: Sequence[int], depth: int, now: float) -> int:
        """How many leading blocks of ``keys`` ``endpoint`` holds when the first ``depth``
        are known held (by the precise index) and the rest may be speculative."""
        self._expire(now)
        expiry = self._expiry
        n = len(keys)
        while depth < n and (keys[depth], endpoint) in expiry:
            depth += 1
        return depth

    def holds(self, key: int, endpoint: str) -> bool:
        """Whether an entry (key, endpoint) is kept, expired or not (a look-up that
        changes nothing: an over-estimate, safe from another thread)."""
        return (key, endpoint) in self._expiry

    def forget(self, endpoint: str) -> None:
        """Drop every entry of ``endpoint`` (it left)."""
        for k in [k for k in self._expiry if k[1] == endpoint]:
            del self._expiry[k]

    def _expire(self, now: float) -> None:
        expiry = self._expiry
        while expiry:
            k, until = next(iter(expiry.items()))
            if until > now:
                return
            del expiry[k]
            self.expired += 1


__all__ = ["SpeculativeEntries"]
