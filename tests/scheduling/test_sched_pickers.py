"""Unit tests of the built-in pickers: choices, distributions, tie-breaks, determinism."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.framework import CycleState, LLMRequest, PluginConfigError, PluginContext

REGISTRY = default_registry()

PICKERS = [
    "max-score-picker",
    "random-picker",
    "weighted-random-picker",
    "round-robin",
    "least-request",
]
DRAWS = 20_000


def _pick_many(picker: Any, candidates: list[Any], n: int = DRAWS) -> Counter[str]:
    request, state = LLMRequest("r", "base", "base", b"", 0, 0.0), CycleState()
    counts: Counter[str] = Counter()
    for _ in range(n):
        (chosen,) = picker.pick(request, state, candidates)
        counts[chosen.name] += 1
    return counts


def _seeded(type_name: str, seed: int, **parameters: Any) -> Any:
    context = PluginContext(clock=ManualClock(), seed=seed)
    return REGISTRY.create(type_name, type_name, parameters, context)


# --------------------------------------------------------------------------- all pickers


@pytest.mark.parametrize("type_name", PICKERS)
def test_empty_candidates_pick_nothing(type_name: str, make_plugin: Any, make_request: Any) -> None:
    assert make_plugin(type_name).pick(make_request(), CycleState(), []) == []
    assert make_plugin(type_name, maxNumOfEndpoints=3).pick(make_request(), CycleState(), []) == []


@pytest.mark.parametrize("type_name", PICKERS)
@pytest.mark.parametrize("score", [0.0, 2.5, -1.0])
def test_single_candidate_is_picked(
    type_name: str,
    score: float,
    make_plugin: Any,
    make_endpoint: Any,
    make_request: Any,
    make_scored: Any,
) -> None:
    ep = make_endpoint(0)
    assert make_plugin(type_name).pick(
        make_request(), CycleState(), make_scored([ep], [score])
    ) == [ep]


@pytest.mark.parametrize("type_name", PICKERS)
@pytest.mark.parametrize("k", [2, 3, 10])
def test_k_distinct_endpoints(
    type_name: str,
    k: int,
    make_plugin: Any,
    make_endpoint: Any,
    make_request: Any,
    make_scored: Any,
) -> None:
    endpoints = [make_endpoint(i) for i in range(5)]
    picker = make_plugin(type_name, maxNumOfEndpoints=k)
    for _ in range(50):
        chosen = picker.pick(
            make_request(), CycleState(), make_scored(endpoints, [1.0, 0.0, 2.0, 0.5, 0.0])
        )
        assert len(chosen) == min(k, 5)
        assert len({e.name for e in chosen}) == len(chosen)


@pytest.mark.parametrize("type_name", PICKERS)
def test_same_seed_same_choices(
    type_name: str, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(6)]
    candidates = make_scored(endpoints, [1.0, 1.0, 0.5, 2.0, 2.0, 0.0])

    def run(seed: int) -> list[str]:
        picker = _seeded(type_name, seed)
        return [picker.pick(make_request(), CycleState(), candidates)[0].name for _ in range(200)]

    assert run(7) == run(7)


@pytest.mark.parametrize("type_name", PICKERS)
def test_rejects_zero_endpoints_parameter(type_name: str, make_plugin: Any) -> None:
    with pytest.raises(PluginConfigError, match="maxNumOfEndpoints"):
        make_plugin(type_name, maxNumOfEndpoints=0)


# --------------------------------------------------------------------------- max score


def test_max_score_picks_best_and_breaks_ties_at_random(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(4)]
    picker = make_plugin("max-score-picker")
    counts = _pick_many(picker, make_scored(endpoints, [1.0, 3.0, 3.0, 2.0]), 4000)
    assert set(counts) == {"ep-1", "ep-2"}
    assert counts["ep-1"] == pytest.approx(2000, abs=200)
    # Three equal best scores, not side by side: each wins about a third of the time.
    five = [make_endpoint(i) for i in range(5)]
    counts = _pick_many(picker, make_scored(five, [3.0, 1.0, 3.0, 2.0, 3.0]), 6000)
    assert set(counts) == {"ep-0", "ep-2", "ep-4"}
    assert all(c == pytest.approx(2000, abs=200) for c in counts.values()), counts
    assert picker.pick(make_request(), CycleState(), []) == []
    ordered = make_plugin("max-score-picker", maxNumOfEndpoints=4)
    chosen = ordered.pick(
        make_request(), CycleState(), make_scored(endpoints, [1.0, 4.0, 3.0, 2.0])
    )
    assert [e.name for e in chosen] == ["ep-1", "ep-2", "ep-3", "ep-0"]


# --------------------------------------------------------------------------- random


def test_random_picker_is_uniform(make_plugin: Any, make_endpoint: Any, make_scored: Any) -> None:
    endpoints = [make_endpoint(i) for i in range(4)]
    counts = _pick_many(make_plugin("random-picker"), make_scored(endpoints, [9.0, 0.0, 0.0, 0.0]))
    assert set(counts) == {"ep-0", "ep-1", "ep-2", "ep-3"}
    for n in counts.values():
        assert n / DRAWS == pytest.approx(0.25, abs=0.015)


def test_random_picker_sample_covers_all_orders(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    picker = make_plugin("random-picker", maxNumOfEndpoints=3)
    seen = {
        tuple(e.name for e in picker.pick(make_request(), CycleState(), make_scored(endpoints)))
        for _ in range(300)
    }
    assert len(seen) == 6  # every permutation of three


# --------------------------------------------------------------------------- weighted random


def test_weighted_random_proportional_to_scores(
    make_plugin: Any, make_endpoint: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(5)]
    weights = [1.0, 2.0, 3.0, 4.0, 0.0]
    counts = _pick_many(make_plugin("weighted-random-picker"), make_scored(endpoints, weights))
    assert "ep-4" not in counts  # score 0 is never chosen while some score is positive
    for i, w in enumerate(weights[:4]):
        assert counts[f"ep-{i}"] / DRAWS == pytest.approx(w / 10.0, abs=0.015)


def test_weighted_random_non_positive_scores_delegate_to_uniform(
    make_plugin: Any, make_endpoint: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    counts = _pick_many(
        make_plugin("weighted-random-picker"), make_scored(endpoints, [0.0, -1.0, 0.0]), 6000
    )
    for i in range(3):
        assert counts[f"ep-{i}"] / 6000 == pytest.approx(1 / 3, abs=0.03)


def test_weighted_random_negative_score_never_chosen(
    make_plugin: Any, make_endpoint: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    counts = _pick_many(
        make_plugin("weighted-random-picker"), make_scored(endpoints, [-5.0, 0.1, 0.0]), 500
    )
    assert counts == {"ep-1": 500}


def test_weighted_random_top_k_fills_with_zero_scores_in_order(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(4)]
    picker = make_plugin("weighted-random-picker", maxNumOfEndpoints=3)
    chosen = picker.pick(make_request(), CycleState(), make_scored(endpoints, [0.0, 5.0, 0.0, 0.0]))
    assert [e.name for e in chosen] == ["ep-1", "ep-0", "ep-2"]


def test_weighted_random_top_k_first_place_is_proportional(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    picker = make_plugin("weighted-random-picker", maxNumOfEndpoints=2)
    request, state, candidates = (
        make_request(),
        CycleState(),
        make_scored(endpoints, [1.0, 1.0, 2.0]),
    )
    firsts: Counter[str] = Counter()
    for _ in range(DRAWS):
        first, second = picker.pick(request, state, candidates)
        assert first is not second
        firsts[first.name] += 1
    assert firsts["ep-2"] / DRAWS == pytest.approx(0.5, abs=0.015)


class _ZeroRandom(random.Random):
    """An RNG whose uniform draws are all exactly 0."""

    def random(self) -> float:
        return 0.0


def test_weighted_random_zero_draw_replaced(
    make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    context = PluginContext(clock=ManualClock())
    picker: Any = REGISTRY.create("weighted-random-picker", "w", None, context)
    picker.rng = _ZeroRandom(0)
    endpoints = [make_endpoint(i) for i in range(3)]
    # U = 1e-10 for everyone: key = 1e-10^(1/w) is largest for the largest score.
    chosen = picker.pick(make_request(), CycleState(), make_scored(endpoints, [0.5, 4.0, 1.0]))
    assert chosen == [endpoints[1]]


# --------------------------------------------------------------------------- round robin


def test_round_robin_cycles_by_name(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i, name=n) for i, n in enumerate(["c", "a", "b"])]
    picker = make_plugin("round-robin")
    names = [
        picker.pick(make_request(), CycleState(), make_scored(endpoints))[0].name for _ in range(7)
    ]
    assert names == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_ignores_scores_and_input_order(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    picker = make_plugin("round-robin")
    first = picker.pick(make_request(), CycleState(), make_scored(endpoints, [0.0, 0.0, 9.0]))
    second = picker.pick(
        make_request(), CycleState(), make_scored(endpoints[::-1], [9.0, 0.0, 0.0])
    )
    assert [first[0].name, second[0].name] == ["ep-0", "ep-1"]


def test_round_robin_fallbacks_are_the_next_in_order(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    picker = make_plugin("round-robin", maxNumOfEndpoints=2)
    picks = [
        [e.name for e in picker.pick(make_request(), CycleState(), make_scored(endpoints))]
        for _ in range(4)
    ]
    assert picks == [["ep-0", "ep-1"], ["ep-1", "ep-2"], ["ep-2", "ep-0"], ["ep-0", "ep-1"]]


def test_round_robin_even_split(make_plugin: Any, make_endpoint: Any, make_scored: Any) -> None:
    endpoints = [make_endpoint(i) for i in range(5)]
    counts = _pick_many(make_plugin("round-robin"), make_scored(endpoints), 1000)
    assert counts == {f"ep-{i}": 200 for i in range(5)}


# --------------------------------------------------------------------------- least request


def _loaded(counts: list[int], make_endpoint: Any) -> list[Any]:
    endpoints = [make_endpoint(i) for i in range(len(counts))]
    for ep, n in zip(endpoints, counts, strict=True):
        for _ in range(n):
            ep.inflight.dispatch(10, 10)
    return endpoints


def test_least_request_picks_fewest_in_flight(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = _loaded([3, 1, 2], make_endpoint)
    picker = make_plugin("least-request")
    assert picker.pick(make_request(), CycleState(), make_scored(endpoints, [9.0, 0.0, 0.0])) == [
        endpoints[1]
    ]


def test_least_request_ignores_scraped_metrics(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = [make_endpoint(0, running=0), make_endpoint(1, metrics=None)]
    endpoints[0].inflight.dispatch(1, 1)
    assert make_plugin("least-request").pick(
        make_request(), CycleState(), make_scored(endpoints)
    ) == [endpoints[1]]


def test_least_request_breaks_ties_at_random(
    make_plugin: Any, make_endpoint: Any, make_scored: Any
) -> None:
    endpoints = _loaded([2, 1, 5, 1, 1], make_endpoint)
    counts = _pick_many(make_plugin("least-request"), make_scored(endpoints), 9000)
    assert set(counts) == {"ep-1", "ep-3", "ep-4"}
    for name in ("ep-1", "ep-3", "ep-4"):
        assert counts[name] / 9000 == pytest.approx(1 / 3, abs=0.03)


def test_least_request_top_k_ordered_by_count(
    make_plugin: Any, make_endpoint: Any, make_request: Any, make_scored: Any
) -> None:
    endpoints = _loaded([4, 0, 2, 1], make_endpoint)
    picker = make_plugin("least-request", maxNumOfEndpoints=3)
    chosen = picker.pick(make_request(), CycleState(), make_scored(endpoints))
    assert [e.name for e in chosen] == ["ep-1", "ep-3", "ep-2"]
