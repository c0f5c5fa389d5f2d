"""The prefix index and the approximate prefix-cache producer and scorer."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from sluicegate.framework import PREFIX_MATCH, CycleState, ProfileResult, SchedulingResult
from sluicegate.scheduling.prefix_index import PrefixIndex

BLOCK_CHARS = 64 * 4
"""Characters (ASCII bytes) in one 64-token block of the built-in tokenizer."""


def _text(seed: int, blocks: float) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij ") for _ in range(int(blocks * BLOCK_CHARS)))


# --------------------------------------------------------------------------- index


def test_match_is_greedy_longest_prefix() -> None:
    index = PrefixIndex(100)
    index.insert("a", [1, 2, 3])
    index.insert("b", [1, 2])
    index.insert("c", [1, 9])
    index.insert("e", [2, 3])  # holds later blocks but not the first
    matched = index.match([1, 2, 3, 4], ["a", "b", "c", "d", "e"])
    assert matched == {"a": 3, "b": 2, "c": 1, "d": 0, "e": 0}


def test_match_only_reports_given_endpoints() -> None:
    index = PrefixIndex(100)
    index.insert("a", [1, 2])
    index.insert("b", [1, 2])
    assert index.match([1, 2], ["b"]) == {"b": 2}
    assert index.match([1, 2], []) == {}
    assert index.match([], ["a", "b"]) == {"a": 0, "b": 0}


def test_shared_hashes_counted_once() -> None:
    index = PrefixIndex(100)
    index.insert("a", [1, 2, 3])
    index.insert("b", [1, 2, 4])
    assert len(index) == 6
    assert index.distinct_hashes == 4


def test_lru_bound_per_endpoint() -> None:
    rng = random.Random(1)
    index = PrefixIndex(100)
    for i in range(3000):
        chain = [rng.getrandbits(64) for _ in range(rng.randint(1, 40))]
        index.insert(f"ep-{i % 3}", chain)
        assert len(index) <= 300
        assert index.distinct_hashes <= 300
    assert [index.endpoint_size(f"ep-{i}") for i in range(3)] == [100, 100, 100]
    assert index.distinct_hashes == 300  # random hashes are not shared


def test_capacity_argument_overrides_default() -> None:
    index = PrefixIndex(100)
    index.insert("a", list(range(50)), capacity=10)
    assert index.endpoint_size("a") == 10
    index.insert("b", list(range(50)), capacity=0)  # not positive: default
    assert index.endpoint_size("b") == 50


def test_eviction_keeps_the_head_of_a_chain() -> None:
    index = PrefixIndex(8)
    chain = list(range(100, 120))
    index.insert("a", chain)
    assert index.endpoint_size("a") == 8
    assert index.match(chain, ["a"]) == {"a": 8}


def test_reinsert_refreshes_recency() -> None:
    index = PrefixIndex(5)
    index.insert("a", [1, 2, 3, 4, 5])  # LRU → MRU: 5, 4, 3, 2, 1
    index.insert("a", [5])  # 4, 3, 2, 1, 5
    index.insert("a", [6])  # evicts 4
    assert index.match([1, 2, 3, 4], ["a"]) == {"a": 3}
    assert index.match([5], ["a"]) == {"a": 1}
    assert index.endpoint_size("a") == 5


def test_distance_counts_blocks_recorded_since() -> None:
    index = PrefixIndex(100)
    index.insert("a", [1, 2, 3])  # recorded tail first: 3, 2, 1
    assert [index.distance("a", h) for h in (1, 2, 3)] == [0, 1, 2]
    index.insert("a", [7, 8])
    index.insert("b", [9])  # another endpoint's blocks do not count
    assert index.distance("a", 3) == 4
    index.insert("a", [7, 8])  # sent again: counts (the server allocates for its output)
    assert index.distance("a", 3) == 6
    assert index.distance("a", 7) == 0
    index.insert("a", [1, 2, 3])  # sent again: recent again
    assert index.distance("a", 3) == 2
    assert index.distance("a", 42) is None
    assert index.distance("c", 1) is None
    index.remove_endpoint("a")
    assert index.distance("a", 1) is None
    index.insert("a", [5])  # a new life starts counting afresh
    assert index.distance("a", 5) == 0


def test_remove_endpoint() -> None:
    index = PrefixIndex(100)
    index.insert("a", [1, 2, 3])
    index.insert("b", [1, 2])
    index.remove_endpoint("a")
    assert index.endpoint_size("a") == 0
    assert len(index) == 2
    assert index.distinct_hashes == 2
    assert index.match([1, 2, 3], ["a", "b"]) == {"a": 0, "b": 2}
    index.remove_endpoint("a")  # unknown: no error
    index.remove_endpoint("b")
    assert len(index) == 0
    assert index.distinct_hashes == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PrefixIndex(0)


# --------------------------------------------------------------------------- producer + scorer

Schedule = Callable[..., list[float]]


@pytest.fixture
def endpoints(make_endpoint: Any) -> list[Any]:
    return [make_endpoint(0), make_endpoint(1), make_endpoint(2)]


def _scheduler(producer: Any, scorer: Any, endpoints: list[Any], make_request: Any) -> Schedule:
    def schedule(prompt: str, target: int = 0, **fields: Any) -> list[float]:
        """Scores of ``prompt`` on ``endpoints``; then records it for ``endpoints[target]``."""
        request = make_request(prompt, **fields)
        state = CycleState()
        producer.produce(request, state, endpoints)
        scores: list[float] = scorer.score(request, state, endpoints)
        result = SchedulingResult({"p": ProfileResult([endpoints[target]])}, "p")
        producer.pre_request(request, state, result)
        return scores

    return schedule


@pytest.fixture
def producer(make_plugin: Any) -> Any:
    return make_plugin("approx-prefix-cache-producer")


@pytest.fixture
def schedule(producer: Any, make_plugin: Any, endpoints: list[Any], make_request: Any) -> Schedule:
    return _scheduler(producer, make_plugin("prefix-cache-scorer"), endpoints, make_request)


def test_repeated_prompt_scores_one_on_its_endpoint(schedule: Schedule) -> None:
    prompt = _text(0, 4)
    assert schedule(prompt, target=1) == [0.0, 0.0, 0.0]
    assert schedule(prompt, target=1) == [0.0, 1.0, 0.0]


def test_partial_sharing_scores_the_shared_fraction(schedule: Schedule) -> None:
    prompt = _text(0, 4)
    schedule(prompt, target=0)
    shared_half = prompt[: 2 * BLOCK_CHARS] + _text(1, 2)
    assert schedule(shared_half) == pytest.approx([0.5, 0.0, 0.0])
    # A trailing partial block is hashed too: 4 of 5 blocks are shared.
    assert schedule(prompt + "tail") == pytest.approx([0.8, 0.0, 0.0])


def test_unrelated_and_empty_prompts_score_zero(schedule: Schedule, producer: Any) -> None:
    schedule(_text(0, 4), target=0)
    assert schedule(_text(5, 4)) == [0.0, 0.0, 0.0]
    size = len(producer.index)
    assert schedule("") == [0.0, 0.0, 0.0]
    assert len(producer.index) == size  # nothing recorded for an empty prompt


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"cache_salt": "alice"}, {"cache_salt": "bob"}),
        ({"target_model": "m1"}, {"target_model": "m2"}),
        ({"target_model": "base"}, {"target_model": "sql-lora", "is_adapter": True}),
    ],
)
def test_salt_and_model_separate_hashes(
    first: dict[str, Any], second: dict[str, Any], schedule: Schedule
) -> None:
    prompt = _text(0, 3)
    schedule(prompt, target=2, **first)
    assert schedule(prompt, target=0, **second) == [0.0, 0.0, 0.0]
    assert schedule(prompt, target=0, **first) == [0.0, 0.0, 1.0]


def test_forget_endpoint_drops_its_blocks(
    schedule: Schedule, producer: Any, endpoints: Any
) -> None:
    prompt = _text(0, 2)
    schedule(prompt, target=0)
    producer.forget_endpoint(endpoints[0])
    assert schedule(prompt, target=1) == [0.0, 0.0, 0.0]
    assert producer.index.endpoint_size("ep-0") == 0


def test_reuse_distance_is_the_prompt_tokens_sent_since(
    producer: Any, schedule: Schedule, endpoints: list[Any], make_request: Any
) -> None:
    prompt = _text(0, 3)
    schedule(prompt, target=0)
    schedule(_text(1, 2), target=0)  # 2 more blocks (128 tokens) to the same endpoint
    schedule(_text(2, 5), target=1)  # elsewhere: does not count
    state = CycleState()
    producer.produce(make_request(prompt), state, endpoints)
    match = state.get(PREFIX_MATCH)
    # The deepest matched block went first of its 3 (tail first), then 2 others came.
    assert match.reuse_distance_tokens("ep-0") == (2 + 2) * 64
    assert match.reuse_distance_tokens("ep-1") is None  # nothing of it there
    assert match.reuse_distance_tokens("ep-2") is None


def test_auto_tune_sizes_memory_from_kv_capacity(
    make_plugin: Any, make_endpoint: Any, make_request: Any
) -> None:
    # 16-token KV blocks × 32 = 512 tokens = 8 blocks of 64 tokens.
    endpoints = [make_endpoint(0, block_size=16, num_gpu_blocks=32), make_endpoint(1)]
    producer = make_plugin("approx-prefix-cache-producer")
    assert producer.capacity_blocks(endpoints[0]) == 8
    assert producer.capacity_blocks(endpoints[1]) is None
    schedule = _scheduler(producer, make_plugin("prefix-cache-scorer"), endpoints, make_request)
    prompt = _text(0, 20)
    schedule(prompt, target=0)
    schedule(prompt, target=1)
    assert producer.index.endpoint_size("ep-0") == 8
    assert producer.index.endpoint_size("ep-1") == 20  # default capacity (7812 blocks)
    assert schedule(prompt) == pytest.approx([8 / 20, 1.0])


def test_auto_tune_off_and_lru_capacity(make_plugin: Any, make_endpoint: Any) -> None:
    ep = make_endpoint(0, block_size=16, num_gpu_blocks=32)
    producer = make_plugin("approx-prefix-cache-producer", autoTune=False)
    assert producer.capacity_blocks(ep) is None
    assert producer.index.default_capacity == 31_250 * 16 // 64
    small = make_plugin(
        "approx-prefix-cache-producer", lruCapacityPerServer=160, blockSizeTokens=32
    )
    assert small.index.default_capacity == 80  # 160 sixteen-token blocks = 80 of 32 tokens


def test_max_prefix_tokens_caps_the_blocks(
    make_plugin: Any, endpoints: list[Any], make_request: Any
) -> None:
    producer = make_plugin("approx-prefix-cache-producer", maxPrefixTokensToMatch=128)
    request = make_request(_text(0, 4))
    state = CycleState()
    producer.produce(request, state, endpoints)
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.total_blocks == 2
    assert match.matched_blocks == {"ep-0": 0, "ep-1": 0, "ep-2": 0}


def test_match_length_weight(make_plugin: Any, endpoints: list[Any], make_request: Any) -> None:
    producer = make_plugin("approx-prefix-cache-producer")
    scorer = make_plugin("prefix-cache-scorer", matchLengthWeight=0.5, matchLengthScaleTokens=256)
    schedule = _scheduler(producer, scorer, endpoints, make_request)
    prompt = _text(0, 4)
    schedule(prompt, target=0)
    # 2 of 4 blocks (128 tokens) shared: 0.5 · min(1, 128/256)² + 0.5 · 2/4.
    assert schedule(prompt[: 2 * BLOCK_CHARS] + _text(1, 2)) == pytest.approx([0.375, 0.0, 0.0])
    assert schedule(prompt) == pytest.approx([1.0, 0.0, 0.0])


def test_scorer_without_producer_output_scores_zero(
    make_plugin: Any, endpoints: list[Any], make_request: Any
) -> None:
    scorer = make_plugin("prefix-cache-scorer")
    assert scorer.score(make_request("x" * 1000), CycleState(), endpoints) == [0.0, 0.0, 0.0]
