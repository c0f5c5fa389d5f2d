"""HardwareAwarePredictor: one model per hardware class, the same model as today on a pool
of one class, donors for classes without a model, traces and files per class, metrics."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from lat_support import FAST, random_rows, samples
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from sluicegate.api.settings import LatencyPredictorSettings
from sluicegate.clock import ManualClock
from sluicegate.latency.features import Sample
from sluicegate.latency.hardware import HardwareAwarePredictor, configured_speeds
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.metrics import HardwarePredictorCollector
from sluicegate.latency.trace import TraceError, TraceWriter, load_trace, read_trace

H100, A100, L40S = "h100-80gb", "a100-80gb", "l40s-48gb"
SETTINGS = PredictorSettings(min_samples=100, train=FAST)
SLOWER = 3.0
"""How much slower the synthetic A100 is than the H100 (both targets)."""


def classed(items: list[Sample], cls: str | None, factor: float = 1.0) -> list[Sample]:
    """``items`` filed under ``cls``, their times multiplied by ``factor``."""
    return [
        Sample(
            s.row,
            None if s.ttft_ms is None else s.ttft_ms * factor,
            None if s.tpot_ms is None else s.tpot_ms * factor,
            cls,
        )
        for s in items
    ]


def trained(items: list[Sample], settings: PredictorSettings = SETTINGS) -> HardwareAwarePredictor:
    predictor = HardwareAwarePredictor(ManualClock(), settings)
    for s in items:
        predictor.observe(s)
    predictor.maybe_retrain()
    return predictor


@pytest.mark.parametrize("cls", [None, H100])
def test_a_pool_of_one_class_predicts_exactly_as_the_single_model(cls: str | None) -> None:
    data = samples(600, seed=3, sigma=0.1)
    single = InProcessPredictor(ManualClock(), SETTINGS)
    for s in data:
        single.observe(s)
    assert single.maybe_retrain()
    aware = trained(classed(data, cls))
    rows = random_rows(50, seed=9)
    expected = single.predict(rows)
    got = aware.predict(rows, None if cls is None else [cls] * len(rows))
    assert expected is not None
    assert got is not None
    np.testing.assert_array_equal(got.ttft_ms, expected.ttft_ms)
    np.testing.assert_array_equal(got.tpot_ms, expected.tpot_ms)
    assert aware.source_of(cls) == "model"
    assert aware.prediction_calls == 1  # one booster call per target, as before


def test_each_class_learns_its_own_speed_and_a_mixed_query_predicts_row_by_row() -> None:
    aware = trained(
        classed(samples(600, seed=1, sigma=0.05), H100)
        + classed(samples(600, seed=2, sigma=0.05), A100, SLOWER)
    )
    rows = random_rows(40, seed=11)
    fast = aware.predict(rows, [H100] * 40)
    slow = aware.predict(rows, [A100] * 40)
    mixed = aware.predict(rows, [H100 if i % 2 else A100 for i in range(40)])
    assert fast is not None
    assert slow is not None
    assert mixed is not None
    ratio = float(np.median(slow.ttft_ms / fast.ttft_ms))
    assert 2.4 < ratio < 3.6
    assert 2.4 < float(np.median(slow.tpot_ms / fast.tpot_ms)) < 3.6
    # The mixed query is one call per target of the merged models, predicting what each
    # class's own model does (to float32 rounding).
    odd = np.arange(40) % 2 == 1
    for got, one, two in (
        (mixed.ttft_ms, fast.ttft_ms, slow.ttft_ms),
        (mixed.tpot_ms, fast.tpot_ms, slow.tpot_ms),
    ):
        np.testing.assert_allclose(got[odd], one[odd], rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(got[~odd], two[~odd], rtol=1e-5, atol=1e-3)
    assert aware.merged_calls == 1
    # A class whose servers all left keeps its model; queries without it are unaffected.
    assert aware.predict(rows[:3], [H100] * 3) is not None


def test_a_class_never_seen_is_heuristic_then_configured_then_measured() -> None:
    base = classed(samples(400, seed=4, sigma=0.05), H100)
    blind = trained(base)
    rows = random_rows(10, seed=5)
    assert blind.source_of(A100) == "heuristic"
    assert blind.predict(rows, [H100] * 5 + [A100] * 5) is None  # → heuristic fallback
    configured = trained(
        base, replace(SETTINGS, class_speeds=configured_speeds({H100: 3.0, A100: 1.0}))
    )
    assert configured.source_of(A100) == "configured-ratio"
    own = configured.predict(rows, [H100] * 10)
    borrowed = configured.predict(rows, [A100] * 10)
    assert own is not None
    assert borrowed is not None
    np.testing.assert_allclose(borrowed.ttft_ms, own.ttft_ms * 3.0, rtol=1e-6)
    # 30 samples (≥ ratio_samples, < min_samples) of a class 2× slower: measured.
    for s in classed(samples(30, seed=6), L40S, 2.0):
        configured.observe(s)
    configured.maybe_retrain()
    assert configured.source_of(L40S) == "measured-ratio"
    assert configured.lanes[L40S].bundle is None
    got = configured.predict(rows, [L40S] * 10)
    assert got is not None
    assert 1.5 < float(np.median(got.ttft_ms / own.ttft_ms)) < 2.6


def test_classes_are_bounded() -> None:
    predictor = HardwareAwarePredictor(ManualClock(), replace(SETTINGS, max_classes=2))
    for i, cls in enumerate((H100, A100, L40S)):
        assert predictor.add(classed(samples(1, seed=i), cls)[0]) == (cls != L40S)
    assert list(predictor.lanes) == [H100, A100]
    assert predictor.refused_class_samples == 1


def test_a_class_idle_for_class_idle_s_gives_its_lane_to_a_new_class(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    predictor = HardwareAwarePredictor(clock, replace(SETTINGS, max_classes=2, class_idle_s=600.0))
    assert predictor.add(classed(samples(1, seed=0), H100)[0])
    assert predictor.add(classed(samples(1, seed=1), A100)[0])
    clock.set(500.0)
    assert predictor.add(classed(samples(1, seed=2), H100)[0])
    with caplog.at_level(logging.WARNING, logger="sluicegate.latency"):
        for _ in range(3):  # A100 idle for 500 s only: refused, logged once
            assert not predictor.add(classed(samples(1, seed=3), L40S)[0])
    assert [r.getMessage().count("refused") for r in caplog.records] == [1]
    assert predictor.refused_class_samples == 3
    clock.set(600.0)  # A100 (pods gone) idle 600 s: its lane goes to L40S
    assert predictor.add(classed(samples(1, seed=4), L40S)[0])
    assert list(predictor.lanes) == [H100, L40S]
    assert predictor.evicted_classes == 1
    registry = CollectorRegistry()
    registry.register(HardwarePredictorCollector(predictor))
    assert b"sluicegate_predictor_evicted_classes_total 1.0" in generate_latest(registry)
    clock.set(700.0)  # H100 idle only 200 s: A100 coming back is refused
    assert not predictor.add(classed(samples(1, seed=5), A100)[0])


def test_an_evicted_class_lends_its_models_no_more_and_leaves_the_merged_booster() -> None:
    settings = replace(
        SETTINGS, max_classes=2, class_speeds=configured_speeds({H100: 3.0, A100: 1.0})
    )
    aware = trained(
        classed(samples(300, seed=1), H100) + classed(samples(300, seed=2), A100, SLOWER),
        settings,
    )
    assert aware._merged is not None
    rows = random_rows(6, seed=3)
    assert aware.predict(rows, [H100] * 3 + [A100] * 3) is not None
    assert isinstance(aware.clock, ManualClock)
    aware.clock.set(1000.0)
    aware.add(classed(samples(1, seed=4), A100)[0])  # H100's pods are gone, A100's are not
    aware.clock.set(1000.0 + settings.class_idle_s)
    assert aware.add(classed(samples(1, seed=5), L40S)[0])
    assert list(aware.lanes) == [A100, L40S]
    assert aware._merged is None  # it held H100's boosters
    assert aware.source_of(H100) == "configured-ratio"  # from the A100's model now
    assert aware.predict(rows, [A100] * 3 + [L40S] * 3) is None  # L40S: no model, no speed
    mixed = aware.predict(rows, [A100] * 3 + [H100] * 3)
    assert mixed is not None
    own = aware.predict(rows[3:], [A100] * 3)
    assert own is not None
    np.testing.assert_allclose(mixed.ttft_ms[3:], own.ttft_ms / 3.0, rtol=1e-5)


def test_speeds_are_validated() -> None:
    with pytest.raises(ValueError, match="lower-case"):
        configured_speeds({"H100": 1.0})
    with pytest.raises(ValueError, match="positive"):
        configured_speeds({H100: 0.0})


def test_configured_class_speeds_are_normalized_at_load_and_build_the_predictor() -> None:
    loaded = LatencyPredictorSettings.model_validate(
        {"classSpeeds": {"NVIDIA-H100-80GB-HBM3": 3, "A100-SXM4-80GB": 1}}
    )
    speeds = configured_speeds(loaded.class_speeds)  # what the host does at start
    assert speeds == ((A100, 1.0), (H100, 3.0))
    HardwareAwarePredictor(ManualClock(), replace(SETTINGS, class_speeds=speeds))


@pytest.mark.parametrize(
    "speeds",
    [{"H100": 3, H100: 2}, {"H100 !": 3}, {H100: float("inf")}, {H100: 0}],
)
def test_bad_class_speeds_are_refused_at_load_naming_the_field(speeds: dict[str, float]) -> None:
    with pytest.raises(ValidationError, match="classSpeeds"):
        LatencyPredictorSettings.model_validate({"classSpeeds": speeds})


def test_a_trace_warm_starts_every_class(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path) as writer:
        writer.write_all(classed(samples(200, seed=1), H100))
        writer.write_all(classed(samples(200, seed=2), A100, SLOWER))
        writer.write_all(samples(150, seed=3))  # no class: the unnamed one
    assert {s.hardware_class for s in read_trace(path)} == {H100, A100, None}
    predictor = HardwareAwarePredictor(ManualClock(), SETTINGS)
    assert load_trace(path, predictor) == 550
    assert predictor.maybe_retrain()
    assert predictor.sources() == {H100: "model", A100: "model", "none": "model"}


def test_a_bad_class_in_a_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"kv_cache_percentage": 0.1, "input_token_length": 10, "num_request_waiting": 0,'
        ' "num_request_running": 1, "prefix_cache_score": 0, "ttft_ms": 5,'
        ' "hardware_class": "H100 80GB"}\n'
    )
    with pytest.raises(TraceError, match=r"bad.jsonl:1: hardware_class"):
        list(read_trace(path))


def test_models_are_saved_and_loaded_per_class(tmp_path: Path) -> None:
    aware = trained(
        classed(samples(300, seed=1), H100)
        + classed(samples(300, seed=2), A100, SLOWER)
        + samples(300, seed=3)
    )
    assert aware.save(tmp_path)
    assert (tmp_path / "bundle.json").exists()  # the unnamed class: today's layout
    assert (tmp_path / "classes" / A100 / "bundle.json").exists()
    loaded = HardwareAwarePredictor(ManualClock(), SETTINGS)
    assert loaded.load(tmp_path)
    rows = random_rows(8, seed=4)
    for cls in (H100, A100, None):
        a = aware.predict(rows, [cls] * 8)
        b = loaded.predict(rows, [cls] * 8)
        assert a is not None
        assert b is not None
        np.testing.assert_array_equal(a.ttft_ms, b.ttft_ms)


def test_metrics_say_what_predicts_each_class() -> None:
    aware = trained(
        classed(samples(300, seed=1), H100),
        replace(SETTINGS, class_speeds=configured_speeds({H100: 2.0, A100: 1.0})),
    )
    aware.add(classed(samples(1, seed=5), A100)[0])  # seen, far too few to measure
    aware.refresh_borrowing()
    registry = CollectorRegistry()
    registry.register(HardwarePredictorCollector(aware))
    text = generate_latest(registry).decode()
    line = 'sluicegate_predictor_latency_model_source{class="%s",source="%s"} 1.0'
    assert line % (H100, "model") in text
    assert line % (A100, "configured-ratio") in text
    assert 'sluicegate_predictor_latency_model_source{class="a100-80gb",source="model"} 0.0' in text
    assert 'sluicegate_predictor_class_samples{class="h100-80gb",target="ttft"}' in text
    assert "sluicegate_predictor_ready 1.0" in text


def test_a_borrowing_class_in_a_mixed_query_uses_the_merged_models_too() -> None:
    settings = replace(SETTINGS, class_speeds=configured_speeds({H100: 3.0, A100: 1.0}))
    aware = trained(
        classed(samples(300, seed=1), H100) + classed(samples(300, seed=2), L40S, 2.0), settings
    )
    rows = random_rows(6, seed=3)
    own = aware.predict(rows, [H100] * 6)
    mixed = aware.predict(rows, [H100, A100, L40S] * 2)
    assert own is not None
    assert mixed is not None
    assert aware.merged_calls == 1
    np.testing.assert_allclose(mixed.ttft_ms[1::3], own.ttft_ms[1::3] * 3.0, rtol=1e-5)


def test_boosters_that_cannot_be_merged_are_predicted_class_by_class() -> None:
    aware = trained(
        classed(samples(300, seed=1), H100) + classed(samples(300, seed=2, tpot=False), A100)
    )  # the A100 has no TPOT model: no merged models
    assert aware.predict(random_rows(4), [H100, A100, H100, A100]) is not None
    assert aware.merged_calls == 0


def later(predictor: HardwareAwarePredictor) -> None:
    """Move the predictor's clock one retraining interval on."""
    clock = predictor.clock
    assert isinstance(clock, ManualClock)
    clock.advance(SETTINGS.retrain_interval_s)


def test_a_class_that_gets_its_own_model_restarts_its_calibration() -> None:
    """Ratios measured against a donor's model times a ratio are that model's residuals:
    once the class has its own model they are forgotten (the scale they set was 4 on the
    heterogeneous pool's A100s, whose own model was nearly right); the other class's
    ratios, and the pool-wide counts, stay."""
    aware = trained(classed(samples(400, seed=4, sigma=0.05), H100))
    for s in classed(samples(30, seed=6), A100, SLOWER):
        aware.observe(s)
    aware.maybe_retrain()
    assert aware.source_of(A100) == "measured-ratio"
    calibration = aware.calibration
    assert calibration is not None
    for _ in range(200):  # routed on the borrowed model, 5× too optimistic
        calibration.of(A100).observe_ttft(10.0, 50.0)
        calibration.of(H100).observe_ttft(10.0, 20.0)
    assert calibration.of(A100).ttft.scale == 4.0  # at its bound
    assert calibration.of(H100).ttft.scale == pytest.approx(2.0)
    for s in classed(samples(200, seed=7), A100, SLOWER):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert aware.source_of(A100) == "model"
    assert calibration.of(A100).ttft.scale == 1.0
    assert calibration.of(A100).ttft.kept == 0
    assert calibration.of(A100).ttft.observations == 200  # the class's counter goes on
    assert calibration.of(H100).ttft.scale == pytest.approx(2.0)
    assert calibration.totals("ttft")[0] == 400


def test_a_retrained_class_keeps_its_calibration() -> None:
    """A class's own model retrained is the same model refreshed: its ratios stay (so a
    pool of one class is calibrated exactly as before)."""
    aware = trained(classed(samples(400, seed=4, sigma=0.05), H100))
    calibration = aware.calibration
    assert calibration is not None
    for _ in range(200):
        calibration.of(H100).observe_ttft(10.0, 20.0)
    for s in classed(samples(200, seed=8), H100):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert aware.lanes[H100].bundle is not None
    assert aware.lanes[H100].bundle.version == 2
    assert calibration.of(H100).ttft.scale == pytest.approx(2.0)
    assert calibration.of(H100).ttft.kept == 200


def test_a_class_with_a_configured_speed_restarts_when_it_trains() -> None:
    """A class with a configured speed is predicted (``configured-ratio``) before its
    first sample; when its first samples train its own model within one trainer
    interval, no refresh saw it as a lane, and its ratios must still restart."""
    speeds = configured_speeds({H100: 3.0, A100: 1.0})
    aware = trained(
        classed(samples(400, seed=4, sigma=0.05), H100), replace(SETTINGS, class_speeds=speeds)
    )
    assert A100 not in aware.lanes
    assert aware.source_of(A100) == "configured-ratio"
    calibration = aware.calibration
    assert calibration is not None
    for _ in range(200):  # routed on the H100 model × 3, 5× too optimistic
        calibration.of(A100).observe_ttft(10.0, 50.0)
    assert calibration.of(A100).ttft.scale == 4.0
    for s in classed(samples(200, seed=7), A100, SLOWER):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert aware.source_of(A100) == "model"
    assert calibration.of(A100).ttft.scale == 1.0
    assert calibration.of(A100).ttft.kept == 0


def test_a_class_whose_donor_changes_restarts_its_calibration() -> None:
    """A class measured against one donor (the only trained class) that then borrows a
    closer-speed class's model stays ``measured-ratio`` but is predicted by another
    model: its ratios restart."""
    speeds = configured_speeds({H100: 3.0, L40S: 1.5, A100: 1.0})
    aware = trained(
        classed(samples(400, seed=4, sigma=0.05), H100), replace(SETTINGS, class_speeds=speeds)
    )
    for s in classed(samples(30, seed=6), A100, SLOWER):
        aware.observe(s)
    aware.maybe_retrain()
    assert aware.source_of(A100) == "measured-ratio"
    calibration = aware.calibration
    assert calibration is not None
    for _ in range(200):
        calibration.of(A100).observe_ttft(10.0, 50.0)
    assert calibration.of(A100).ttft.scale == 4.0
    for s in classed(samples(200, seed=7), L40S, 2.0):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert aware.source_of(L40S) == "model"
    assert aware.source_of(A100) == "measured-ratio"  # its donor is the L40S now
    assert calibration.of(A100).ttft.scale == 1.0
    assert calibration.of(A100).ttft.kept == 0


def test_a_retrained_class_scores_later_tpot_outcomes_against_the_new_model() -> None:
    """After a retraining the TPOT ratios of the previous model are forgotten, its scale
    kept until new ratios arrive, and outcomes are scored against the model in use: a
    request routed on a prediction half of the truth counts as the new model's ratio."""
    aware = trained(classed(samples(400, seed=4, sigma=0.05), H100))
    calibration = aware.calibration
    assert calibration is not None
    calibration.see([H100, A100], aware.clock.now())  # a mixed pool
    trackers = calibration.of(H100)
    rows = random_rows(200, seed=9)
    model = aware.predict(rows, [H100] * len(rows))
    assert model is not None
    truth = [float(t) for t in model.tpot_ms]
    for row, tpot in zip(rows[:100], truth[:100], strict=True):
        trackers.observe_tpot(tpot / 2.0, tpot, row, H100)  # no model yet: against dispatch
    assert trackers.tpot.scale == pytest.approx(2.0, rel=0.01)
    for s in classed(samples(200, seed=8, sigma=0.05), H100):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert (trackers.tpot.kept, trackers.tpot.scale) == (0, pytest.approx(2.0, rel=0.01))
    for row, tpot in zip(rows[100:], truth[100:], strict=True):
        trackers.observe_tpot(tpot / 2.0, tpot, row, H100)
    assert trackers.tpot.kept == 100
    assert trackers.tpot.scale == pytest.approx(1.0, abs=0.15)
    assert trackers.tpot.observations == 200  # the counters go on


def test_a_pool_of_one_class_calibrates_tpot_against_the_model_at_dispatch() -> None:
    """Mixed, a retraining points the TPOT calibration at the model in use; once the pool
    is of one class again, the next one points it back at the prediction at dispatch."""
    aware = trained(classed(samples(400, seed=4, sigma=0.05), H100))
    calibration = aware.calibration
    assert calibration is not None
    calibration.see([H100, A100], aware.clock.now())
    trackers = calibration.of(H100)
    for s in classed(samples(200, seed=8, sigma=0.05), H100):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert trackers.tpot_model is not None
    calibration.see([H100], aware.clock.now() + 3600.0)  # the A100s left long ago
    assert not calibration.mixed
    for s in classed(samples(200, seed=10, sigma=0.05), H100):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()
    assert trackers.tpot_model is None
    for row in random_rows(100, seed=9):
        trackers.observe_tpot(10.0, 20.0, row, H100)
    assert (trackers.tpot.kept, trackers.tpot.scale) == (100, pytest.approx(2.0))


def test_a_retraining_rebases_the_classes_it_changed_and_their_borrowers() -> None:
    """Each lane trains on its own schedule: a retraining of the H100s' model forgets the
    H100 TPOT ratios, not those of a class with a model of its own that did not change."""
    aware = trained(
        classed(samples(400, seed=4, sigma=0.05), H100)
        + classed(samples(400, seed=5, sigma=0.05), A100)
    )
    calibration = aware.calibration
    assert calibration is not None
    calibration.see([H100, A100], aware.clock.now())
    assert aware.source_of(A100) == "model"
    for cls in (H100, A100):
        for row in random_rows(60, seed=2):
            calibration.of(cls).observe_tpot(10.0, 20.0, row, cls)
    for s in classed(samples(200, seed=8, sigma=0.05), H100):
        aware.observe(s)
    later(aware)
    assert aware.maybe_retrain()  # only the H100 lane has new samples
    assert calibration.of(H100).tpot.kept == 0
    assert calibration.of(A100).tpot.kept == 60
