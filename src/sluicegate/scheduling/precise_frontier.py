"""How far a precise prefix decision needs a prompt's blocks (progressive encoding).

A candidate's match is the leading blocks of the prompt it holds — in the precise index,
then, with speculation on, in the speculative entries — so once no synced candidate
holds every block so far, more blocks change no match. :class:`Frontier` is the
``enough`` test :func:`sluicegate.tokenization.progressive.advance` asks after each
chunk: it ANDs the holder masks of the new keys into the set of candidates still
matching (a speculative entry counts as holding, expired or not: an over-estimate only
encodes further) and answers yes when that set is empty, the approximate matches of the
candidates without a synced view are covered (``min_blocks``: their match is
``min(prompt blocks, converted approximate blocks)``, exact once the keys reach it), and
at least one block is keyed. Each call reads only dict look-ups, so a prefetch may run
it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.kvevents.index import PreciseIndex
from sluicegate.datalayer.kvevents.wire import extra_key_bytes
from sluicegate.framework import LLMRequest
from sluicegate.scheduling.speculative import SpeculativeEntries
from sluicegate.tokenization.progressive import BlockKeying


class Frontier:
    """``enough(keys)`` for one request's decision (see the module docstring)."""

    __slots__ = ("_bits", "_index", "_mask", "_pos", "_spec", "min_blocks")

    def __init__(
        self,
        index: PreciseIndex,
        synced: Sequence[str],
        spec: SpeculativeEntries | None,
        min_blocks: int,
    ) -> None:
        self._index = index
        self._spec = spec
        self._bits = [(name, index.mask_of((name,))) for name in synced] if spec else []
        self._mask = index.mask_of(synced)
        if spec is not None:  # an endpoint without index entries may still have guesses
            self._mask = -1
        self._pos = 0
        self.min_blocks = min_blocks

    def __call__(self, keys: Sequence[int]) -> bool:
        mask, pos = self._mask, self._pos
        held = self._index.holder_mask
        spec = self._spec
        while mask and pos < len(keys):
            key = keys[pos]
            m = held(key)
            if spec is not None:
                for name, bit in self._bits:
                    if spec.holds(key, name):
                        m |= bit or -1
            mask &= m
            pos += 1
        self._mask, self._pos = mask, pos
        return not mask and len(keys) >= max(1, self.min_blocks)


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
