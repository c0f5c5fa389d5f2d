"""How far a precise prefix decision needs a prompt's blocks (progressive encoding).

A candidate's match is the leading blocks of the prompt it holds — in the precise index,
then, with speculation on, in the speculative entries — so once no synced candidate
holds every block so far, more blocks change no match. :class:`Frontier` is the
``enough`` test :func:`sluicegate.tokenization.progressive.advance` asks after each
chunk: it ANDs the holder masks of the new keys into the set of candidates still
matching, which starts as the synced candidates (a speculative entry counts as holding,
expired or not: an over-estimate only encodes further; a candidate without index entries
gets a bit above the index's for its guesses, so servers that are not candidates never
keep the encoding going) and answers yes when that set is empty, the approximate matches of the
candidates without a synced view are covered (``min_blocks``: their match is
``min(prompt blocks, converted approximate blocks)``, exact once the keys reach it), and
at least one block is keyed. With ``approximateWhenNoneHolds`` a prefetch also sets
``cold_blocks``: the approximate index's match among the synced candidates, in blocks,
which the decision then keys as far as when no synced candidate holds the first block
(so that catch-up is encoded in the prefetch's thread, not on the event loop). Each
call reads only dict look-ups, so a prefetch may run it in a worker thread.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate, islice, repeat
from operator import and_

from sluicegate.datalayer.kvevents.index import PreciseIndex
from sluicegate.datalayer.kvevents.wire import extra_key_bytes
from sluicegate.framework import LLMRequest
from sluicegate.scheduling.speculative import SpeculativeEntries
from sluicegate.tokenization.progressive import BlockKeying


class Frontier:
    """``enough(keys)`` for one request's decision (see the module docstring). Without
    speculation the walk is the index's longest-prefix walk over the synced candidates,
    so :meth:`matched` answers it without a second walk."""

    __slots__ = (
        "_bits",
        "_depths",
        "_holders",
        "_index",
        "_mask",
        "_pos",
        "_spec",
        "cold_blocks",
        "min_blocks",
    )

    def __init__(
        self,
        index: PreciseIndex,
        synced: Sequence[str],
        spec: SpeculativeEntries | None,
        min_blocks: int,
    ) -> None:
        self._index = index
        self._holders = index.holder_masks
        self._spec = spec
        self._bits: list[tuple[str, int]] = []
        self._mask = index.mask_of(synced)
        if spec is not None:  # a candidate without index entries may still have guesses
            spare = 1 << index.bit_width
            for name in synced:
                bit = index.mask_of((name,))
                if not bit:
                    bit, spare = spare, spare << 1
                self._bits.append((name, bit))
                self._mask |= bit
        self._pos = 0
        self._depths: dict[str, int] = {}
        self.min_blocks = min_blocks
        self.cold_blocks = 0
        """Blocks to key when no synced candidate holds the first one (0: none)."""

    def __call__(self, keys: Sequence[int]) -> bool:
        mask, pos = self._mask, self._pos
        get = self._holders.get
        spec = self._spec
        n = len(keys)
        if spec is None:
            if mask and pos < n:
                mask, pos = self._walk(keys, mask, pos)
        else:
            while mask and pos < n:
                key = keys[pos]
                m = get(key, 0)
                for name, bit in self._bits:
                    if spec.holds(key, name):
                        m |= bit
                mask &= m
                pos += 1
        self._mask, self._pos = mask, pos
        need = self.min_blocks
        if self.cold_blocks and pos <= 1:  # the set emptied at the first block (or was)
            need = max(need, self.cold_blocks)
        return not mask and n >= max(1, need)

    def _walk(self, keys: Sequence[int], mask: int, pos: int) -> tuple[int, int]:
        """The AND-chain of holder masks from ``keys[pos]`` on, in C (``map`` and
        ``accumulate``): ``chain[j]`` is the set still matching after ``j`` more keys. Bits
        only leave it, so where it changes is found by bisection; the endpoints leaving
        at a change stop matching at that block."""
        get = self._holders.get
        chain = list(accumulate(map(get, islice(keys, pos, None), repeat(0)), and_, initial=mask))
        depths, index = self._depths, self._index
        at, current = 0, mask
        while current:
            at = bisect_left(chain, True, at + 1, key=lambda m: m != current)
            if at == len(chain):
                return current, pos + len(chain) - 1
            index.names_of(current & ~chain[at], pos + at - 1, depths)
            current = chain[at]
        return 0, pos + at

    def matched(self, keys: Sequence[int]) -> dict[str, int] | None:
        """Per synced candidate holding ``keys[0]``, how many leading blocks of ``keys``
        it holds in the index (``PreciseIndex.longest_prefix`` restricted to them), from
        this walk; None with speculation (the walk over-estimates then)."""
        if self._spec is not None:
            return None
        self(keys)  # the walk up to the end of keys, if it stopped short
        out = dict(self._depths)
        if self._mask:
            self._index.names_of(self._mask, self._pos, out)
        limit = len(keys)
        return {name: min(d, limit) for name, d in out.items() if d and limit}


def keying(request: LLMRequest, size: int) -> BlockKeying:
    """The request's block keying as vLLM names blocks: the LoRA name on every block, the
    cache salt after it on the first."""
    lora = (request.target_model,) if request.is_adapter else ()
    if not lora and not request.cache_salt:
        return BlockKeying(size)
    rest = extra_key_bytes(lora)
    first = extra_key_bytes((*lora, request.cache_salt) if request.cache_salt else lora)
    return BlockKeying(size, first, rest)


__all__ = ["Frontier", "keying"]
