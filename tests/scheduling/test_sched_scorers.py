"""Unit tests of the built-in scorers: formula values, ties, missing metrics, bad inputs."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from sluicegate.datalayer.endpoint import EngineMetrics, ServedModels
from sluicegate.framework import (
    RESPONSE_HEADERS,
    CycleState,
    PluginConfigError,
    ProfileResult,
    SchedulingResult,
)
from sluicegate.framework.helpers import min_max_inverse
from sluicegate.scheduling.plugins.session_affinity_scorer import (
    SESSION_HEADER,
    decode_session_token,
    encode_session_token,
)

SCORERS = [
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "running-requests-size-scorer",
    "lora-affinity-scorer",
    "load-aware-scorer",
    "token-load-scorer",
    "active-request-scorer",
    "session-affinity-scorer",
    "prefix-cache-scorer",
]


# --------------------------------------------------------------------------- all scorers


@pytest.mark.parametrize("type_name", SCORERS)
def test_empty_candidates_give_no_scores(
    type_name: str, make_plugin: Any, make_request: Any
) -> None:
    scorer = make_plugin(type_name)
    assert scorer.score(make_request(), CycleState(), []) == []


@pytest.mark.parametrize("type_name", SCORERS)
def test_scores_in_unit_range_and_aligned(
    type_name: str, make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = [
        make_endpoint(0, waiting=5, running=3, kv_usage=0.4),
        make_endpoint(1, metrics=None),
        make_endpoint(2, waiting=500, running=1, kv_usage=1.7),  # out of range
        make_endpoint(3, waiting=-2, running=-1, kv_usage=-0.3),  # out of range
    ]
    endpoints[1].inflight.dispatch(100, 50)
    scorer = make_plugin(type_name)
    scores = scorer.score(make_request("x" * 300, is_adapter=True), CycleState(), endpoints)
    assert len(scores) == len(endpoints)
    assert all(0.0 <= s <= 1.0 for s in scores), scores


def test_min_max_inverse() -> None:
    assert min_max_inverse([]) == []
    assert min_max_inverse([7]) == [1.0]
    assert min_max_inverse([3, 3, 3]) == [1.0, 1.0, 1.0]
    assert min_max_inverse([0, 5, 10]) == [1.0, 0.5, 0.0]


# --------------------------------------------------------------------------- queue


def test_queue_scorer(make_plugin: Any, make_request: Any, make_endpoint: Any) -> None:
    endpoints = [make_endpoint(0, waiting=2), make_endpoint(1, waiting=6), make_endpoint(2)]
    scores = make_plugin("queue-scorer").score(make_request(), CycleState(), endpoints)
    assert scores == pytest.approx([4 / 6, 0.0, 1.0])


# --------------------------------------------------------------------------- kv cache


def test_kv_cache_scorer_formula(make_plugin: Any, make_request: Any, make_endpoint: Any) -> None:
    endpoints = [make_endpoint(0, kv_usage=0.0), make_endpoint(1, kv_usage=0.25)]
    endpoints.append(make_endpoint(2, kv_usage=1.0))
    scores = make_plugin("kv-cache-utilization-scorer").score(
        make_request(), CycleState(), endpoints
    )
    assert scores == pytest.approx([1.0, 0.75, 0.0])


def test_kv_cache_scorer_counts_tokens_since_scrape(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    # 16-token blocks × 100 blocks = 1600 tokens; 400 tokens since the scrape = +0.25.
    ep = make_endpoint(0, kv_usage=0.5, block_size=16, num_gpu_blocks=100)
    ep.inflight.dispatch(400, 10)
    scorer = make_plugin("kv-cache-utilization-scorer")
    assert scorer.score(make_request(), CycleState(), [ep]) == pytest.approx([0.25])
    ep.inflight.scraped()
    assert scorer.score(make_request(), CycleState(), [ep]) == pytest.approx([0.5])


def test_kv_cache_scorer_missing_and_bad_metrics(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = [make_endpoint(0, metrics=None), make_endpoint(1, kv_usage=-0.5)]
    endpoints.append(make_endpoint(2, kv_usage=3.0))
    scores = make_plugin("kv-cache-utilization-scorer").score(
        make_request(), CycleState(), endpoints
    )
    assert scores == [0.0, 1.0, 0.0]


def test_kv_cache_scorer_uses_stale_metrics(
    make_plugin: Any, make_request: Any, make_endpoint: Any, ctx: Any
) -> None:
    ep = make_endpoint(0, kv_usage=0.2)
    ctx.clock.advance(60.0)  # far beyond any staleness bound
    assert ep.is_stale(ctx.clock.now(), 1.0)
    scores = make_plugin("kv-cache-utilization-scorer").score(make_request(), CycleState(), [ep])
    assert scores == pytest.approx([0.8])


# --------------------------------------------------------------------------- running requests


def test_running_requests_scorer(make_plugin: Any, make_request: Any, make_endpoint: Any) -> None:
    endpoints = [
        make_endpoint(0, running=4),
        make_endpoint(1, running=8),
        make_endpoint(2, running=0),
    ]
    scorer = make_plugin("running-requests-size-scorer")
    assert scorer.score(make_request(), CycleState(), endpoints) == pytest.approx([0.5, 0.0, 1.0])


def test_running_requests_scorer_ties_and_single(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    scorer = make_plugin("running-requests-size-scorer")
    tied = [make_endpoint(i, running=3) for i in range(3)]
    assert scorer.score(make_request(), CycleState(), tied) == [1.0, 1.0, 1.0]
    assert scorer.score(make_request(), CycleState(), [make_endpoint(0, running=9)]) == [1.0]


def test_running_requests_scorer_without_metrics_uses_inflight(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    unscraped = make_endpoint(1, metrics=None)
    for _ in range(4):
        unscraped.inflight.dispatch(10, 10)
    endpoints = [make_endpoint(0, running=2), unscraped]
    scorer = make_plugin("running-requests-size-scorer")
    assert scorer.score(make_request(), CycleState(), endpoints) == [1.0, 0.0]


# --------------------------------------------------------------------------- LoRA affinity


def _lora_metrics(running: set[str], waiting: set[str], max_loras: int) -> EngineMetrics:
    return EngineMetrics(
        scraped_at=0.0,
        running_loras=frozenset(running),
        waiting_loras=frozenset(waiting),
        max_loras=max_loras,
    )


def test_lora_affinity_levels(make_plugin: Any, make_request: Any, make_endpoint: Any) -> None:
    endpoints = [
        make_endpoint(0, metrics=_lora_metrics({"sql"}, set(), 2)),  # running → 1.0
        make_endpoint(1, metrics=_lora_metrics({"a"}, set(), 2)),  # free slot → 0.8
        make_endpoint(2, metrics=_lora_metrics({"a"}, {"sql"}, 2)),  # full, waiting → 0.6
        make_endpoint(3, metrics=_lora_metrics({"a", "b"}, set(), 2)),  # full → 0
        make_endpoint(4, metrics=_lora_metrics(set(), set(), 0)),  # no LoRA reported → 0
        make_endpoint(5, metrics=None),  # never scraped → 0
    ]
    request = make_request(target_model="sql", is_adapter=True)
    scores = make_plugin("lora-affinity-scorer").score(request, CycleState(), endpoints)
    assert scores == [1.0, 0.8, 0.6, 0.0, 0.0, 0.0]


def test_lora_affinity_capacity_beats_waiting(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    # Waiting for the adapter but with a free slot: the free-slot rule comes first (0.8).
    ep = make_endpoint(0, metrics=_lora_metrics(set(), {"sql"}, 4))
    request = make_request(target_model="sql", is_adapter=True)
    assert make_plugin("lora-affinity-scorer").score(request, CycleState(), [ep]) == [0.8]


def test_lora_affinity_loaded_idle_adapter_counts_as_running(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    ep = make_endpoint(0, metrics=_lora_metrics({"a", "b"}, set(), 2))
    ep.models = ServedModels(frozenset({"base"}), frozenset({"sql"}), fetched_at=0.0)
    request = make_request(target_model="sql", is_adapter=True)
    assert make_plugin("lora-affinity-scorer").score(request, CycleState(), [ep]) == [1.0]


def test_lora_affinity_neutral_for_base_model(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = [make_endpoint(0, metrics=_lora_metrics({"a", "b"}, set(), 2))]
    endpoints.append(make_endpoint(1, metrics=None))
    request = make_request(target_model="base", is_adapter=False)
    assert make_plugin("lora-affinity-scorer").score(request, CycleState(), endpoints) == [1.0, 1.0]


# --------------------------------------------------------------------------- load aware


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [(0, 0.5), (1, 0.5 * (1 - 1 / 128)), (64, 0.25), (127, 0.5 / 128), (128, 0.0), (1000, 0.0)],
)
def test_load_aware_default_threshold(
    waiting: int, expected: float, make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    ep = make_endpoint(0, waiting=waiting)
    scores = make_plugin("load-aware-scorer").score(make_request(), CycleState(), [ep])
    assert scores == pytest.approx([expected])


def test_load_aware_custom_threshold_and_missing_metrics(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    unscraped = make_endpoint(2, metrics=None)
    for _ in range(5):
        unscraped.inflight.dispatch(1, 1)
    endpoints = [make_endpoint(0, waiting=5), make_endpoint(1, waiting=-3), unscraped]
    scorer = make_plugin("load-aware-scorer", threshold=10)
    assert scorer.score(make_request(), CycleState(), endpoints) == pytest.approx([0.25, 0.5, 0.25])


# --------------------------------------------------------------------------- token load


def test_token_load_scorer(make_plugin: Any, make_request: Any, make_endpoint: Any) -> None:
    endpoints = [make_endpoint(i) for i in range(4)]
    endpoints[1].inflight.dispatch(1_048_576, 1_048_576)  # half of 4 Mi tokens
    endpoints[2].inflight.dispatch(4_194_304, 0)  # at the threshold
    endpoints[3].inflight.dispatch(9_000_000, 9_000_000)  # beyond it
    scores = make_plugin("token-load-scorer").score(make_request(), CycleState(), endpoints)
    assert scores == pytest.approx([1.0, 0.5, 0.0, 0.0])


def test_token_load_scorer_threshold_and_no_metrics(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    ep = make_endpoint(0, metrics=None)
    ep.inflight.dispatch(30, 10)
    scorer = make_plugin("token-load-scorer", queueThresholdTokens=160)
    assert scorer.score(make_request(), CycleState(), [ep]) == pytest.approx([0.75])


# --------------------------------------------------------------------------- active requests


def _with_inflight(make_endpoint: Any, counts: list[int]) -> list[Any]:
    endpoints = [make_endpoint(i) for i in range(len(counts))]
    for ep, n in zip(endpoints, counts, strict=True):
        for _ in range(n):
            ep.inflight.dispatch(1, 1)
    return endpoints


def test_active_request_defaults_match_llm_d(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = _with_inflight(make_endpoint, [0, 1, 2, 4])
    scores = make_plugin("active-request-scorer").score(make_request(), CycleState(), endpoints)
    assert scores == pytest.approx([1.0, 3 / 4, 2 / 4, 0.0])


def test_active_request_threshold_and_busy_scale(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = _with_inflight(make_endpoint, [0, 2, 3, 4, 6])
    scorer = make_plugin("active-request-scorer", idleThreshold=2, maxBusyScore=0.5)
    scores = scorer.score(make_request(), CycleState(), endpoints)
    # idle: r ≤ 2 → 1.0; busy: 0.5 · (6 − r) / (6 − 2)
    assert scores == pytest.approx([1.0, 1.0, 0.375, 0.25, 0.0])


def test_active_request_all_idle_and_all_equal(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    scorer = make_plugin("active-request-scorer", idleThreshold=3)
    idle = _with_inflight(make_endpoint, [0, 3, 1])
    assert scorer.score(make_request(), CycleState(), idle) == [1.0, 1.0, 1.0]
    busy = _with_inflight(make_endpoint, [5, 5])
    assert scorer.score(make_request(), CycleState(), busy) == [0.0, 0.0]


def test_active_request_ignores_metrics(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = [make_endpoint(0, metrics=None), make_endpoint(1, running=50, waiting=50)]
    scores = make_plugin("active-request-scorer").score(make_request(), CycleState(), endpoints)
    assert scores == [1.0, 1.0]


def test_active_request_rejects_busy_score_above_one(make_plugin: Any) -> None:
    with pytest.raises(PluginConfigError, match="maxBusyScore"):
        make_plugin("active-request-scorer", maxBusyScore=1.5)


# --------------------------------------------------------------------------- session affinity


def test_session_token_round_trip() -> None:
    for name in ["ep-0", "default/vllm-llama-7f9c", "ä/ö", "x"]:
        token = encode_session_token(name)
        assert "=" not in token
        assert decode_session_token(token) == name
    # Padded and standard-alphabet tokens are accepted too.
    assert decode_session_token(base64.b64encode(b"ep-1").decode()) == "ep-1"
    assert decode_session_token(base64.urlsafe_b64encode(b"\xfb\xff?").decode()) is None


@pytest.mark.parametrize("token", ["!!!", "e", "ä", "//==", "ZXAtMA=x", "ZXAt MA", "ZXAtMA==="])
def test_session_token_invalid(token: str) -> None:
    # Not base64, bad length or padding, non-ASCII, or bytes that are not UTF-8.
    assert decode_session_token(token) is None


def test_session_affinity_scores_named_endpoint(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    request = make_request(headers={SESSION_HEADER: encode_session_token("ep-1")})
    scores = make_plugin("session-affinity-scorer").score(request, CycleState(), endpoints)
    assert scores == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {SESSION_HEADER: ""},
        {SESSION_HEADER: "%%%"},
        {SESSION_HEADER: encode_session_token("gone")},
    ],
)
def test_session_affinity_unknown_token_scores_zero(
    headers: dict[str, str], make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    endpoints = [make_endpoint(i) for i in range(2)]
    request = make_request(headers=headers)
    assert make_plugin("session-affinity-scorer").score(request, CycleState(), endpoints) == [
        0.0,
        0.0,
    ]


def test_session_affinity_writes_response_header(
    make_plugin: Any, make_request: Any, make_endpoint: Any
) -> None:
    scorer = make_plugin("session-affinity-scorer")
    ep = make_endpoint(4)
    result = SchedulingResult({"default": ProfileResult([ep])}, "default")

    state = CycleState()
    scorer.pre_request(make_request(), state, result)
    assert state.get(RESPONSE_HEADERS) == {SESSION_HEADER: encode_session_token("ep-4")}

    merged = CycleState()
    existing = {"x-other": "1"}
    merged.put(RESPONSE_HEADERS, existing)
    scorer.pre_request(make_request(), merged, result)
    assert merged.get(RESPONSE_HEADERS) is existing
    assert existing == {"x-other": "1", SESSION_HEADER: encode_session_token("ep-4")}


def test_session_affinity_strategy_parameter(make_plugin: Any) -> None:
    make_plugin("session-affinity-scorer", strategy="encoded_endpoint_header")
    with pytest.raises(PluginConfigError, match="strategy"):
        make_plugin("session-affinity-scorer", strategy="session_id")
