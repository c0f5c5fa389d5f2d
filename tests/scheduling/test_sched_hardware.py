"""Mixed pools: capacity-normalised heuristics, the cost-aware scorer, and the
``predicted-latency`` (hardware-aware), ``predicted-latency-pool`` (hardware-blind) and
``cost-aware`` presets on hand-built endpoint states."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, Hardware
from sluicegate.framework import (
    PREDICTIONS,
    PREDICTOR_SERVICE,
    CycleState,
    EndpointPrediction,
    LLMRequest,
    PluginConfigError,
    PluginContext,
)
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import Sample
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.model import TrainConfig
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.scheduling.config import build_scheduler, load_preset
from sluicegate.scheduling.plugins.predicted_latency import feature_row

REGISTRY = default_registry()
H100, A100 = "h100-80gb", "a100-80gb"
CAPACITY = {"capacityNormalization": "configured", "classCapacity": {H100: 3.0, A100: 1.0}}


def new_endpoint(i: int, **metrics: Any) -> Endpoint:
    """Endpoint ``ep-i`` scraped at t = 0 with the given metric fields."""
    return Endpoint(
        name=f"ep-{i}",
        host="10.0.0.1",
        port=8000 + i,
        metrics=EngineMetrics(scraped_at=0.0, **metrics),
        index=i,
    )


def new_request(prompt: str = "", **fields: Any) -> LLMRequest:
    data = prompt.encode()
    values: dict[str, Any] = {
        "request_id": "req-1",
        "model": "base",
        "target_model": "base",
        "prompt": data,
        "prompt_tokens": -(-len(data) // 4),
        "arrival": 0.0,
        "headers": {},
    }
    return LLMRequest(**{**values, **fields})


def on(endpoint: Endpoint, cls: str | None, cost: float | None = None) -> Endpoint:
    endpoint.hardware = Hardware(cls, cost)
    return endpoint


def plugin(type_name: str, **params: Any) -> Any:
    return REGISTRY.create(type_name, type_name, params, PluginContext(ManualClock(), 0))


# ---------------------------------------------------------------------- capacity


def test_queue_scorer_weighs_queues_by_class_capacity() -> None:
    fast = on(new_endpoint(0, waiting=6), H100)
    slow = on(new_endpoint(1, waiting=3), A100)
    request, state = new_request(), CycleState()
    assert plugin("queue-scorer").score(request, state, [fast, slow]) == [0.0, 1.0]
    # 6 queued on an H100 drain like 2 on an A100: the H100 is the shorter wait.
    assert plugin("queue-scorer", **CAPACITY).score(request, state, [fast, slow]) == [1.0, 0.0]


def test_kv_scorer_weighs_free_memory_by_class_capacity() -> None:
    fast = on(new_endpoint(0, kv_usage=0.5), H100)
    slow = on(new_endpoint(1, kv_usage=0.2), A100)
    request, state = new_request(), CycleState()
    assert plugin("kv-cache-utilization-scorer").score(request, state, [fast, slow]) == [
        0.5,
        0.8,
    ]
    scores = plugin("kv-cache-utilization-scorer", **CAPACITY).score(request, state, [fast, slow])
    assert scores == pytest.approx([0.5, 0.8 / 3])


def test_active_request_scorer_weighs_requests_by_class_capacity() -> None:
    fast, slow, idle = (on(new_endpoint(i), c) for i, c in enumerate((H100, A100, A100)))
    fast.inflight.requests, slow.inflight.requests = 6, 3
    request, state = new_request(), CycleState()
    plain = plugin("active-request-scorer").score(request, state, [fast, slow, idle])
    assert plain == [0.0, 0.5, 1.0]
    scaled = plugin("active-request-scorer", **CAPACITY).score(request, state, [fast, slow, idle])
    assert scaled == pytest.approx([1 / 3, 0.0, 1.0])  # loads 6 and 9 (3 × 3)


def test_class_capacity_keys_are_normalized_like_endpoint_classes() -> None:
    fast = on(new_endpoint(0, waiting=6), H100)
    slow = on(new_endpoint(1, waiting=3), A100)
    product_names = {"H100-80GB": 3.0, "NVIDIA-A100-SXM4-80GB": 1.0}
    scorer = plugin("queue-scorer", capacityNormalization="configured", classCapacity=product_names)
    assert scorer.score(new_request(), CycleState(), [fast, slow]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("capacity", "message"),
    [({"H100": 3.0, H100: 2.0}, "both name hardware class"), ({"H100 !": 1.0}, "hardware class")],
)
def test_class_capacity_keys_that_clash_or_name_no_class_are_refused(
    capacity: dict[str, float], message: str
) -> None:
    with pytest.raises(PluginConfigError, match=f"classCapacity.*{message}"):
        plugin("queue-scorer", capacityNormalization="configured", classCapacity=capacity)


def test_active_request_scorer_counts_peers_requests_with_normalisation_on() -> None:
    # Shared state: another gateway replica has 6 requests on the H100, this one has none.
    fast, slow = on(new_endpoint(0), H100), on(new_endpoint(1), A100)
    fast.peers.requests, slow.inflight.requests = 6, 1
    request, state = new_request(), CycleState()
    plain = plugin("active-request-scorer").score(request, state, [fast, slow])
    assert plain == pytest.approx([0.0, 5 / 6])
    scaled = plugin("active-request-scorer", **CAPACITY).score(request, state, [fast, slow])
    assert scaled == pytest.approx([0.0, 0.5])  # loads 6 (peers') and 3 (1 × 3)


@pytest.mark.parametrize(
    "type_name", ["queue-scorer", "kv-cache-utilization-scorer", "active-request-scorer"]
)
@pytest.mark.parametrize("cls", [None, H100])
def test_capacity_normalisation_changes_nothing_on_a_homogeneous_pool(
    type_name: str, cls: str | None
) -> None:
    pool = [on(new_endpoint(i, waiting=i, kv_usage=0.1 * i), cls) for i in range(4)]
    for i, e in enumerate(pool):
        e.inflight.requests = 2 * i
    request, state = new_request(), CycleState()
    off = plugin(type_name).score(request, state, pool)
    for mode in ("configured", "measured"):
        params = {**CAPACITY, "capacityNormalization": mode}
        assert plugin(type_name, **params).score(request, state, pool) == off


def test_an_endpoint_of_unknown_capacity_makes_the_normalisation_neutral() -> None:
    pool = [on(new_endpoint(0, waiting=6), H100), on(new_endpoint(1, waiting=3), "l40s-48gb")]
    request, state = new_request(), CycleState()
    assert plugin("queue-scorer", **CAPACITY).score(request, state, pool) == [0.0, 1.0]


def test_measured_capacity_comes_from_saturated_scrapes() -> None:
    fast, slow = on(new_endpoint(0), H100), on(new_endpoint(1), A100)
    scorer = plugin("queue-scorer", capacityNormalization="measured")
    request, state = new_request(), CycleState()
    for t in range(3):
        fast.metrics = EngineMetrics(float(t), waiting=6, generation_tokens=3000.0 * t)
        slow.metrics = EngineMetrics(float(t), waiting=3, generation_tokens=1000.0 * t)
        scores = scorer.score(request, state, [fast, slow])
    assert scorer.capacity.measured == {H100: 3000.0, A100: 1000.0}
    assert scores == [1.0, 0.0]


def test_configured_normalisation_needs_capacities() -> None:
    with pytest.raises(ValueError, match="classCapacity"):
        plugin("queue-scorer", capacityNormalization="configured")


# ---------------------------------------------------------------------- cost


def predictions(**by_name: tuple[float, float, bool]) -> dict[str, EndpointPrediction]:
    return {
        name: EndpointPrediction(ttft, tpot, valid, valid, 0.0, 0.0, 0)
        for name, (ttft, tpot, valid) in by_name.items()
    }


def test_cost_per_predicted_token_ranks_the_endpoints_that_meet_the_slo() -> None:
    fast = on(new_endpoint(0), H100, 4.0)
    slow = on(new_endpoint(1, running=4), A100, 1.0)
    idle_slow = on(new_endpoint(2), A100, 1.0)
    missing = on(new_endpoint(3), A100, 0.5)
    state = CycleState()
    state.put(
        PREDICTIONS,
        predictions(
            **{
                "ep-0": (100.0, 10.0, True),
                "ep-1": (300.0, 30.0, True),
                "ep-2": (300.0, 30.0, True),
                "ep-3": (900.0, 90.0, False),
            }
        ),
    )
    pool = [fast, slow, idle_slow, missing]
    # Per stream: H100 4/(3600·100) = 1.11e-5, each A100 1/(3600·33.3) = 8.33e-6; the one
    # that misses its SLO scores 0 however cheap.
    scores = plugin("cost-aware-scorer").score(new_request(), state, pool)
    assert scores == pytest.approx([0.75, 1.0, 1.0, 0.0], rel=1e-2)
    # Sharing the batch: the busy A100 (5 streams) is 1.67e-6 per token.
    shared = plugin("cost-aware-scorer", sharedBatch=True).score(new_request(), state, pool)
    assert shared == pytest.approx([1.67e-6 / 1.11e-5, 1.0, 0.2, 0.0], rel=1e-2)


def test_cost_scorer_without_costs_or_without_a_meeting_endpoint() -> None:
    a, b = on(new_endpoint(0), H100), on(new_endpoint(1), A100, 1.0)
    state = CycleState()
    state.put(PREDICTIONS, predictions(**{"ep-0": (1.0, 1.0, True), "ep-1": (1.0, 1.0, True)}))
    scorer = plugin("cost-aware-scorer")
    assert scorer.score(new_request(), state, [a, b]) == [1.0, 1.0]  # H100 counted as 1.0/h
    assert plugin("cost-aware-scorer", unknownCost="free").score(new_request(), state, [a, b]) == [
        1.0,
        0.0,
    ]
    assert scorer.score(new_request(), state, [on(a, None), on(b, None)]) == [1.0, 1.0]
    state.put(PREDICTIONS, predictions(**{"ep-0": (1.0, 1.0, False)}))
    assert scorer.score(new_request(), state, [a, b]) == [0.0, 0.0]
    assert scorer.score(new_request(), CycleState(), [a, b]) == [0.0, 0.0]


def test_cost_per_token_at_class_capacity_prices_throughput_not_the_stream() -> None:
    """Per hour the H100 is dearer (3.95 against 2.50) but it emits 3× the tokens: per
    token at class capacity it is the cheaper, whatever the moment's TPOT says."""
    fast = on(new_endpoint(0), H100, 3.95)
    slow = on(new_endpoint(1), A100, 2.50)
    out_of_slo = on(new_endpoint(2), A100, 0.10)
    state = CycleState()
    state.put(
        PREDICTIONS,
        predictions(
            **{"ep-0": (200.0, 40.0, True), "ep-1": (300.0, 30.0, True), "ep-2": (9.0, 99, False)}
        ),
    )
    pool = [fast, slow, out_of_slo]
    # Per stream: 3.95 · 40 against 2.50 · 30, the A100 looks cheaper.
    per_stream = plugin("cost-aware-scorer").score(new_request(), state, pool)
    assert per_stream == pytest.approx([75 / 158, 1.0, 0.0])
    # Per token at capacity: 3.95 / 3 against 2.50 / 1.
    scores = plugin("cost-aware-scorer", **CAPACITY).score(new_request(), state, pool)
    assert scores == pytest.approx([1.0, (3.95 / 3) / 2.50, 0.0])
    # A class of unknown capacity: back to per stream for the whole decision.
    blind = [fast, slow, on(new_endpoint(3), "l40s", 1.0)]
    assert plugin("cost-aware-scorer", **CAPACITY).score(new_request(), state, blind) == (
        pytest.approx([75 / 158, 1.0, 0.0])
    )


def test_cost_exponent_sharpens_the_preference_for_the_cheapest() -> None:
    fast, slow = on(new_endpoint(0), H100, 3.95), on(new_endpoint(1), A100, 2.50)
    state = CycleState()
    state.put(PREDICTIONS, predictions(**{"ep-0": (200.0, 40.0, True), "ep-1": (9.0, 9.0, True)}))
    ratio = (3.95 / 3) / 2.50
    for exponent in (1, 2, 64):
        scorer = plugin("cost-aware-scorer", costExponent=exponent, **CAPACITY)
        scores = scorer.score(new_request(), state, [fast, slow])
        assert scores == pytest.approx([1.0, ratio**exponent])
    for bad in (0.5, 65, "x"):
        with pytest.raises(PluginConfigError, match="costExponent"):
            plugin("cost-aware-scorer", costExponent=bad)


def test_cost_scorer_measures_class_capacity_from_saturated_scrapes() -> None:
    fast, slow = on(new_endpoint(0), H100, 3.95), on(new_endpoint(1), A100, 2.50)
    scorer = plugin("cost-aware-scorer", capacityNormalization="measured")
    state = CycleState()
    state.put(PREDICTIONS, predictions(**{"ep-0": (1.0, 40.0, True), "ep-1": (1.0, 30.0, True)}))
    scores = scorer.score(new_request(), state, [fast, slow])
    assert scores == pytest.approx([75 / 158, 1.0])  # nothing measured yet: per stream
    for t in range(1, 3):
        fast.metrics = EngineMetrics(float(t), waiting=6, generation_tokens=6000.0 * t)
        slow.metrics = EngineMetrics(float(t), waiting=3, generation_tokens=2000.0 * t)
        scores = scorer.score(new_request(), state, [fast, slow])
    assert scorer.capacity.measured == {H100: 6000.0, A100: 2000.0}
    assert scores == pytest.approx([1.0, (3.95 / 6000) / (2.50 / 2000)])


# ---------------------------------------------------------------------- presets


class ClassPredictor(SynchronousPredictor):
    """TTFT/TPOT by hardware class: H100 100/10 ms, A100 300/30 ms; rows of no class (the
    hardware-blind producer) get the pool average, 200/20 ms, as one pooled model would."""

    calibration: LatencyCalibration | None = None
    ready = True

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def predict_query(self, query: PredictionQuery) -> Predictions:
        classes = query.classes or [None] * len(query.rows)
        base = {H100: 100.0, A100: 300.0, None: 200.0}
        ttft = np.array([base[c] for c in classes], dtype=np.float32)
        return Predictions(ttft, ttft / 10)

    def observe(self, sample: Sample) -> None:
        self.samples.append(sample)


def route(
    preset: str, pool: list[Endpoint], slo_ttft_ms: float, seed: int = 0
) -> tuple[Endpoint, ClassPredictor]:
    service = ClassPredictor()
    context = PluginContext(ManualClock(), seed, services={PREDICTOR_SERVICE: service})
    built = build_scheduler(load_preset(preset), context, REGISTRY)
    request = new_request(
        "hello " * 50, stream=True, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=50.0, request_id="r"
    )
    state = CycleState()
    built.scheduler.prepare(request, state, pool)
    result = built.scheduler.schedule(request, state, pool)
    return result.targets[0], service


def mixed_pool() -> list[Endpoint]:
    return [
        on(new_endpoint(0, waiting=1), H100, 4.0),
        on(new_endpoint(1, waiting=1), A100, 1.0),
        on(new_endpoint(2, waiting=1), A100, 1.0),
    ]


def test_hardware_aware_preset_sends_a_tight_slo_to_the_fast_class() -> None:
    picks = Counter(route("predicted-latency", mixed_pool(), 150.0, s)[0].name for s in range(40))
    # All but the headroom filter's exploration of the negative tier (1 %).
    assert picks["ep-0"] >= 38


def test_pool_preset_is_hardware_blind() -> None:
    picks = Counter(
        route("predicted-latency-pool", mixed_pool(), 250.0, s)[0].name for s in range(20)
    )
    assert picks["ep-1"] + picks["ep-2"] > 0  # the A100s look as fast as the H100


def test_cost_aware_preset_fills_cheap_hardware_and_spills_when_the_slo_binds() -> None:
    pool = mixed_pool()
    pool[0].hardware = Hardware(H100, 8.0)
    pool[2].metrics = replace(pool[2].metrics or EngineMetrics(0.0), running=3)
    # A loose SLO: every class meets it; per token an A100 costs 1 × 30 against the H100's
    # 8 × 10: cost score 1.0 against 0.375 ** 64, which outweighs the H100's lighter load.
    loose = Counter(route("cost-aware", pool, 1000.0, s)[0].name for s in range(40))
    assert set(loose) <= {"ep-1", "ep-2"}
    # Only the H100 meets a tight one (but for the headroom filter's 1 % exploration).
    tight = Counter(route("cost-aware", pool, 150.0, s)[0].name for s in range(40))
    assert tight["ep-0"] >= 38
    # Without costs no class is preferred: every endpoint meeting the SLO is a candidate
    # of the weighted pick, as in predicted-latency.
    blind = [on(e, e.hardware.accelerator) for e in mixed_pool()]
    assert set(Counter(route("cost-aware", blind, 1000.0, s)[0].name for s in range(40))) == {
        "ep-0",
        "ep-1",
        "ep-2",
    }


@pytest.mark.parametrize("cls", [None, H100])
def test_hardware_aware_preset_predicts_as_today_on_a_homogeneous_pool(cls: str | None) -> None:
    """A pool of one class (or of none named): ``predicted-latency`` with the hardware-aware
    predictor predicts exactly what the hardware-blind producer with today's single
    in-process model does, trained on the same traffic."""
    settings = PredictorSettings(min_samples=50, train=TrainConfig(n_estimators=20))
    aware = HardwareAwarePredictor(ManualClock(), settings)
    today = InProcessPredictor(ManualClock(), settings)
    pool = [on(new_endpoint(i, waiting=i, kv_usage=0.1 * i), cls) for i in range(4)]
    request = new_request("hello " * 40, stream=True, slo_ttft_ms=100.0, slo_tpot_ms=20.0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        e = pool[int(rng.integers(4))]
        row = feature_row(request, e, None, 0.0)
        ttft, tpot = 20.0 + 30 * e.index + float(rng.random()), 5.0 + e.index
        aware.observe(Sample(row, ttft, tpot, cls))
        today.observe(Sample(row, ttft, tpot))
    assert aware.maybe_retrain()
    assert today.maybe_retrain()
    got = []
    for preset, service in (("predicted-latency", aware), ("predicted-latency-pool", today)):
        context = PluginContext(ManualClock(), 0, services={PREDICTOR_SERVICE: service})
        built = build_scheduler(load_preset(preset), context, REGISTRY)
        state = CycleState()
        built.scheduler.prepare(request, state, pool)
        built.scheduler.schedule(request, state, pool)
        got.append(state.get(PREDICTIONS))
    assert got[0] is not None
    assert got[0] == got[1]


def test_plugins_say_whether_they_account_for_hardware() -> None:
    assert plugin("cost-aware-scorer").hardware_aware
    assert plugin("predicted-latency-producer", hardwareAware=True).hardware_aware
    assert not plugin("predicted-latency-producer").hardware_aware
    assert plugin("queue-scorer", **CAPACITY).hardware_aware
    assert not plugin("kv-cache-utilization-scorer").hardware_aware


def test_measured_capacity_falls_back_to_the_relay_timing() -> None:
    fast, slow = on(new_endpoint(0), H100), on(new_endpoint(1), A100)
    fast.inflight.token_interval_s, slow.inflight.token_interval_s = 0.01, 0.03
    scorer = plugin("queue-scorer", capacityNormalization="measured")
    for t in range(2):  # no generation counter: running / iteration interval
        fast.metrics = EngineMetrics(float(t), waiting=2, running=30)
        slow.metrics = EngineMetrics(float(t), waiting=2, running=30)
        scorer.score(new_request(), CycleState(), [fast, slow])
    assert scorer.capacity.measured == pytest.approx({H100: 3000.0, A100: 1000.0})


def test_cost_scorer_without_tpot_uses_the_end_to_end_prediction() -> None:
    fast = on(new_endpoint(0), H100, 3.0)
    slow = on(new_endpoint(1), A100, 1.0)
    state = CycleState()
    # Non-streaming: TPOT is 0 and TTFT stands for the whole request (100 tokens).
    state.put(
        PREDICTIONS, predictions(**{"ep-0": (1000.0, 0.0, True), "ep-1": (4000.0, 0.0, True)})
    )
    scores = plugin("cost-aware-scorer").score(new_request(max_tokens=100), state, [fast, slow])
    # per token: 3 / (3600 · 100) against 1 / (3600 · 25): the H100 is cheaper.
    assert scores == pytest.approx([1.0, 3 / 4])
