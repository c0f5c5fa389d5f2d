"""Paged KV blocks with automatic prefix caching (``sluicegate.sim.kvcache``).

Unit tests of ``BlockPool`` plus randomized engine workloads on the ``tiny`` profile that
check the pool's invariants after every engine step.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict, deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.sim.engine import Engine, SeqStatus, Sequence, new_sequence
from sluicegate.sim.kvcache import BlockPool
from sluicegate.sim.profiles import EngineProfile, get_profile

TINY = get_profile("tiny")

# ---------------------------------------------------------------- BlockPool


def test_pool_needs_blocks() -> None:
    with pytest.raises(ValueError, match="positive"):
        BlockPool(0)


def test_allocate_release_accounting() -> None:
    pool = BlockPool(8)
    assert (pool.num_free, pool.referenced_blocks(), pool.usage) == (8, 0, 0.0)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert len(set(a + b)) == 8
    assert (pool.num_free, pool.referenced_blocks(), pool.usage) == (0, 8, 1.0)
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.release(a)
    assert (pool.num_free, pool.referenced_blocks()) == (3, 5)
    assert pool.usage == pytest.approx(5 / 8)
    pool.release(b)
    assert (pool.num_free, pool.referenced_blocks(), pool.usage) == (8, 0, 0.0)


def test_allocate_more_than_free_raises_and_takes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(2)
    with pytest.raises(MemoryError):
        pool.allocate(3)
    assert pool.num_free == 2
    assert len(pool.allocate(2)) == 2


def test_releasing_more_often_than_referenced_raises() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(1)
    pool.release(blocks)
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(blocks)


def test_registered_blocks_are_found_as_longest_prefix() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(3)
    for b, h in zip(blocks, (11, 12, 13), strict=True):
        pool.register(b, h)
    assert pool.num_cached == 3
    assert pool.longest_cached_prefix([11, 12, 13, 14], 4) == blocks
    assert pool.longest_cached_prefix([11, 12, 99, 13], 4) == blocks[:2]
    assert pool.longest_cached_prefix([99, 11, 12], 3) == []
    assert pool.longest_cached_prefix([11, 12, 13], 2) == blocks[:2]
    assert pool.longest_cached_prefix([11, 12, 13], 0) == []


def test_register_keeps_the_first_block_for_a_hash() -> None:
    pool = BlockPool(4)
    first, second = pool.allocate(2)
    pool.register(first, 7)
    pool.register(second, 7)  # a duplicate computation of the same prefix
    pool.register(first, 8)  # a block keeps its first hash
    assert pool.longest_cached_prefix([7], 1) == [first]
    assert pool.longest_cached_prefix([8], 1) == []
    assert pool.num_cached == 1


def test_freed_cached_blocks_stay_hittable_until_evicted() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.register(blocks[0], 1)
    pool.register(blocks[1], 2)
    pool.release(blocks)
    assert pool.num_free == 4
    assert pool.longest_cached_prefix([1, 2], 2) == blocks
    # A hit takes the blocks back out of the free queue.
    assert pool.free_after_touch(blocks) == 2
    pool.touch(blocks)
    assert (pool.num_free, pool.referenced_blocks()) == (2, 2)
    # Touching referenced blocks again shares them without using free blocks.
    assert pool.free_after_touch(blocks) == 2
    pool.touch(blocks)
    assert pool.num_free == 2
    pool.release(blocks)
    assert pool.num_free == 2
    pool.release(blocks)
    assert pool.num_free == 4
    assert pool.longest_cached_prefix([1, 2], 2) == blocks


def test_allocation_evicts_least_recently_freed_first_and_tail_blocks_first() -> None:
    pool = BlockPool(6)
    seq_a = pool.allocate(3)
    seq_b = pool.allocate(3)
    for i, b in enumerate(seq_a):
        pool.register(b, 100 + i)
    for i, b in enumerate(seq_b):
        pool.register(b, 200 + i)
    pool.release(seq_a)  # freed first
    pool.release(seq_b)
    # Taking one block evicts a's last block: a's prefix shrinks, b's stays whole.
    taken = pool.allocate(1)
    assert taken == [seq_a[2]]
    assert pool.longest_cached_prefix([100, 101, 102], 3) == seq_a[:2]
    assert pool.longest_cached_prefix([200, 201, 202], 3) == seq_b
    assert pool.num_cached == 5
    # The next two take the rest of a, first block last.
    assert pool.allocate(2) == [seq_a[1], seq_a[0]]
    assert pool.longest_cached_prefix([100], 1) == []
    assert pool.longest_cached_prefix([200, 201, 202], 3) == seq_b


def test_evicted_block_can_be_registered_under_a_new_hash() -> None:
    pool = BlockPool(1)
    (b,) = pool.allocate(1)
    pool.register(b, 5)
    pool.release([b])
    assert pool.allocate(1) == [b]
    assert pool.longest_cached_prefix([5], 1) == []
    pool.register(b, 6)
    assert pool.longest_cached_prefix([6], 1) == [b]


def test_clear_cache_forgets_hashes_but_keeps_references() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.register(blocks[0], 1)
    pool.register(blocks[1], 2)
    pool.release(blocks[1:])
    pool.clear_cache()
    assert pool.num_cached == 0
    assert pool.longest_cached_prefix([1, 2], 2) == []
    assert (pool.num_free, pool.referenced_blocks()) == (3, 1)
    # The blocks can be registered again.
    pool.register(blocks[0], 3)
    assert pool.longest_cached_prefix([3], 1) == [blocks[0]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alloc", "release", "hit", "register"]), st.integers(0, 50)),
        max_size=80,
    )
)
def test_pool_random_operations_keep_counts_consistent(ops: list[tuple[str, int]]) -> None:
    """Against a model of who holds what: counts add up and the cache never lies."""
    pool = BlockPool(12)
    holders: list[list[int]] = []  # each entry: blocks one "request" references
    content: dict[int, int] = {}  # block -> hash registered for it (the model's view)
    for op, x in ops:
        if op == "alloc" and x % 5 <= pool.num_free:
            holders.append(pool.allocate(x % 5))
            for b in holders[-1]:
                content.pop(b, None)  # allocation evicts whatever the block held
        elif op == "release" and holders:
            pool.release(holders.pop(x % len(holders)))
        elif op == "register" and holders:
            held = holders[x % len(holders)]
            if held:
                b = held[x % len(held)]
                if b not in content and x not in content.values():
                    content[b] = x
                pool.register(b, x)
        elif op == "hit" and content:
            h = sorted(content.values())[x % len(content)]
            blocks = pool.longest_cached_prefix([h], 1)
            assert len(blocks) == 1
            assert content[blocks[0]] == h
            pool.touch(blocks)
            holders.append(blocks)
        refs: dict[int, int] = defaultdict(int)
        for held in holders:
            for b in held:
                refs[b] += 1
        assert pool.referenced_blocks() == len(refs)
        assert pool.num_free + pool.referenced_blocks() == pool.num_blocks
        assert 0.0 <= pool.usage <= 1.0
        assert pool.num_cached == len(content)
        for b, h in content.items():
            assert pool.longest_cached_prefix([h], 1) == [b]
    for held in holders:
        pool.release(held)
    assert pool.num_free == pool.num_blocks


# ---------------------------------------------------------------- pool invariants under load


def check_pool_invariants(engine: Engine) -> None:
    """KV invariants that must hold between any two engine steps."""
    pool, profile = engine.pool, engine.profile
    referenced = pool.referenced_blocks()
    assert pool.num_free + referenced == pool.num_blocks == profile.num_gpu_blocks
    assert 0.0 <= pool.usage <= 1.0
    assert pool.usage == pytest.approx(referenced / pool.num_blocks)
    assert pool.num_cached <= pool.num_blocks
    assert len(engine.running) <= profile.max_num_seqs

    holders: dict[int, list[tuple[Sequence, int]]] = defaultdict(list)
    for seq in engine.running:
        assert seq.status is SeqStatus.RUNNING
        assert len(set(seq.blocks)) == len(seq.blocks)
        # A running sequence holds exactly the blocks its computed tokens occupy.
        assert len(seq.blocks) == math.ceil(seq.num_computed / profile.block_size)
        assert 0 < seq.num_computed <= seq.num_tokens
        for index, block in enumerate(seq.blocks):
            holders[block].append((seq, index))
    for seq in engine.waiting:
        assert seq.status is SeqStatus.WAITING
        assert seq.blocks == []
    # Every referenced block belongs to a running sequence and vice versa.
    assert len(holders) == referenced
    for block, owners in holders.items():
        if len(owners) == 1:
            continue
        # Shared only as the same position of a cached prefix.
        positions = {index for _, index in owners}
        assert len(positions) == 1, f"block {block} at different positions"
        (index,) = positions
        for seq, _ in owners:
            assert index < seq.num_registered
            assert pool.longest_cached_prefix([seq.hashes[index]], 1) == [block]


def _prompt(tag: str, tokens: int) -> bytes:
    n_bytes = tokens * 4
    out = "".join(f"{tag}{i:05d}|" for i in range(n_bytes // 6 + 1)).encode()[:n_bytes]
    assert len(out) == n_bytes
    return out


_request = st.tuples(
    st.integers(0, 3),  # shared prefix family
    st.integers(0, 300),  # shared prefix tokens
    st.integers(1, 120),  # own suffix tokens
    st.integers(1, 80),  # max_tokens
    st.booleans(),  # ignore_eos
    st.sampled_from([None, None, "lora-a", "lora-b", "lora-c"]),
    st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05]),  # gap to the previous arrival (s)
)


@dataclasses.dataclass
class _Run:
    engine: Engine
    seqs: list[Sequence]
    steps: int


def _drive_with_checks(
    profile: EngineProfile,
    specs: list[tuple[int, int, int, int, bool, str | None, float]],
    prefix_caching: bool,
    abort_every: int = 0,
) -> _Run:
    engine = Engine(profile, enable_prefix_caching=prefix_caching)
    seqs: list[Sequence] = []
    arrival = 0.0
    for i, (family, shared, own, max_tokens, ignore_eos, lora, gap) in enumerate(specs):
        arrival += gap
        prompt = _prompt(f"F{family}", shared) + _prompt(f"R{i}", own)
        seqs.append(
            new_sequence(
                f"req-{i}",
                prompt,
                arrival=arrival,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
                max_model_len=profile.max_model_len,
                model=profile.model_name,
                lora=lora,
            )
        )
    pending = deque(seqs)
    now, steps = 0.0, 0
    while pending or engine.has_work():
        while pending and pending[0].arrival <= now:
            engine.add(pending.popleft())
        if not engine.has_work():
            now = pending[0].arrival
            continue
        result = engine.step(now)
        steps += 1
        assert not result.idle, "an engine with work made no progress"
        assert result.batched_tokens <= profile.max_num_batched_tokens
        now += result.duration
        check_pool_invariants(engine)
        if abort_every and steps % abort_every == 0 and engine.running:
            engine.abort(engine.running[-1].request_id, now)
            check_pool_invariants(engine)
    return _Run(engine, seqs, steps)


def _assert_all_blocks_free(engine: Engine) -> None:
    pool = engine.pool
    assert pool.num_free == pool.num_blocks
    assert pool.referenced_blocks() == 0
    assert pool.usage == 0.0
    assert not engine.running
    assert not engine.waiting


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(_request, min_size=1, max_size=24),
    num_gpu_blocks=st.sampled_from([40, 96, 512]),
    prefix_caching=st.booleans(),
    abort_every=st.sampled_from([0, 0, 7, 23]),
)
def test_random_workloads_keep_kv_invariants_and_free_everything(
    specs: list[tuple[int, int, int, int, bool, str | None, float]],
    num_gpu_blocks: int,
    prefix_caching: bool,
    abort_every: int,
) -> None:
    # 40 blocks (640 tokens) still fit the largest request (420 prompt + 80 output tokens)
    # but force preemption under load.
    profile = dataclasses.replace(TINY, num_gpu_blocks=num_gpu_blocks)
    run = _drive_with_checks(profile, specs, prefix_caching, abort_every)
    _assert_all_blocks_free(run.engine)
    for seq in run.seqs:
        assert seq.finished
        assert seq.blocks == []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("num_gpu_blocks", [40, 128])
def test_large_seeded_workloads_keep_kv_invariants(seed: int, num_gpu_blocks: int) -> None:
    """Bigger workloads than hypothesis usually draws: 48 requests, bursts and LoRAs."""
    rng = random.Random(seed)
    specs = [
        (
            rng.randrange(3),
            rng.randrange(0, 300),
            rng.randrange(1, 120),
            rng.randrange(1, 80),
            rng.random() < 0.5,
            rng.choice([None, "lora-a", "lora-b", "lora-c"]),
            rng.choice([0.0, 0.0, 0.002, 0.02]),
        )
        for _ in range(48)
    ]
    profile = dataclasses.replace(TINY, num_gpu_blocks=num_gpu_blocks)
    abort_every = 29 if seed % 2 else 0
    run = _drive_with_checks(profile, specs, prefix_caching=seed % 3 != 0, abort_every=abort_every)
    _assert_all_blocks_free(run.engine)
    assert all(s.finished for s in run.seqs)
    if num_gpu_blocks == 40:
        assert run.engine.counters.preemptions > 0


def test_shared_prefixes_are_shared_blocks_under_load() -> None:
    """Concurrent requests with one long cached prefix hold its blocks once."""
    engine = Engine(TINY)
    seqs = [
        new_sequence(
            f"s{i}",
            _prompt("F0", 256) + _prompt(f"R{i}", 8),
            arrival=0.0,
            max_tokens=30,
            ignore_eos=True,
            max_model_len=TINY.max_model_len,
            model=TINY.model_name,
        )
        for i in range(16)
    ]
    engine.add(seqs[0])
    now = 0.0
    while seqs[0].num_output == 0:
        now += engine.step(now).duration
    for seq in seqs[1:]:
        engine.add(seq)
    now += engine.step(now).duration
    check_pool_invariants(engine)
    assert len(engine.running) == 16
    # Each sequence has 264 prompt tokens (17 blocks); the 16 prefix blocks are held once.
    assert engine.pool.referenced_blocks() == 16 + 16 * 1
    for seq in seqs[1:]:
        assert seq.num_cached_prompt_tokens == 256
        assert seq.blocks[:16] == seqs[0].blocks[:16]
        assert len(seq.blocks) == 17


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_tiny_cache_under_heavy_pressure_frees_everything(prefix_caching: bool) -> None:
    profile = dataclasses.replace(TINY, num_gpu_blocks=24)
    specs = [(i % 2, 100, 50, 60, True, None, 0.0) for i in range(20)]
    run = _drive_with_checks(profile, specs, prefix_caching)
    assert run.engine.counters.preemptions > 0
    _assert_all_blocks_free(run.engine)
    assert all(s.status is SeqStatus.FINISHED for s in run.seqs)
