"""The "mixed pool" gates (per-size TTFT calibration, first-token calibration, the latency
scorer's ``load`` strategy) follow the classes *present* among recent candidates: when
every server of a class leaves, the pool is one class again once the presence window
(:data:`sluicegate.latency.presence.PRESENCE_WINDOW_S`) has passed, and a class that left
frees its calibration slot for a newcomer."""

from __future__ import annotations

import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, Hardware
from sluicegate.framework import (
    PREDICTIONS,
    CycleState,
    EndpointPrediction,
    LLMRequest,
    PluginContext,
)
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.metrics import calibration_metrics
from sluicegate.latency.presence import PRESENCE_WINDOW_S, ClassPresence

REGISTRY = default_registry()
H100, A100, L40S = "h100-80gb", "a100-80gb", "l40s-48gb"


def endpoint(i: int, cls: str | None, inflight: int) -> Endpoint:
    e = Endpoint(
        name=f"ep-{i}", host="10.0.0.1", port=8000 + i, metrics=EngineMetrics(0.0), index=i
    )
    e.hardware = Hardware(cls, None)
    e.inflight.requests = inflight
    return e


def request() -> LLMRequest:
    return LLMRequest(
        request_id="r",
        model="base",
        target_model="base",
        prompt=b"hi",
        prompt_tokens=1,
        arrival=0.0,
        headers={},
    )


def state(headrooms: list[tuple[float, float]], pool: list[Endpoint]) -> CycleState:
    s = CycleState()
    s.put(
        PREDICTIONS,
        {
            e.name: EndpointPrediction(
                ttft_ms=500.0 - t,
                tpot_ms=50.0 - p,
                ttft_valid=t > 0,
                tpot_valid=p > 0,
                ttft_headroom=t,
                tpot_headroom=p,
                dispatched=e.inflight.requests,
            )
            for e, (t, p) in zip(pool, headrooms, strict=True)
        },
    )
    return s


def test_presence_counts_classes_seen_within_the_window() -> None:
    p = ClassPresence(max_classes=4)
    assert not p.mixed(0.0)
    p.see([H100, A100, None], 0.0)
    assert p.mixed(0.0)
    p.see([A100], PRESENCE_WINDOW_S / 2)
    assert p.mixed(PRESENCE_WINDOW_S / 2)  # within the window: still mixed
    p.see([A100], PRESENCE_WINDOW_S + 1.0)
    assert not p.mixed(PRESENCE_WINDOW_S + 1.0)  # the H100s left: one class again


def test_presence_is_bounded_and_makes_room_from_departed_classes() -> None:
    p = ClassPresence(max_classes=2)
    p.see([f"c{i}" for i in range(1000)], 0.0)
    assert len(p.last_seen) == 2
    p.see([L40S, A100], PRESENCE_WINDOW_S + 1.0)  # c0, c1 are gone: room for the newcomers
    assert set(p.last_seen) == {L40S, A100}
    with pytest.raises(ValueError, match="max_classes"):
        ClassPresence(max_classes=0)
    with pytest.raises(ValueError, match="window_s"):
        ClassPresence(window_s=0.0)


def test_calibration_is_one_class_again_when_a_class_leaves() -> None:
    calibration = LatencyCalibration(0.9, max_classes=4)
    calibration.see([H100, A100], 0.0)
    assert calibration.mixed
    calibration.see([A100], PRESENCE_WINDOW_S + 1.0)
    assert not calibration.mixed


def test_a_departed_class_frees_its_calibration_slot() -> None:
    calibration = LatencyCalibration(0.9, max_classes=2)
    calibration.see([H100, A100], 0.0)
    calibration.of(H100), calibration.of(A100)
    calibration.see([L40S], 1.0)
    assert calibration.of(L40S) is calibration.pool  # both classes still present: full
    calibration.see([L40S], PRESENCE_WINDOW_S + 2.0)
    got = calibration.of(L40S)
    assert got is not calibration.pool  # a departed class's slot went to the newcomer
    assert len(calibration.classes) == 2


def test_load_strategy_is_most_again_once_a_class_has_left() -> None:
    clock = ManualClock()
    s = REGISTRY.create(
        "latency-scorer",
        "s",
        {"headroomSelectionStrategy": "load", "capacityNormalization": "measured"},
        PluginContext(clock, 0),
    )
    most = REGISTRY.create(
        "latency-scorer", "m", {"headroomSelectionStrategy": "most"}, PluginContext(clock, 0)
    )
    mixed = [endpoint(0, H100, 1), endpoint(1, A100, 1)]
    s.score(request(), state([(1.0, 1.0), (1.0, 1.0)], mixed), mixed)
    clock.advance(PRESENCE_WINDOW_S + 1.0)
    h100s: list[Endpoint] = [endpoint(0, H100, 4), endpoint(1, H100, 1)]
    headrooms = [(300.0, 20.0), (10.0, 1.0)]
    assert s.score(request(), state(headrooms, h100s), h100s) == most.score(
        request(), state(headrooms, h100s), h100s
    )


def test_pool_wide_calibration_counters_total_every_class() -> None:
    """With every row classed (a hardware-aware pool), the pool-wide observation and miss
    counters still count every routed request, also of a class whose slot was freed."""
    calibration = LatencyCalibration(0.9, max_classes=1)
    calibration.see([H100], 0.0)
    for _ in range(3):
        calibration.of(H100).ttft.update(100.0, 200.0)  # three misses
    calibration.see([A100], PRESENCE_WINDOW_S + 1.0)
    calibration.of(A100).ttft.update(100.0, 50.0)  # H100's slot went to the A100s
    totals = {
        (m.name, s.labels["target"]): s.value
        for m in calibration_metrics(calibration)
        for s in m.samples
        if "class" not in s.labels and s.name.endswith("_total")
    }
    assert totals[("sluicegate_predictor_calibration_observations", "ttft")] == 4
    assert totals[("sluicegate_predictor_calibration_misses", "ttft")] == 3
