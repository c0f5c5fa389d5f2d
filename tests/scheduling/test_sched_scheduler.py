"""The scheduler end to end: filters → weighted scorers → picker, and whole configurations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.builtins import default_registry
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    RESPONSE_HEADERS,
    CycleState,
    Filter,
    LLMRequest,
    PluginContext,
    SchedulingError,
    Scorer,
)
from sluicegate.scheduling.config import build_scheduler
from sluicegate.scheduling.plugins.session_affinity_scorer import (
    SESSION_HEADER,
    encode_session_token,
)
from sluicegate.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

REGISTRY = default_registry()


class FixedScorer(Scorer):
    """Returns preset scores (test double)."""

    def __init__(self, ctx: PluginContext, scores: Sequence[float]) -> None:
        super().__init__("fixed", ctx)
        self.scores = list(scores)
        self.seen: list[str] = []

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        self.seen = [e.name for e in endpoints]
        return self.scores[: len(endpoints)]


class KeepFilter(Filter):
    """Keeps the endpoints whose names are listed (test double)."""

    def __init__(self, ctx: PluginContext, keep: set[str]) -> None:
        super().__init__("keep", ctx)
        self.keep = keep

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        return [e for e in endpoints if e.name in self.keep]


def _scheduler(ctx: PluginContext, profile: SchedulerProfile, make_plugin: Any) -> Scheduler:
    return Scheduler(make_plugin("single-profile-handler"), {profile.name: profile})


def test_combined_score_is_weighted_sum_of_clamped_scores(
    ctx: PluginContext, make_plugin: Any, make_endpoint: Any, make_request: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    a = FixedScorer(ctx, [1.5, -0.5, 0.5])
    b = FixedScorer(ctx, [0.25, 1.0, 0.0])
    profile = SchedulerProfile(
        "p", make_plugin("max-score-picker"), [], [WeightedScorer(a, 2.0), WeightedScorer(b, 3.0)]
    )
    result = _scheduler(ctx, profile, make_plugin).schedule(make_request(), CycleState(), endpoints)
    scores = result.profile_results["p"].scores
    assert scores == pytest.approx({"ep-0": 2.75, "ep-1": 3.0, "ep-2": 1.0})
    assert result.targets == [endpoints[1]]
    assert result.primary_profile == "p"


def test_filters_narrow_the_candidates(
    ctx: PluginContext, make_plugin: Any, make_endpoint: Any, make_request: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(4)]
    scorer = FixedScorer(ctx, [0.1, 0.9])
    profile = SchedulerProfile(
        "p",
        make_plugin("max-score-picker"),
        [KeepFilter(ctx, {"ep-0", "ep-2", "ep-3"}), KeepFilter(ctx, {"ep-2", "ep-3"})],
        [WeightedScorer(scorer, 1.0)],
    )
    result = _scheduler(ctx, profile, make_plugin).schedule(make_request(), CycleState(), endpoints)
    assert scorer.seen == ["ep-2", "ep-3"]
    assert result.targets == [endpoints[3]]


def test_filters_emptying_raise(
    ctx: PluginContext, make_plugin: Any, make_endpoint: Any, make_request: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(2)]
    scorer = FixedScorer(ctx, [1.0, 1.0])
    profile = SchedulerProfile(
        "p",
        make_plugin("max-score-picker"),
        [KeepFilter(ctx, set())],
        [WeightedScorer(scorer, 1.0)],
    )
    with pytest.raises(SchedulingError, match="filtered out"):
        _scheduler(ctx, profile, make_plugin).schedule(make_request(), CycleState(), endpoints)
    assert scorer.seen == []  # scoring never ran


def test_no_candidates_raise(ctx: PluginContext, make_plugin: Any, make_request: Any) -> None:
    profile = SchedulerProfile("p", make_plugin("max-score-picker"))
    with pytest.raises(SchedulingError, match="no candidate"):
        _scheduler(ctx, profile, make_plugin).schedule(make_request(), CycleState(), [])


def _build(ctx: PluginContext, plugins: list[dict[str, Any]], refs: list[dict[str, Any]]) -> Any:
    config = EndpointPickerConfig.model_validate(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": plugins,
            "schedulingProfiles": [{"name": "default", "plugins": refs}],
        }
    )
    return build_scheduler(config, ctx, REGISTRY).scheduler


def _run(scheduler: Scheduler, request: LLMRequest, endpoints: list[Endpoint]) -> Any:
    state = CycleState()
    scheduler.prepare(request, state, endpoints)
    result = scheduler.schedule(request, state, endpoints)
    scheduler.notify_pre_request(request, state, result)
    return result, state


def test_default_preset_prefers_idle_then_sticks_to_cached_prefix(
    ctx: PluginContext, make_endpoint: Any, make_request: Any
) -> None:
    scheduler = build_scheduler(None, ctx, REGISTRY).scheduler
    endpoints = [
        make_endpoint(0, waiting=4, kv_usage=0.6),
        make_endpoint(1, waiting=0, kv_usage=0.1),
        make_endpoint(2, waiting=2, kv_usage=0.3),
    ]
    prompt = "You are a helpful assistant. " * 60
    first, _ = _run(scheduler, make_request(prompt), endpoints)
    assert first.targets == [endpoints[1]]
    # ep-1 becomes busier than ep-2, but the cached prefix (weight 3) keeps the request there.
    endpoints[1] = make_endpoint(1, waiting=3, kv_usage=0.3)
    endpoints[2] = make_endpoint(2, waiting=2, kv_usage=0.3)
    second, _ = _run(scheduler, make_request(prompt + "Question 2?"), endpoints)
    assert second.targets[0].name == "ep-1"
    scores = second.profile_results["default"].scores
    # queue 2·0.5 + kv 2·0.7 + prefix 3·6/7 (the trailing partial block differs) vs 2·1 + 2·0.7
    assert scores == pytest.approx({"ep-0": 0.8, "ep-1": 1.0 + 1.4 + 18 / 7, "ep-2": 3.4})


def test_session_affinity_end_to_end(
    ctx: PluginContext, make_endpoint: Any, make_request: Any
) -> None:
    scheduler = _build(
        ctx,
        [{"type": "session-affinity-scorer"}, {"type": "queue-scorer"}],
        [{"pluginRef": "session-affinity-scorer", "weight": 10}, {"pluginRef": "queue-scorer"}],
    )
    endpoints = [make_endpoint(0, waiting=0), make_endpoint(1, waiting=3), make_endpoint(2)]
    first, state = _run(scheduler, make_request(), endpoints)
    headers = state.get(RESPONSE_HEADERS)
    assert headers is not None
    assert headers[SESSION_HEADER] == encode_session_token(first.targets[0].name)
    # The session's next request carries the token and returns even to a busier endpoint.
    pinned = make_request(headers={SESSION_HEADER: encode_session_token("ep-1")})
    second, state = _run(scheduler, pinned, endpoints)
    assert second.targets == [endpoints[1]]
    assert state.get(RESPONSE_HEADERS) == {SESSION_HEADER: encode_session_token("ep-1")}


def test_weighted_random_over_combined_scores(
    ctx: PluginContext, make_endpoint: Any, make_request: Any
) -> None:
    scheduler = _build(
        ctx,
        [{"type": "kv-cache-utilization-scorer"}, {"type": "weighted-random-picker"}],
        [{"pluginRef": "kv-cache-utilization-scorer"}, {"pluginRef": "weighted-random-picker"}],
    )
    endpoints = [make_endpoint(0, kv_usage=0.75), make_endpoint(1, kv_usage=0.25)]
    endpoints.append(make_endpoint(2, kv_usage=1.0))
    counts = {"ep-0": 0, "ep-1": 0, "ep-2": 0}
    for _ in range(8000):
        result = scheduler.schedule(make_request(), CycleState(), endpoints)
        counts[result.targets[0].name] += 1
    assert counts["ep-2"] == 0
    assert counts["ep-1"] / 8000 == pytest.approx(0.75, abs=0.02)
