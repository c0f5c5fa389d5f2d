"""TTFT and TPOT models: XGBoost boosters trained from the sample window.

Parameters follow the reference predictor (source below): 200 trees of depth ≤ 6,
learning rate 0.05, row and column subsampling 0.8, ``min_child_weight`` 5, ``gamma`` 0.2,
L1 0.01, L2 0.1, ``hist`` trees, seed 42. The objective is the α-quantile
(``reg:quantileerror``, α = 0.9 by default: predictions are p90 latencies) or the mean
(``reg:squarederror``). TPOT models see the same row as TTFT models (our features have no
tokens-generated column, which the reference zeroes for TPOT anyway). Quantile models
are calibrated on half of the held-out samples (a factor on their output, see
:func:`calibration_scale`) and scored on the other half.
Reference predictor: https://github.com/llm-d/llm-d-latency-predictor/blob/04e44cd8/training/training_server.py

A :class:`ModelBundle` holds both boosters and what is known about them; it is immutable
once built, so swapping a whole bundle by assignment is atomic for readers. It predicts
with one ``inplace_predict`` per target for all rows, single-threaded (prediction happens
on the request path, many at a time). :meth:`ModelBundle.save` writes XGBoost JSON per
target and ``bundle.json`` (metadata with each file's size and SHA-256, so a bundle made of
files from two trainings is refused at load).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import xgboost as xgb

from sluicegate.latency.features import FEATURE_NAMES
from sluicegate.latency.predictor import Predictions
from sluicegate.latency.store import Part, SampleStore, stack
from sluicegate.latency.xgbfast import Predict, dense_predictor

Objective = Literal["quantile", "mean"]
TARGETS: tuple[str, str] = ("ttft", "tpot")
META_FILE = "bundle.json"
FORMAT = 1


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Objective and XGBoost parameters (defaults: the reference's)."""

    objective: Objective = "quantile"
    alpha: float = 0.9
    """Quantile predicted with the quantile objective (0 < α < 1)."""
    n_estimators: int = 200
    max_depth: int = 6
    learning_rate: float = 0.05
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    min_child_weight: float = 5.0
    gamma: float = 0.2
    reg_alpha: float = 0.01
    reg_lambda: float = 0.1
    seed: int = 42
    nthread: int = 1
    """Training threads. 1 is deterministic and leaves the other cores to the gateway."""
    calibrate: bool = True
    """Quantile objective: scale predictions so that α of the held-out samples lie at or
    below them (see :func:`calibration_scale`)."""

    def __post_init__(self) -> None:
        if self.objective not in ("quantile", "mean"):
            raise ValueError(f"objective must be 'quantile' or 'mean', got {self.objective!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.n_estimators < 1 or self.max_depth < 1 or self.nthread < 1:
            raise ValueError("n_estimators, max_depth and nthread must be at least 1")

    def xgb_params(self) -> dict[str, Any]:
        """The parameter dict for ``xgboost.train``."""
        params: dict[str, Any] = {
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "gamma": self.gamma,
            "alpha": self.reg_alpha,
            "lambda": self.reg_lambda,
            "tree_method": "hist",
            "seed": self.seed,
            "nthread": self.nthread,
            "verbosity": 1,
        }
        if self.objective == "quantile":
            params["objective"] = "reg:quantileerror"
            params["quantile_alpha"] = self.alpha
        else:
            params["objective"] = "reg:squarederror"
        return params


@dataclass(frozen=True, slots=True)
class TargetModel:
    """One target's booster and its held-out scores."""

    booster: xgb.Booster
    samples: int
    """Training samples it was fitted on."""
    test_samples: int
    """Held-out samples it was scored on (0: no scores)."""
    mape: float | None
    """Mean absolute percentage error on the held-out set, as a fraction (0.1 = 10 %)."""
    coverage: float | None
    """Share of held-out samples at or below the prediction (≈ α for a calibrated
    quantile model; ≈ 0.5 for a mean model of symmetric noise)."""
    scale: float = 1.0
    """Factor applied to the booster's output (the quantile calibration; 1: none)."""

    _predict: Predict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_predict", dense_predictor(self.booster))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predictions in ms (float32, clipped at 0) for a float32 feature matrix (one
        single-threaded ``inplace_predict``)."""
        if len(x) == 0:
            return np.empty(0, dtype=np.float32)
        out = self._predict(x)
        if self.scale != 1.0:
            out *= np.float32(self.scale)
        return np.maximum(out, 0.0, out=out)


@dataclass(frozen=True, slots=True)
class TrainingData:
    """A snapshot of the sample window: per target, the training buckets' and the
    held-out ``(X, y)`` views (unchanging; see :meth:`SampleSet.training_parts`)."""

    ttft_parts: list[Part]
    ttft_test: Part
    tpot_parts: list[Part]
    tpot_test: Part

    @classmethod
    def snapshot(cls, store: SampleStore) -> TrainingData:
        """Take it on the thread that adds samples (O(buckets), no copy); read it anywhere."""
        return cls(
            store.ttft.training_parts(),
            store.ttft.test_part(),
            store.tpot.training_parts(),
            store.tpot.test_part(),
        )

    @property
    def ttft_count(self) -> int:
        return sum(len(y) for _, y in self.ttft_parts)

    @property
    def tpot_count(self) -> int:
        return sum(len(y) for _, y in self.tpot_parts)


@dataclass(frozen=True, slots=True)
class ModelBundle:
    """The TTFT and TPOT models in use, and how they were made. Immutable."""

    ttft: TargetModel
    tpot: TargetModel | None
    """None until there are TPOT samples (non-streaming traffic has none); TPOT is then
    predicted as 0."""
    objective: Objective
    alpha: float | None
    """The predicted quantile (None for the mean objective)."""
    trained_at: float
    """Clock time of the training, seconds (the gateway's or simulation's clock)."""
    version: int
    """Counts trainings of the predictor that made it (1 = first)."""

    def predict(self, x: np.ndarray) -> Predictions:
        """TTFT and TPOT in ms for every row of a feature matrix (one booster call each)."""
        ttft = self.ttft.predict(x)
        tpot = self.tpot.predict(x) if self.tpot is not None else np.zeros(len(x), np.float32)
        return Predictions(ttft, tpot)

    def describe(self) -> dict[str, Any]:
        """Metadata as JSON-able values (no boosters)."""
        return {
            "format": FORMAT,
            "model_type": "xgboost",
            "objective": self.objective,
            "alpha": self.alpha,
            "trained_at": self.trained_at,
            "version": self.version,
            "feature_names": list(FEATURE_NAMES),
            "targets": {
                name: None
                if model is None
                else {
                    "samples": model.samples,
                    "test_samples": model.test_samples,
                    "mape": model.mape,
                    "coverage": model.coverage,
                    "scale": model.scale,
                }
                for name, model in (("ttft", self.ttft), ("tpot", self.tpot))
            },
        }

    # ------------------------------------------------------------------ files

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write ``ttft.json``, ``tpot.json`` (XGBoost JSON) and ``bundle.json`` into
        ``directory`` (created if needed). Each file is replaced atomically; the metadata
        goes last and names the boosters' SHA-256."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        meta = self.describe()
        for name, model in (("ttft", self.ttft), ("tpot", self.tpot)):
            target_path = path / f"{name}.json"
            if model is None:
                target_path.unlink(missing_ok=True)
                continue
            data = bytes(model.booster.save_raw("json"))
            _write_atomic(target_path, data)
            meta["targets"][name]["file"] = target_path.name
            meta["targets"][name]["size"] = len(data)
            meta["targets"][name]["sha256"] = hashlib.sha256(data).hexdigest()
        _write_atomic(path / META_FILE, orjson.dumps(meta, option=orjson.OPT_INDENT_2))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ModelBundle:
        """Read a bundle written by :meth:`save`.

        Raises ``FileNotFoundError`` when there is none, ``ValueError`` when it is
        inconsistent (another feature schema, a booster whose checksum does not match the
        metadata) or does not load.
        """
        path = Path(directory)
        try:
            meta = orjson.loads((path / META_FILE).read_bytes())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path / META_FILE}: not JSON: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{path / META_FILE}: unknown bundle format")
        if meta.get("feature_names") != list(FEATURE_NAMES):
            raise ValueError(
                f"{path}: trained on features {meta.get('feature_names')}, "
                f"these are {list(FEATURE_NAMES)}"
            )
        targets = meta.get("targets") or {}
        models: dict[str, TargetModel | None] = {}
        for name in TARGETS:
            info = targets.get(name)
            models[name] = None if info is None else _load_target(path, name, info)
        ttft = models["ttft"]
        if ttft is None:
            raise ValueError(f"{path / META_FILE}: no TTFT model")
        objective = meta.get("objective")
        if objective not in ("quantile", "mean"):
            raise ValueError(f"{path / META_FILE}: unknown objective {objective!r}")
        return cls(
            ttft=ttft,
            tpot=models["tpot"],
            objective=objective,
            alpha=meta.get("alpha"),
            trained_at=float(meta.get("trained_at", 0.0)),
            version=int(meta.get("version", 0)),
        )


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _load_target(path: Path, name: str, info: dict[str, Any]) -> TargetModel:
    file = path / str(info.get("file", f"{name}.json"))
    data = file.read_bytes()
    if "sha256" in info and hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise ValueError(f"{file}: checksum differs from {META_FILE} (files of two trainings?)")
    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(data))
    except xgb.core.XGBoostError as exc:
        raise ValueError(f"{file}: not an XGBoost model: {exc}") from None
    if booster.num_features() != len(FEATURE_NAMES):
        raise ValueError(
            f"{file}: {booster.num_features()} features, expected {len(FEATURE_NAMES)}"
        )
    scale = info.get("scale", 1.0)  # bundles from before calibration: none
    if type(scale) not in (int, float) or not 0.0 < scale < math.inf:
        raise ValueError(f"{path / META_FILE}: bad {name} scale {scale!r}")
    _for_prediction(booster)
    return TargetModel(
        booster,
        int(info.get("samples", 0)),
        int(info.get("test_samples", 0)),
        info.get("mape"),
        info.get("coverage"),
        float(scale),
    )


def _for_prediction(booster: xgb.Booster) -> None:
    # Prediction happens on the request path, many at a time: one thread each.
    booster.set_param({"nthread": 1})


# ---------------------------------------------------------------------- training


def scores(y: np.ndarray, predicted: np.ndarray) -> tuple[float | None, float | None]:
    """``(MAPE, coverage)`` of predictions against observed times (fractions; None when
    there is nothing to score)."""
    keep = y > 0
    if not keep.any():
        return None, None
    y64 = y[keep].astype(np.float64)
    p64 = predicted[keep].astype(np.float64)
    mape = float(np.mean(np.abs(p64 - y64) / y64))
    coverage = float(np.mean(y64 <= p64))
    return mape, coverage


MIN_CALIBRATION_SAMPLES = 100
"""Held-out samples needed to calibrate (half calibrate, half score)."""
SCALE_BOUNDS = (0.25, 4.0)
"""The calibration factor is clamped to this range: a model that far off is retrained
soon, and an extreme factor from a few odd samples would do more harm."""


def calibration_scale(y: np.ndarray, predicted: np.ndarray, alpha: float) -> float:
    """The factor ``c`` with ``y ≤ c · predicted`` for a share α of the samples (the
    α-quantile of ``y / predicted``), clamped to :data:`SCALE_BOUNDS`.

    Why: a boosted quantile model fits its own training samples closely, and load moves
    on after they were taken, so on new requests fewer than α of them tend to fall below
    its predictions (``docs/benchmarks/latency-accuracy.md``); rescaling on recent
    samples it did not see (split conformal calibration) moves the coverage back to α
    where the error is roughly proportional to the latency.
    """
    keep = (y > 0) & (predicted > 0)
    if not keep.any():
        return 1.0
    ratio = y[keep].astype(np.float64) / predicted[keep].astype(np.float64)
    factor = float(np.quantile(ratio, alpha, method="higher"))
    return min(max(factor, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])


def train_target(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    config: TrainConfig,
) -> TargetModel:
    """Fit one booster on ``train`` and score it on ``test`` (arrays as
    :meth:`SampleSet.training_arrays`). Releases the GIL while XGBoost works."""
    x, y = train
    if len(y) == 0:
        raise ValueError("no training samples")
    matrix = xgb.QuantileDMatrix(x, y, nthread=config.nthread)
    booster = xgb.train(config.xgb_params(), matrix, num_boost_round=config.n_estimators)
    _for_prediction(booster)
    x_test, y_test = test
    mape: float | None = None
    coverage: float | None = None
    scale = 1.0
    if (
        config.objective == "quantile"
        and config.calibrate
        and len(y_test) >= MIN_CALIBRATION_SAMPLES
    ):
        # Calibrate on one half of the held-out samples, score on the other, so the
        # published coverage is not the calibration's own.
        raw = np.maximum(booster.inplace_predict(x_test), 0.0)
        scale = calibration_scale(y_test[::2], raw[::2], config.alpha)
        mape, coverage = scores(y_test[1::2], raw[1::2] * scale)
        return TargetModel(booster, len(y), len(y_test) // 2, mape, coverage, scale)
    if len(y_test):
        mape, coverage = scores(y_test, np.maximum(booster.inplace_predict(x_test), 0.0))
    return TargetModel(booster, len(y), len(y_test), mape, coverage)


def train_bundle(
    data: TrainingData,
    config: TrainConfig,
    trained_at: float,
    version: int,
    previous: ModelBundle | None = None,
    min_samples: int = 1,
) -> ModelBundle | None:
    """Train both targets from a snapshot; None when TTFT has fewer than ``min_samples``
    training samples. TPOT is trained when it has ``min_samples`` too, else the
    ``previous`` bundle's TPOT model (if any) is kept.

    Pure and deterministic for ``config.nthread == 1``; safe to run in a worker thread.
    """
    min_samples = max(1, min_samples)
    if data.ttft_count < min_samples:
        return None
    ttft = train_target(stack(data.ttft_parts), data.ttft_test, config)
    if data.tpot_count >= min_samples:
        tpot: TargetModel | None = train_target(stack(data.tpot_parts), data.tpot_test, config)
    else:
        tpot = previous.tpot if previous is not None else None
    return ModelBundle(
        ttft=ttft,
        tpot=tpot,
        objective=config.objective,
        alpha=config.alpha if config.objective == "quantile" else None,
        trained_at=trained_at,
        version=version,
    )
