"""Online calibration of quantile predictions: the tracker's promise (a share α of routed
outcomes at or below the scaled prediction), its window and its bounds."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest
from lat_support import random_rows

from sluicegate.latency.calibration import LatencyCalibration, QuantileTracker
from sluicegate.latency.features import FeatureRow


def coverage(tracker: QuantileTracker, rng: random.Random, draw, n: int) -> float:
    """Share of ``n`` fresh outcomes at or below the scaled prediction (1.0)."""
    return sum(draw(rng) <= tracker.scale for _ in range(n)) / n


def test_an_optimistic_model_is_scaled_up_to_alpha() -> None:
    """The model predicts the median (half of the outcomes above it): after a few thousand
    routed requests the scaled prediction covers α of them."""
    rng = random.Random(1)

    def draw(r: random.Random) -> float:
        return r.lognormvariate(0.0, 0.5)  # median 1.0

    tracker = QuantileTracker(alpha=0.9)
    for _ in range(5000):
        tracker.update(1.0, draw(rng))
    assert tracker.scale == pytest.approx(math.exp(0.5 * 1.2816), rel=0.15)  # the true p90
    assert coverage(tracker, rng, draw, 20_000) == pytest.approx(0.9, abs=0.03)


def test_a_pessimistic_model_is_scaled_down() -> None:
    rng = random.Random(2)

    def draw(r: random.Random) -> float:
        return r.uniform(0.0, 0.8)  # the prediction 1.0 covers everything; p90 0.72

    tracker = QuantileTracker(alpha=0.9)
    for _ in range(5000):
        tracker.update(1.0, draw(rng))
    assert tracker.scale == pytest.approx(0.72, rel=0.1)
    assert coverage(tracker, rng, draw, 20_000) == pytest.approx(0.9, abs=0.03)


def test_a_calibrated_model_keeps_its_scale() -> None:
    rng = random.Random(3)
    p90 = math.exp(0.5 * 1.2816)
    tracker = QuantileTracker(alpha=0.9)
    for _ in range(5000):
        tracker.update(p90, rng.lognormvariate(0.0, 0.5))
    assert tracker.scale == pytest.approx(1.0, abs=0.15)
    assert tracker.observations == 5000
    assert tracker.misses / tracker.observations == pytest.approx(0.1, abs=0.02)


def test_the_scale_follows_a_shift_in_load() -> None:
    """Latency doubles (the pool saturates): within a few hundred requests the scale has
    moved most of the way."""
    rng = random.Random(4)
    tracker = QuantileTracker(alpha=0.9)
    for _ in range(3000):
        tracker.update(1.0, rng.uniform(0.8, 1.0))
    before = tracker.scale
    for _ in range(500):
        tracker.update(1.0, rng.uniform(1.6, 2.0))
    assert tracker.scale > 1.8 * before * 0.9


def test_the_window_of_ratios_is_bounded() -> None:
    tracker = QuantileTracker(alpha=0.9, window=100)
    for i in range(5000):
        tracker.update(1.0, float(i % 7))
    assert tracker.kept == 100
    assert tracker.observations == 5000


def test_the_scale_waits_for_enough_observations() -> None:
    tracker = QuantileTracker(alpha=0.9, min_observations=50, refresh_every=1)
    for _ in range(49):
        tracker.update(1.0, 3.0)
    assert tracker.scale == 1.0
    tracker.update(1.0, 3.0)
    assert tracker.scale == pytest.approx(3.0)


def test_the_scale_is_bounded() -> None:
    tracker = QuantileTracker(alpha=0.9, min_scale=0.5, max_scale=4.0)
    for _ in range(10_000):
        tracker.update(1.0, 1000.0)
    assert tracker.scale == pytest.approx(4.0)
    for _ in range(100_000):
        tracker.update(1.0, 0.0)
    assert tracker.scale == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("predicted", "observed"),
    [(0.0, 1.0), (-1.0, 1.0), (1.0, -1.0), (math.nan, 1.0), (1.0, math.inf), (1e-300, 1e300)],
)
def test_unusable_observations_are_ignored(predicted: float, observed: float) -> None:
    tracker = QuantileTracker(alpha=0.9)
    tracker.update(predicted, observed)
    assert tracker.observations == 0
    assert tracker.scale == 1.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="alpha"):
        QuantileTracker(alpha=1.0)
    with pytest.raises(ValueError, match="window"):
        QuantileTracker(alpha=0.9, window=0)
    with pytest.raises(ValueError, match="min_scale"):
        QuantileTracker(alpha=0.9, min_scale=2.0)


def test_each_target_has_its_own_tracker() -> None:
    calibration = LatencyCalibration(alpha=0.8)
    for _ in range(100):
        calibration.ttft.update(1.0, 5.0)
    assert calibration.ttft.scale > 1.0
    assert calibration.tpot.scale == 1.0
    assert calibration.tpot.alpha == 0.8


def test_a_restarted_class_forgets_its_ratios_but_not_its_counts() -> None:
    calibration = LatencyCalibration(0.9, max_classes=4)
    for _ in range(110):
        calibration.of("a100-80gb").observe_ttft(10.0, 50.0)
        calibration.of("a100-80gb").tpot.update(10.0, 30.0)
    assert calibration.of("a100-80gb").ttft.scale == 4.0
    assert not calibration.restart("h100-80gb")  # no trackers: nothing to restart
    assert calibration.restart("a100-80gb")
    trackers = calibration.of("a100-80gb")
    assert (trackers.ttft.scale, trackers.tpot.scale, trackers.ttft.kept) == (1.0, 1.0, 0)
    assert (trackers.ttft.observations, trackers.ttft.misses) == (110, 110)  # counters go on
    assert calibration.totals("ttft") == (110, 110)
    assert calibration.totals("tpot")[0] == 110
    fresh = QuantileTracker(alpha=0.9)
    for _ in range(80):  # from here on it scales exactly as a new tracker does
        trackers.ttft.update(10.0, 20.0)
        fresh.update(10.0, 20.0)
        assert trackers.ttft.scale == fresh.scale
    assert trackers.ttft.scale == pytest.approx(2.0)


def test_tpot_outcomes_are_scored_against_the_model_in_use_after_a_rebase() -> None:
    calibration = LatencyCalibration(0.9)
    trackers = calibration.pool
    rows = random_rows(120, seed=3)
    for row in rows:
        trackers.observe_tpot(10.0, 30.0, row)
    assert (trackers.tpot.scale, trackers.tpot.kept) == (3.0, 120)
    calibration.rebase_tpot(lambda rows, cls: [60.0] * len(rows), [None])
    assert (trackers.tpot.scale, trackers.tpot.kept) == (3.0, 0)  # kept until recomputed
    for row in rows[:59]:
        trackers.observe_tpot(10.0, 30.0, row)
    assert trackers.tpot.scale == 3.0  # first recomputed at 60 (≥ 50, a multiple of 20)
    trackers.observe_tpot(10.0, 30.0, rows[59])
    assert trackers.tpot.scale == 0.5  # 30 / 60, the model in use, not 30 / 10
    calibration.rebase_tpot(lambda rows, cls: [0.0] * len(rows), [None])  # cannot say
    for row in rows:
        trackers.observe_tpot(10.0, 30.0, row)
    assert trackers.tpot.scale == 3.0  # at dispatch


def test_tpot_outcomes_scored_in_batches_move_the_scale_as_one_at_a_time() -> None:
    """One model call per class in a batch, fewer than ``refresh_every`` waiting, and the
    scale and counters exactly those of scoring each outcome on arrival — also with
    outcomes the tracker ignores (NaN, negative) and a model that cannot say for some."""
    calls: list[tuple[str | None, int]] = []

    def model(rows: Sequence[FeatureRow], cls: str | None) -> list[float]:
        calls.append((cls, len(rows)))
        return [
            0.0 if row.num_request_waiting % 7 == 0 else 10.0 + row.num_request_waiting
            for row in rows
        ]

    batched = LatencyCalibration(0.9, max_classes=4)
    batched.rebase_tpot(model, [])
    one_by_one = QuantileTracker(alpha=0.9)
    trackers = batched.of("h100")  # a class first seen after the rebase: scored too
    rng = random.Random(5)
    for i, row in enumerate(random_rows(300, seed=6)):
        observed = rng.uniform(5.0, 40.0)
        if i % 37 == 5:
            observed = math.nan
        elif i % 41 == 7:
            observed = -1.0
        trackers.observe_tpot(99.0, observed, row, "h100")
        in_use = 10.0 + row.num_request_waiting
        one_by_one.update(99.0 if row.num_request_waiting % 7 == 0 else in_use, observed)
        assert len(trackers._pending_tpot) < trackers.tpot.refresh_every
        assert trackers.tpot.scale == one_by_one.scale  # at every step
    trackers.flush_tpot()
    assert (trackers.tpot.scale, trackers.tpot.observations, trackers.tpot.misses) == (
        one_by_one.scale,
        one_by_one.observations,
        one_by_one.misses,
    )
    assert {cls for cls, _ in calls} == {"h100"}
    assert max(n for _, n in calls) == 20


def test_a_shared_tracker_scores_each_outcome_against_its_own_class_model() -> None:
    """Classes beyond ``max_classes`` share the unnamed class's trackers: each waiting
    outcome is scored against its own class's model."""
    calibration = LatencyCalibration(0.9, max_classes=1)
    calibration.of("h100")
    calibration.rebase_tpot(lambda rows, cls: [{"l40s": 40.0, None: 10.0}[cls]] * len(rows), [])
    pool = calibration.of("l40s")
    assert pool is calibration.pool
    for row in random_rows(60, seed=4):
        pool.observe_tpot(5.0, 40.0, row, "l40s")
    assert pool.tpot.scale == 1.0  # 40 / 40, not 40 / 10


def test_a_model_that_fails_scores_the_waiting_outcomes_at_dispatch() -> None:
    def broken(rows: Sequence[FeatureRow], cls: str | None) -> list[float]:
        raise RuntimeError("booster gone")

    calibration = LatencyCalibration(0.9)
    calibration.rebase_tpot(broken, [None])
    for row in random_rows(60, seed=4):
        calibration.pool.observe_tpot(10.0, 20.0, row)
    assert (calibration.pool.tpot.observations, calibration.pool.tpot.scale) == (60, 2.0)


def test_a_rebase_forgets_only_the_changed_classes_ratios() -> None:
    calibration = LatencyCalibration(0.9, max_classes=4)
    for cls in ("h100", "a100"):
        for row in random_rows(60, seed=1):
            calibration.of(cls).observe_tpot(10.0, 20.0, row)
    waiting: list[tuple[str | None, int]] = []
    calibration.rebase_tpot(lambda rows, cls: [20.0] * len(rows), [])
    for row in random_rows(3, seed=2):  # waiting when the next model comes
        calibration.of("a100").observe_tpot(10.0, 20.0, row, "a100")

    def next_model(rows: Sequence[FeatureRow], cls: str | None) -> list[float]:
        waiting.append((cls, len(rows)))
        return [40.0] * len(rows)

    calibration.rebase_tpot(next_model, ["a100"])
    assert calibration.of("h100").tpot.kept == 60  # its model did not change
    assert calibration.of("a100").tpot.kept == 0
    assert calibration.of("a100").tpot.observations == 63  # the 3 scored by the old model
    assert waiting == []


def test_waiting_tpot_outcomes_count_through_a_restart_and_back_to_dispatch() -> None:
    calibration = LatencyCalibration(0.9, max_classes=4)
    calibration.rebase_tpot(lambda rows, cls: [20.0] * len(rows), [])
    for row in random_rows(7, seed=2):
        calibration.of("a100").observe_tpot(10.0, 30.0, row, "a100")
    assert calibration.restart("a100")
    assert calibration.of("a100").tpot.observations == 7  # scored, then carried over
    for row in random_rows(5, seed=3):
        calibration.of("a100").observe_tpot(10.0, 30.0, row, "a100")
    calibration.score_tpot_at_dispatch()
    assert calibration.totals("tpot")[0] == 12
    assert calibration.of("a100").tpot_model is None
