"""Online calibration per hardware class: on a mixed pool each class's routed requests
rescale that class's predictions only; a hardware-blind producer, or a pool of one class,
is calibrated by one pair of trackers as before."""

from __future__ import annotations

import numpy as np
import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, Hardware
from sluicegate.framework import (
    PREDICTIONS,
    PREDICTOR_SERVICE,
    CycleState,
    LLMRequest,
    PluginContext,
    ProfileResult,
    ResponseOutcome,
    SchedulingResult,
)
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import Sample
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.scheduling.plugins.predicted_latency import PredictedLatencyProducer

REGISTRY = default_registry()
H100, A100 = "h100-80gb", "a100-80gb"


class Flat(SynchronousPredictor):
    """Every row: TTFT 100 ms, TPOT 10 ms."""

    ready = True

    def __init__(self, calibration: LatencyCalibration) -> None:
        self.calibration: LatencyCalibration | None = calibration

    def predict_query(self, query: PredictionQuery) -> Predictions:
        n = len(query.rows)
        return Predictions(np.full(n, 100.0, np.float32), np.full(n, 10.0, np.float32))

    def observe(self, sample: Sample) -> None:
        pass


def pool() -> list[Endpoint]:
    out = []
    for i, cls in enumerate((H100, A100)):
        e = Endpoint(
            name=f"ep-{i}", host="10.0.0.1", port=8000 + i, metrics=EngineMetrics(0.0), index=i
        )
        e.hardware = Hardware(cls, None)
        out.append(e)
    return out


def producer(service: Flat, hardware_aware: bool) -> PredictedLatencyProducer:
    context = PluginContext(ManualClock(), 0, services={PREDICTOR_SERVICE: service})
    params = {"streamingMode": True, "hardwareAware": hardware_aware}
    plugin = REGISTRY.create("predicted-latency-producer", "p", params, context)
    assert isinstance(plugin, PredictedLatencyProducer)
    return plugin


def request(i: int) -> LLMRequest:
    return LLMRequest(
        request_id=f"r{i}",
        model="base",
        target_model="base",
        prompt=b"hello",
        prompt_tokens=2,
        arrival=0.0,
        headers={},
        stream=True,
        slo_ttft_ms=250.0,
        slo_tpot_ms=50.0,
    )


def serve(
    plugin: PredictedLatencyProducer, endpoints: list[Endpoint], chosen: int, ttft_s: float
) -> None:
    """Route one request to ``endpoints[chosen]`` and complete it with ``ttft_s`` and a
    TPOT of 10 ms."""
    r = request(chosen)
    state = CycleState()
    plugin.produce(r, state, endpoints)
    target = endpoints[chosen]
    plugin.pre_request(r, state, SchedulingResult({"default": ProfileResult([target])}, "default"))
    plugin.on_complete(r, state, ResponseOutcome(target, 0.0, ttft_s, ttft_s + 0.09, 10, True))


def scaled(plugin: PredictedLatencyProducer, endpoints: list[Endpoint]) -> list[float]:
    state = CycleState()
    plugin.produce(request(0), state, endpoints)
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    return [predictions[e.name].ttft_ms for e in endpoints]


def test_each_class_is_rescaled_by_its_own_outcomes() -> None:
    """The H100s meet the prediction (TTFT 0.1 s), the A100s take three times longer: the
    A100s' predictions are scaled ×3, the H100s' stay as they are."""
    calibration = LatencyCalibration(0.9, max_classes=4)
    plugin = producer(Flat(calibration), hardware_aware=True)
    endpoints = pool()
    for _ in range(60):
        serve(plugin, endpoints, 0, 0.1)
        serve(plugin, endpoints, 1, 0.3)
    assert calibration.scales(H100, 100.0)[0] == pytest.approx(1.0)
    assert calibration.scales(A100, 100.0)[0] == pytest.approx(3.0)
    assert scaled(plugin, endpoints) == pytest.approx([100.0, 300.0])
    assert calibration.ttft.observations == 0  # the unnamed pair saw nothing


def test_a_hardware_blind_producer_calibrates_one_pair() -> None:
    calibration = LatencyCalibration(0.9, max_classes=4)
    plugin = producer(Flat(calibration), hardware_aware=False)
    endpoints = pool()
    for _ in range(60):
        serve(plugin, endpoints, 0, 0.1)
        serve(plugin, endpoints, 1, 0.3)
    assert calibration.classes == {}
    assert calibration.ttft.observations == 120
    # One scale for both classes: the 0.9-quantile of a 1:1 mixture of ratios 1 and 3.
    assert scaled(plugin, endpoints) == pytest.approx([300.0, 300.0])


def test_classes_are_bounded_and_share_the_unnamed_pair_beyond() -> None:
    calibration = LatencyCalibration(0.9, max_classes=1)
    first = calibration.of(H100)
    assert calibration.of(H100) is first
    assert calibration.trackers(A100) == (calibration.ttft, calibration.tpot)
    assert calibration.trackers(None) == (calibration.ttft, calibration.tpot)
    assert list(calibration.classes) == [H100]
    off = LatencyCalibration(0.9)  # max_classes 0: one pair whatever the class
    assert off.trackers(H100) == (off.ttft, off.tpot)
    assert off.classes == {}
    with pytest.raises(ValueError, match="max_classes"):
        LatencyCalibration(0.9, max_classes=-1)


def test_a_hardware_aware_predictor_calibrates_per_class() -> None:
    predictor = HardwareAwarePredictor(ManualClock(), PredictorSettings(max_classes=3))
    assert predictor.calibration is not None
    assert predictor.calibration.max_classes == 3


def test_a_streamed_ttft_calibrates_at_its_first_token_and_only_once() -> None:
    """The TTFT feeds its class's tracker when the first token arrives (not a generation
    later, at the end), and the end of the request does not count it again."""
    calibration = LatencyCalibration(0.9, max_classes=4)
    clock = ManualClock()
    context = PluginContext(clock, 0, services={PREDICTOR_SERVICE: Flat(calibration)})
    params = {"streamingMode": True, "hardwareAware": True}
    plugin = REGISTRY.create("predicted-latency-producer", "p", params, context)
    assert isinstance(plugin, PredictedLatencyProducer)
    endpoints = pool()
    r, state, target = request(1), CycleState(), endpoints[1]
    plugin.produce(r, state, endpoints)
    plugin.pre_request(r, state, SchedulingResult({"default": ProfileResult([target])}, "default"))
    ttft_tracker, tpot_tracker = calibration.trackers(A100)
    clock.advance(0.3)
    plugin.on_first_token(r, state, endpoints[0], clock.now())  # not its endpoint: ignored
    assert ttft_tracker.observations == 0
    plugin.on_first_token(r, state, target, clock.now())
    assert ttft_tracker.observations == 1
    assert ttft_tracker.misses == 1  # 300 ms against a prediction of 100
    plugin.on_complete(r, state, ResponseOutcome(target, 0.0, 0.3, 0.39, 10, True))
    assert ttft_tracker.observations == 1
    assert tpot_tracker.observations == 1


def test_ttft_is_calibrated_per_prediction_size() -> None:
    """On a mixed pool, short predictions with a heavy tail (queued behind long prefills:
    ×3) do not inflate the long ones, which are right: each size bin gets its own scale
    once it has enough observations; a bin without them uses the class's all-sizes
    scale. A pool of one class keeps the all-sizes scale."""
    calibration = LatencyCalibration(0.9, max_classes=4)
    trackers = calibration.of(A100)
    for i in range(200):
        trackers.observe_ttft(30.0, 30.0 * (3.0 if i % 4 == 0 else 1.0))  # bin < 64 ms
        trackers.observe_ttft(400.0, 400.0)  # bin 256–512 ms
    # One class so far: the all-sizes scale for every size, as before.
    assert not calibration.mixed
    assert calibration.scales(A100, 400.0)[0] == pytest.approx(3.0)
    calibration.see([A100, H100], 0.0)  # a second class among the candidates: a mixed pool
    assert calibration.mixed
    assert calibration.scales(A100, 30.0)[0] == pytest.approx(3.0)
    assert calibration.scales(A100, 400.0)[0] == pytest.approx(1.0)
    # Nothing observed between 64 and 256 ms: the all-sizes scale (1 in 8 ratios is 3).
    assert calibration.scales(A100, 100.0)[0] == pytest.approx(trackers.ttft.scale)
    assert trackers.ttft.scale == pytest.approx(3.0)


def test_on_a_pool_of_one_class_ttft_calibrates_when_the_request_ends() -> None:
    calibration = LatencyCalibration(0.9, max_classes=4)
    clock = ManualClock()
    context = PluginContext(clock, 0, services={PREDICTOR_SERVICE: Flat(calibration)})
    params = {"streamingMode": True, "hardwareAware": True}
    plugin = REGISTRY.create("predicted-latency-producer", "p", params, context)
    assert isinstance(plugin, PredictedLatencyProducer)
    endpoints = [e for e in pool() if e.hardware.accelerator == A100]
    r, state, target = request(1), CycleState(), endpoints[0]
    plugin.produce(r, state, endpoints)
    plugin.pre_request(r, state, SchedulingResult({"default": ProfileResult([target])}, "default"))
    clock.advance(0.3)
    plugin.on_first_token(r, state, target, clock.now())
    ttft_tracker, _ = calibration.trackers(A100)
    assert not calibration.mixed
    assert ttft_tracker.observations == 0
    plugin.on_complete(r, state, ResponseOutcome(target, 0.0, 0.3, 0.39, 10, True))
    assert ttft_tracker.observations == 1


def test_outcomes_routed_before_a_restart_do_not_feed_the_fresh_trackers() -> None:
    """A request routed on the old model's scaled prediction ends after its class's
    calibration restarted: its ratio is the old model's residual and is skipped; a
    request routed after the restart, and the other class's, still count."""
    calibration = LatencyCalibration(0.9, max_classes=4)
    plugin = producer(Flat(calibration), hardware_aware=True)
    endpoints = pool()
    done = ResponseOutcome(endpoints[1], 0.0, 0.3, 0.39, 10, True)
    states = []
    for i in range(2):
        r, state = request(i), CycleState()
        plugin.produce(r, state, endpoints)
        chosen = SchedulingResult({"default": ProfileResult([endpoints[i]])}, "default")
        plugin.pre_request(r, state, chosen)
        states.append((r, state))
    assert calibration.restart(A100)
    (r_h100, s_h100), (r_a100, s_a100) = states
    plugin.on_complete(r_a100, s_a100, done)  # routed before the restart: skipped
    a100_ttft, a100_tpot = calibration.trackers(A100)
    assert (a100_ttft.kept, a100_tpot.kept) == (0, 0)
    plugin.on_complete(r_h100, s_h100, ResponseOutcome(endpoints[0], 0.0, 0.1, 0.19, 10, True))
    assert calibration.trackers(H100)[0].kept == 1
    serve(plugin, endpoints, 1, 0.3)  # routed after it: counts
    assert (a100_ttft.kept, a100_tpot.kept) == (1, 1)
