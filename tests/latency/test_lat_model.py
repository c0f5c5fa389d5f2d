"""Training, scoring, prediction and save/load of the TTFT/TPOT model bundle."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb
from lat_support import FAST, random_rows, samples, true_ttft

from sluicegate.latency.features import FEATURE_NAMES, feature_matrix
from sluicegate.latency.model import (
    ModelBundle,
    TrainConfig,
    TrainingData,
    calibration_scale,
    scores,
    train_bundle,
)
from sluicegate.latency.store import SampleStore
from sluicegate.latency.xgbfast import _wrapper_predict, dense_predictor


def store_of(n: int, seed: int = 0, sigma: float = 0.0, tpot: bool = True) -> SampleStore:
    store = SampleStore()
    for s in samples(n, seed, sigma, tpot):
        store.add(s)
    return store


@pytest.fixture(scope="module")
def noisy_store() -> SampleStore:
    return store_of(8000, seed=11, sigma=0.3)


@pytest.fixture(scope="module")
def quantile_bundle(noisy_store: SampleStore) -> ModelBundle:
    bundle = train_bundle(TrainingData.snapshot(noisy_store), FAST, 12.5, 3)
    assert bundle is not None
    return bundle


def test_mean_model_learns_a_known_function_to_a_low_mape() -> None:
    store = store_of(6000, seed=1, sigma=0.02)
    config = replace(FAST, objective="mean", n_estimators=150)
    bundle = train_bundle(TrainingData.snapshot(store), config, 0.0, 1)
    assert bundle is not None
    assert bundle.objective == "mean"
    assert bundle.alpha is None
    assert bundle.ttft.mape is not None
    assert bundle.ttft.mape < 0.06, bundle.describe()
    assert bundle.tpot is not None
    assert bundle.tpot.mape is not None
    assert bundle.tpot.mape < 0.05
    # Fresh rows, never seen.
    rows = random_rows(500, seed=99)
    predicted = bundle.predict(feature_matrix(rows)).ttft_ms
    truth = np.array([true_ttft(r) for r in rows])
    assert float(np.mean(np.abs(predicted - truth) / truth)) < 0.08


def test_quantile_model_covers_about_alpha_of_noisy_data(quantile_bundle: ModelBundle) -> None:
    b = quantile_bundle
    assert b.objective == "quantile"
    assert b.alpha == 0.9
    assert b.ttft.test_samples > 300  # half the held-out samples (the others calibrate)
    assert b.ttft.coverage is not None
    assert 0.82 <= b.ttft.coverage <= 0.96, b.describe()
    assert b.tpot is not None
    assert b.tpot.coverage is not None
    assert 0.82 <= b.tpot.coverage <= 0.96
    # On fresh data too, and above the median: predictions are p90s.
    fresh = samples(3000, seed=1234, sigma=0.3)
    predicted = b.predict(feature_matrix([s.row for s in fresh])).ttft_ms
    observed = np.array([s.ttft_ms for s in fresh])
    assert 0.84 <= float(np.mean(observed <= predicted)) <= 0.95


def test_other_alpha_moves_the_coverage(noisy_store: SampleStore) -> None:
    config = replace(FAST, alpha=0.5)
    bundle = train_bundle(TrainingData.snapshot(noisy_store), config, 0.0, 1)
    assert bundle is not None
    assert bundle.ttft.coverage is not None
    assert 0.4 <= bundle.ttft.coverage <= 0.6


def test_metadata(quantile_bundle: ModelBundle) -> None:
    meta = quantile_bundle.describe()
    assert meta["trained_at"] == 12.5
    assert meta["version"] == 3
    assert meta["feature_names"] == list(FEATURE_NAMES)
    assert meta["targets"]["ttft"]["samples"] == quantile_bundle.ttft.samples > 6000
    assert quantile_bundle.ttft.booster.num_boosted_rounds() == 60


def test_predictions_are_clipped_at_zero_and_float32(quantile_bundle: ModelBundle) -> None:
    out = quantile_bundle.predict(feature_matrix(random_rows(50, seed=3)))
    assert out.ttft_ms.dtype == np.float32
    assert out.ttft_ms.shape == out.tpot_ms.shape == (50,)
    assert (out.ttft_ms >= 0).all()
    empty = quantile_bundle.predict(feature_matrix([]))
    assert empty.ttft_ms.shape == (0,)


def test_fast_prediction_equals_inplace_predict(quantile_bundle: ModelBundle) -> None:
    booster = quantile_bundle.ttft.booster
    fast = dense_predictor(booster)
    slow = _wrapper_predict(booster)
    for n in (1, 10, 100, 1000):
        x = feature_matrix(random_rows(n, seed=n))
        assert np.array_equal(fast(x), slow(x))
        assert np.array_equal(fast(x), booster.inplace_predict(x))
    # Two boosters taking turns on this thread's proxy DMatrix, sizes changing.
    assert quantile_bundle.tpot is not None
    other = quantile_bundle.tpot.booster
    fast_other = dense_predictor(other)
    for n in (7, 300, 1, 64, 65):
        x = feature_matrix(random_rows(n, seed=100 + n))
        assert np.array_equal(fast(x), booster.inplace_predict(x))
        assert np.array_equal(fast_other(x), other.inplace_predict(x))
    # Not float32 / not contiguous: the fallback answers the same.
    x = feature_matrix(random_rows(20, seed=7))
    assert np.array_equal(fast(x.astype(np.float64)), slow(x))
    wide = np.zeros((20, 2 * x.shape[1]), dtype=np.float32)
    wide[:, ::2] = x
    assert np.array_equal(fast(wide[:, ::2]), slow(x))


def test_training_is_deterministic() -> None:
    store = store_of(3000, seed=5, sigma=0.2)
    a = train_bundle(TrainingData.snapshot(store), FAST, 0.0, 1)
    b = train_bundle(TrainingData.snapshot(store), FAST, 0.0, 1)
    assert a is not None
    assert b is not None
    x = feature_matrix(random_rows(200, seed=8))
    assert np.array_equal(a.predict(x).ttft_ms, b.predict(x).ttft_ms)
    assert np.array_equal(a.predict(x).tpot_ms, b.predict(x).tpot_ms)


def test_save_load_round_trip_predicts_identically(
    quantile_bundle: ModelBundle, tmp_path: Path
) -> None:
    quantile_bundle.save(tmp_path / "models")
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        "bundle.json",
        "tpot.json",
        "ttft.json",
    ]
    loaded = ModelBundle.load(tmp_path / "models")
    x = feature_matrix(random_rows(300, seed=21))
    a, b = quantile_bundle.predict(x), loaded.predict(x)
    assert np.array_equal(a.ttft_ms, b.ttft_ms)
    assert np.array_equal(a.tpot_ms, b.tpot_ms)
    assert loaded.describe() == quantile_bundle.describe()


def test_load_refuses_mixed_or_foreign_files(quantile_bundle: ModelBundle, tmp_path: Path) -> None:
    quantile_bundle.save(tmp_path)
    other = train_bundle(TrainingData.snapshot(store_of(500, seed=2)), FAST, 0.0, 1)
    assert other is not None
    other_dir = tmp_path / "other"
    other.save(other_dir)
    (tmp_path / "ttft.json").write_bytes((other_dir / "ttft.json").read_bytes())
    with pytest.raises(ValueError, match="checksum"):
        ModelBundle.load(tmp_path)

    meta = json.loads((other_dir / "bundle.json").read_text())
    meta["feature_names"] = ["a", "b"]
    (other_dir / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="features"):
        ModelBundle.load(other_dir)

    with pytest.raises(FileNotFoundError):
        ModelBundle.load(tmp_path / "nothing-here")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "bundle.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        ModelBundle.load(tmp_path / "junk")


def test_without_tpot_samples_tpot_is_predicted_zero(tmp_path: Path) -> None:
    store = store_of(400, seed=6, tpot=False)
    bundle = train_bundle(TrainingData.snapshot(store), FAST, 0.0, 1)
    assert bundle is not None
    assert bundle.tpot is None
    out = bundle.predict(feature_matrix(random_rows(5)))
    assert (out.tpot_ms == 0).all()
    assert (out.ttft_ms > 0).all()
    bundle.save(tmp_path)
    assert not (tmp_path / "tpot.json").exists()
    assert ModelBundle.load(tmp_path).tpot is None


def test_min_samples_and_previous_tpot_model() -> None:
    store = store_of(150, seed=7)
    data = TrainingData.snapshot(store)
    assert train_bundle(data, FAST, 0.0, 1, min_samples=1000) is None
    first = train_bundle(data, FAST, 0.0, 1, min_samples=100)
    assert first is not None
    assert first.tpot is not None
    ttft_only = store_of(150, seed=8, tpot=False)
    second = train_bundle(TrainingData.snapshot(ttft_only), FAST, 1.0, 2, first, 100)
    assert second is not None
    assert second.tpot is first.tpot  # kept, not dropped


def test_scores() -> None:
    y = np.array([10.0, 20.0, 40.0, 0.0], dtype=np.float32)
    p = np.array([11.0, 18.0, 40.0, 5.0], dtype=np.float32)
    mape, coverage = scores(y, p)
    assert mape == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert coverage == pytest.approx(2 / 3)
    assert scores(np.zeros(0, np.float32), np.zeros(0, np.float32)) == (None, None)


def test_config_validation_and_params() -> None:
    with pytest.raises(ValueError, match="objective"):
        TrainConfig(objective="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        TrainConfig(alpha=1.0)
    params = TrainConfig().xgb_params()
    assert params["objective"] == "reg:quantileerror"
    assert params["quantile_alpha"] == 0.9
    assert params["tree_method"] == "hist"
    assert (params["max_depth"], params["eta"], params["gamma"]) == (6, 0.05, 0.2)
    assert (params["alpha"], params["lambda"], params["min_child_weight"]) == (0.01, 0.1, 5.0)
    assert "quantile_alpha" not in TrainConfig(objective="mean").xgb_params()
    assert TrainConfig(objective="mean").xgb_params()["objective"] == "reg:squarederror"


def test_prediction_uses_one_thread(quantile_bundle: ModelBundle) -> None:
    config = json.loads(quantile_bundle.ttft.booster.save_config())
    assert config["learner"]["generic_param"]["nthread"] == "1"
    assert isinstance(quantile_bundle.ttft.booster, xgb.Booster)


def test_calibration_scale_puts_alpha_of_samples_below() -> None:
    rng = np.random.default_rng(3)
    predicted = rng.uniform(10.0, 100.0, 2000)
    y = predicted * rng.lognormal(0.0, 0.2, 2000) * 1.3  # the model is 30 % low
    scale = calibration_scale(y, predicted, 0.9)
    assert float(np.mean(y <= predicted)) < 0.5
    assert abs(float(np.mean(y <= predicted * scale)) - 0.9) < 0.01
    assert calibration_scale(y, predicted * 100.0, 0.9) == 0.25  # clamped
    assert calibration_scale(np.zeros(3), np.ones(3), 0.9) == 1.0


def test_uncalibrated_and_mean_models_have_no_scale(noisy_store: SampleStore) -> None:
    data = TrainingData.snapshot(noisy_store)
    for config in (replace(FAST, calibrate=False), replace(FAST, objective="mean")):
        bundle = train_bundle(data, config, 0.0, 1)
        assert bundle is not None
        assert bundle.ttft.scale == 1.0
        assert bundle.ttft.test_samples > 600  # all held-out samples score


def test_scale_is_saved_and_old_bundles_load_unscaled(
    quantile_bundle: ModelBundle, tmp_path: Path
) -> None:
    assert quantile_bundle.ttft.scale != 1.0
    x = feature_matrix(random_rows(20, seed=8))
    quantile_bundle.save(tmp_path)
    loaded = ModelBundle.load(tmp_path)
    assert loaded.ttft.scale == quantile_bundle.ttft.scale
    assert np.array_equal(loaded.predict(x).ttft_ms, quantile_bundle.predict(x).ttft_ms)
    meta = json.loads((tmp_path / "bundle.json").read_text())
    for target in meta["targets"].values():
        target.pop("scale")  # as written before calibration existed
    (tmp_path / "bundle.json").write_text(json.dumps(meta))
    raw = ModelBundle.load(tmp_path)
    assert raw.ttft.scale == 1.0
    expected = np.maximum(quantile_bundle.ttft.booster.inplace_predict(x), 0.0)
    np.testing.assert_allclose(raw.predict(x).ttft_ms, expected, rtol=1e-6)
    meta["targets"]["ttft"]["scale"] = -1.0
    (tmp_path / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="bad ttft scale"):
        ModelBundle.load(tmp_path)
