"""The precise block index: exact, bounded, and equal to a naive model."""

from __future__ import annotations

import random
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.datalayer.kvevents.index import ROOT_KEY, PreciseIndex, block_key, block_keys
from sluicegate.datalayer.kvevents.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    extra_key_bytes,
)

BS = 4


def _stored(hashes: list[int], parent: int | None, tokens: list[int], **kw: object) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tokens, BS, **kw)  # type: ignore[arg-type]


def test_keys_from_events_equal_keys_from_request_tokens() -> None:
    index = PreciseIndex(default_capacity=100)
    prompt = list(range(100, 114))  # 3 full blocks and 2 tokens more
    # the server stores the first two blocks, then the third under the second as parent
    index.apply("a", _stored([901, 902], None, prompt[:8]))
    index.apply("a", _stored([903], 902, prompt[8:12]))
    keys = block_keys(prompt, BS)
    assert len(keys) == 3
    assert index.longest_prefix(keys) == {"a": 3}
    assert index.entries("a") == {901: keys[0], 902: keys[1], 903: keys[2]}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 2**32 - 1), min_size=BS, max_size=8 * BS),
    st.integers(0, 8 * BS - 1),
    st.integers(0, 2**32 - 1),
)
def test_a_key_names_its_whole_prefix(tokens: list[int], at: int, value: int) -> None:
    keys = block_keys(tokens, BS)
    assert len(keys) == len(tokens) // BS
    assert block_keys(tokens[: len(keys) // 2 * BS], BS) == keys[: len(keys) // 2]
    if at >= len(tokens) or tokens[at] == value:
        return
    changed = [*tokens[:at], value, *tokens[at + 1 :]]
    other = block_keys(changed, BS)
    block = at // BS
    assert other[:block] == keys[:block]  # blocks before the change keep their keys
    assert all(a != b for a, b in zip(other[block:], keys[block:], strict=True))


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block size"):
        block_keys([1, 2], 0)


def test_longest_prefix_counts_leading_blocks_per_endpoint() -> None:
    index = PreciseIndex(default_capacity=100)
    tokens = list(range(16))
    index.apply("a", _stored([1, 2, 3, 4], None, tokens))
    index.apply("b", _stored([7, 8], None, tokens[:8]))
    other = [99, 98, 97, 96]
    index.apply("c", _stored([5], None, other))
    keys = block_keys(tokens, BS)
    assert index.longest_prefix(keys) == {"a": 4, "b": 2}
    index.apply("a", BlockRemoved((2,)))  # a hole: a holds blocks 1, 3, 4 → prefix of 1
    assert index.longest_prefix(keys) == {"a": 1, "b": 2}
    assert index.longest_prefix(block_keys(other + tokens, BS)) == {"c": 1}
    assert index.longest_prefix([]) == {}


def test_extra_identity_changes_the_chain() -> None:
    index = PreciseIndex(default_capacity=100)
    tokens = list(range(8))
    salt = extra_key_bytes(("sql-lora", "tenant-1"))
    lora = extra_key_bytes(("sql-lora",))
    index.apply("a", _stored([1, 2], None, tokens, extra_keys=(salt, lora), lora_name="sql-lora"))
    index.apply("b", _stored([1, 2], None, tokens))
    index.apply("c", _stored([1, 2], None, tokens, lora_name="sql-lora"))  # no extra_keys sent
    assert index.longest_prefix(block_keys(tokens, BS)) == {"b": 2}
    assert index.longest_prefix(block_keys(tokens, BS, [salt, lora])) == {"a": 2}
    assert index.longest_prefix(block_keys(tokens, BS, [lora, lora])) == {"c": 2}


def test_remove_clear_and_endpoint_leaving() -> None:
    index = PreciseIndex(default_capacity=100)
    tokens = list(range(8))
    keys = block_keys(tokens, BS)
    for endpoint in ("a", "b"):
        index.apply(endpoint, _stored([1, 2], None, tokens))
    index.apply("a", BlockRemoved((2, 12345)))  # unknown hashes are ignored
    assert index.holders(keys[1]) == {"b"}
    index.apply("b", AllBlocksCleared())
    assert index.holders(keys[0]) == {"a"}
    assert index.size("b") == 0
    index.drop_endpoint("a")
    assert index.holders(keys[0]) == frozenset()
    assert index.endpoints() == ["b"]


def test_orphans_and_other_media_are_not_indexed() -> None:
    index = PreciseIndex(default_capacity=100)
    index.apply("a", _stored([2], 1, list(range(4))))  # parent never seen
    index.apply("a", _stored([3], None, list(range(4)), medium="CPU"))
    index.apply("a", _stored([4], None, list(range(4)), group_idx=1))
    index.apply("a", BlockRemoved((4,), "CPU"))
    assert index.size("a") == 0
    assert index.counters.orphans == 1
    assert index.counters.ignored == 3


@pytest.mark.parametrize(
    "event",
    [
        BlockStored((1,), None, [1, 2, 3], BS),  # 3 tokens for a block of 4
        BlockStored((1,), None, [], 0),  # block size 0
        BlockStored((1, 2), None, list(range(8)), BS, extra_keys=(None,)),  # one extra for two
        BlockStored((1,), None, [1, 2, -3, 4], BS),  # a token id uint32 cannot hold
    ],
)
def test_malformed_stores_are_counted_not_indexed(event: BlockStored) -> None:
    index = PreciseIndex(default_capacity=100)
    index.apply("a", event)
    assert index.size("a") == 0
    assert index.counters.invalid == len(event.block_hashes)


def test_a_hash_stored_twice_stays_until_both_copies_are_removed() -> None:
    # vLLM caches two physical blocks under one hash when two requests compute the same
    # prefix at once, and removes each when it is evicted
    index = PreciseIndex(default_capacity=100)
    tokens = list(range(4))
    index.apply("a", _stored([1], None, tokens))
    index.apply("a", _stored([1], None, tokens))
    keys = block_keys(tokens, BS)
    index.apply("a", BlockRemoved((1,)))
    assert index.longest_prefix(keys) == {"a": 1}
    index.apply("a", BlockRemoved((1,)))
    assert index.longest_prefix(keys) == {}
    index.apply("a", BlockRemoved((1,)))  # one removal too many is harmless
    assert index.size("a") == 0


def test_capacity_evicts_the_oldest() -> None:
    index = PreciseIndex(default_capacity=3)
    tokens = list(range(20))
    index.apply("a", _stored([1, 2, 3, 4, 5], None, tokens))
    assert list(index.entries("a")) == [3, 4, 5]
    assert index.counters.evictions == 2
    keys = block_keys(tokens, BS)
    assert index.holders(keys[0]) == frozenset()
    index.set_capacity("a", 1)
    assert list(index.entries("a")) == [5]
    with pytest.raises(ValueError, match="capacity"):
        index.set_capacity("a", 0)


def test_same_content_under_two_hashes_is_released_once_both_go() -> None:
    index = PreciseIndex(default_capacity=10)
    index.apply("a", _stored([1], None, [1, 2, 3, 4]))
    index.apply("a", _stored([2], None, [1, 2, 3, 4]))
    key = block_key(ROOT_KEY, [1, 2, 3, 4])
    index.apply("a", BlockRemoved((1,)))
    assert index.holders(key) == {"a"}
    index.apply("a", BlockRemoved((2,)))
    assert index.holders(key) == frozenset()


def test_event_storm_stays_within_the_bound() -> None:
    """1,000,000 store/remove events over 4 endpoints with capacity 2,000 each."""
    capacity = 2_000
    index = PreciseIndex(default_capacity=capacity)
    rng = random.Random(7)
    endpoints = ["a", "b", "c", "d"]
    next_hash = dict.fromkeys(endpoints, 0)
    for i in range(1_000_000):
        endpoint = endpoints[i % 4]
        if rng.random() < 0.6:
            h = next_hash[endpoint] = next_hash[endpoint] + 1
            # a fresh prefix of one block: 1,000 distinct contents shared across endpoints
            index.apply(endpoint, _stored([h], None, [rng.randrange(1000)] * BS))
        else:
            index.apply(endpoint, BlockRemoved((rng.randrange(max(1, next_hash[endpoint])),)))
        if i % 100_000 == 0:
            assert all(index.size(e) <= capacity for e in endpoints)
    assert all(index.size(e) <= capacity for e in endpoints)
    assert index.counters.evictions > 0
    held = sum(
        len(index.holders(k)) for k in {k for e in endpoints for k in index.entries(e).values()}
    )
    assert held <= 4 * capacity


# -- property: the index equals a naive model -------------------------------------------------

_event = st.one_of(
    st.tuples(
        st.just("store"),
        st.sampled_from("ab"),
        st.lists(st.integers(0, 12), min_size=1, max_size=3),  # vLLM hashes
        st.one_of(st.none(), st.integers(0, 12)),  # parent hash
        st.integers(0, 2),  # content seed: few contents, so endpoints share blocks
    ),
    st.tuples(st.just("remove"), st.sampled_from("ab"), st.lists(st.integers(0, 12), max_size=3)),
    st.tuples(st.just("clear"), st.sampled_from("ab")),
    st.tuples(st.just("leave"), st.sampled_from("ab")),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_event, max_size=40), st.sampled_from([3, 10_000]))
def test_index_equals_a_naive_model(events: list[tuple[object, ...]], capacity: int) -> None:
    """Any sequence of stores, removes, clears and departures; with a capacity that evicts
    (3 blocks) or never does."""
    index = PreciseIndex(default_capacity=capacity)
    model: dict[str, dict[int, int]] = {}  # endpoint → vLLM hash → our key
    copies: dict[tuple[str, int], int] = {}  # (endpoint, vLLM hash) → physical copies
    for event in events:
        kind, endpoint = event[0], str(event[1])
        held = model.setdefault(endpoint, {})
        if kind == "store":
            hashes, parent, seed = event[2], event[3], event[4]
            assert isinstance(hashes, list)
            assert isinstance(seed, int)
            tokens = [seed * 10 + j for j in range(BS * len(hashes))]
            index.apply(endpoint, _stored(hashes, parent, tokens))  # type: ignore[arg-type]
            if parent is not None and parent not in held:
                continue
            key = ROOT_KEY if parent is None else held[parent]  # type: ignore[index]
            for i, h in enumerate(hashes):
                key = block_key(key, tokens[i * BS : (i + 1) * BS])
                same = held.get(h) == key
                copies[endpoint, h] = copies.get((endpoint, h), 0) + 1 if same else 1
                held.pop(h, None)  # a re-store moves it to the end, like the index
                held[h] = key
                if len(held) > capacity:  # the oldest goes, with all its copies
                    oldest = next(iter(held))
                    del held[oldest]
                    copies.pop((endpoint, oldest), None)
        elif kind == "remove":
            assert isinstance(event[2], list)
            index.apply(endpoint, BlockRemoved(tuple(event[2])))
            for h in event[2]:
                left = copies.get((endpoint, h), 0) - 1
                if left > 0:
                    copies[endpoint, h] = left
                else:
                    copies.pop((endpoint, h), None)
                    held.pop(h, None)
        else:
            if kind == "clear":
                index.apply(endpoint, AllBlocksCleared())
            else:
                index.drop_endpoint(endpoint)
            held.clear()
            for pair in [p for p in copies if p[0] == endpoint]:
                del copies[pair]
    for endpoint in "ab":
        assert index.entries(endpoint) == model.get(endpoint, {})
    every_key = {k for held in model.values() for k in held.values()}
    for key in every_key:
        assert index.holders(key) == {e for e, held in model.items() if key in held.values()}
    assert index.keys_held() == len(every_key)  # nothing left behind


# -- cost report (the figures in index.py's docstring) --------------------------------------


def test_cost_report() -> None:
    n = 100_000
    tokens = list(range(16))
    events = [_stored([i], None, [i, i + 1, i + 2, i + 3]) for i in range(n)]
    tracemalloc.start()
    index = PreciseIndex(default_capacity=n)
    before = tracemalloc.get_traced_memory()[0]
    for e in events:
        index.apply("a", e)
    one = tracemalloc.get_traced_memory()[0] - before
    for e in events:
        index.apply("b", e)
    two = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    first_bytes, more_bytes = one / n, (two - one) / n

    lookup = PreciseIndex(default_capacity=10_000)
    prompt = [t % 1000 for t in range(64 * BS)] + tokens
    for j in range(8):
        lookup.apply(f"e{j}", _stored(list(range(64)), None, prompt[: 64 * BS]))
    keys = block_keys(prompt, BS)
    reps = 2000
    start = time.perf_counter()
    for _ in range(reps):
        matched = lookup.longest_prefix(keys)
    lookup_us = (time.perf_counter() - start) / reps * 1e6
    assert matched == {f"e{j}": 64 for j in range(8)}
    print(
        f"\nper entry: {first_bytes:.0f} B first endpoint, {more_bytes:.0f} B each further;"
        f" longest_prefix 64 blocks × 8 endpoints: {lookup_us:.1f} µs"
    )
    assert first_bytes < 1000
    assert lookup_us < 1000
