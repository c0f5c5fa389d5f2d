"""Which candidates the precise prefix producer can answer for from the block index, and
at what block size (:mod:`sluicegate.scheduling.plugins.precise_prefix_cache`).

A candidate's view is usable when its event stream is synced and the block size its
events carry (none yet: any) is the pool's; the others are matched approximately.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.kvevents.subscriber import KVEventSubscribers, View
from sluicegate.framework import PrefixMatch

VLLM_DEFAULT_BLOCK_SIZE = 16
"""vLLM's default ``--block-size`` (tokens), used before any event or scrape told it."""


def views(
    subs: KVEventSubscribers, endpoints: Sequence[Endpoint]
) -> tuple[int, list[str], list[Endpoint]]:
    """The block size (tokens), the candidates whose view is synced at it, and the
    others."""
    index = subs.index
    size = block_size(subs, endpoints)
    synced: list[str] = []
    unknown: list[Endpoint] = []
    for e in endpoints:
        learned = index.block_size(e.name)
        if subs.view(e.name) is View.SYNCED and learned in (0, size):
            synced.append(e.name)
        else:
            unknown.append(e)
    return size, synced, unknown


def block_size(subs: KVEventSubscribers, endpoints: Sequence[Endpoint]) -> int:
    """The servers' block size (tokens): from their events, else their scraped cache
    config, else vLLM's default."""
    for e in endpoints:
        size = subs.index.block_size(e.name)
        if size and subs.view(e.name) is View.SYNCED:
            return size
    for e in endpoints:
        m = e.metrics
        if m is not None and m.block_size:
            return m.block_size
    return VLLM_DEFAULT_BLOCK_SIZE


def reach(approx: PrefixMatch, size: int) -> int:
    """The longest of ``approx``'s matches converted to blocks of ``size`` tokens."""
    return blocks_reach(approx.matched_blocks, approx.block_tokens, size)


def blocks_reach(matched: Mapping[str, int], block_tokens: int, size: int) -> int:
    """The longest of ``matched`` (blocks of ``block_tokens`` tokens) in blocks of
    ``size`` tokens."""
    return max((b * block_tokens // size for b in matched.values()), default=0)


__all__ = ["VLLM_DEFAULT_BLOCK_SIZE", "block_size", "blocks_reach", "reach", "views"]
