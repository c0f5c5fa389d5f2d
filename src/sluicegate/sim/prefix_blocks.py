"""The engine's prefix-cache bookkeeping for one sequence: the bytes of its blocks, their
chained hashes, and registering full blocks in the block pool (with the KV events vLLM
publishes for them).

A block is ``block_size`` built-in tokens (4 bytes each) of prompt + output. Its hash
chains the previous block's (the first block's from the sequence's ``hash_seed``, which
covers the model or adapter and the cache salt), so two sequences share a cached block
exactly when everything before it and in it is the same. Used by
:class:`~sluicegate.sim.engine.Engine` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import xxhash

from sluicegate.sim.text import output_bytes
from sluicegate.tokens import BYTES_PER_TOKEN, token_ids

if TYPE_CHECKING:
    from sluicegate.sim.kvcache import BlockPool
    from sluicegate.sim.kvevents import KVEventLog
    from sluicegate.sim.sequence import Sequence

_xxh64 = xxhash.xxh64_intdigest


def block_bytes(seq: Sequence, b: int, block_size: int) -> bytes:
    """The bytes of block ``b`` of the sequence's prompt + output (a full block of
    ``block_size`` tokens)."""
    bs_bytes = block_size * BYTES_PER_TOKEN
    prompt = seq.prompt
    start, end = b * bs_bytes, (b + 1) * bs_bytes
    if end <= len(prompt):
        return prompt[start:end]
    # Generated tokens start at the first token boundary after the prompt.
    prompt_end = seq.prompt_tokens * BYTES_PER_TOKEN
    head = prompt[start:].ljust(max(0, prompt_end - start), b"\0")
    first_out = max(0, (start - prompt_end) // BYTES_PER_TOKEN)
    last_out = (end - prompt_end) // BYTES_PER_TOKEN
    return head + output_bytes(seq.output_seed, first_out, last_out)


def extend_hashes(
    seq: Sequence, n_blocks: int, block_size: int, chunks: dict[int, bytes] | None = None
) -> None:
    """Compute chained hashes for the first ``n_blocks`` blocks of prompt + output
    (and keep each new block's bytes in ``chunks`` when given)."""
    hashes = seq.hashes
    if len(hashes) >= n_blocks:
        return
    h = hashes[-1] if hashes else seq.hash_seed
    for b in range(len(hashes), n_blocks):
        chunk = block_bytes(seq, b, block_size)
        if chunks is not None:
            chunks[b] = chunk
        h = _xxh64(chunk, h)
        hashes.append(h)


def register_blocks(
    seq: Sequence,
    full_blocks: int,
    pool: BlockPool,
    block_size: int,
    events: KVEventLog | None,
) -> None:
    """Enter the sequence's computed blocks up to ``full_blocks`` into ``pool``'s prefix
    cache (logging them to ``events`` when KV events are on)."""
    register = pool.register
    blocks, hashes = seq.blocks, seq.hashes
    if events is None:
        extend_hashes(seq, full_blocks, block_size)
        for b in range(seq.num_registered, full_blocks):
            register(blocks[b], hashes[b])
    else:
        chunks: dict[int, bytes] = {}  # generated blocks' bytes, hashed and logged
        extend_hashes(seq, full_blocks, block_size, chunks)
        # one BlockStored per run of blocks entered into the cache (a block another
        # block already holds is not: the sim keeps one copy per hash)
        run = -1
        for b in range(seq.num_registered, full_blocks):
            if register(blocks[b], hashes[b]):
                if run < 0:
                    run = b
            elif run >= 0:
                _log_stored(seq, run, b, chunks, block_size, events)
                run = -1
        if run >= 0:
            _log_stored(seq, run, full_blocks, chunks, block_size, events)
    seq.num_registered = full_blocks


def _log_stored(
    seq: Sequence,
    start: int,
    end: int,
    chunks: dict[int, bytes],
    block_size: int,
    events: KVEventLog,
) -> None:
    """Log blocks ``start`` … ``end − 1`` of ``seq`` as stored, as vLLM describes them."""
    bs_bytes = block_size * BYTES_PER_TOKEN
    if end * bs_bytes <= len(seq.prompt):  # prompt blocks: one slice
        data = seq.prompt[start * bs_bytes : end * bs_bytes]
    else:
        data = b"".join(chunks.get(b) or block_bytes(seq, b, block_size) for b in range(start, end))
    extra: list[list[str] | None] | None = None
    if seq.lora or seq.cache_salt:
        # vLLM's extra keys of a block: the adapter's name, the salt on the first block
        lora = [seq.lora] if seq.lora else []
        extra = [
            ([*lora, seq.cache_salt] if b == 0 and seq.cache_salt else lora) or None
            for b in range(start, end)
        ]
    events.stored(
        seq.hashes[start:end],
        seq.hashes[start - 1] if start else None,
        token_ids(data),
        block_size,
        seq.lora,
        extra,
    )


__all__ = ["block_bytes", "extend_hashes", "register_blocks"]
