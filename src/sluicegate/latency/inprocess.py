"""The default predictor: XGBoost models trained and evaluated inside the gateway.

:class:`InProcessPredictor` implements
:class:`~sluicegate.latency.predictor.LatencyPredictor`. ``observe()`` files samples in a
:class:`~sluicegate.latency.store.SampleStore`; a training replaces the whole
:class:`~sluicegate.latency.model.ModelBundle` by one assignment, so a prediction uses the
old bundle or the new one, never a mix.

Two ways to train:

- :meth:`InProcessPredictor.maybe_retrain` — synchronous, for the discrete-event
  simulation: it trains when the retraining interval has passed on the predictor's clock
  and there are enough new samples. Deterministic (fixed seed, one thread).
- :meth:`InProcessPredictor.run_trainer` — the live gateway's loop: every interval it
  snapshots the store (no copy on the event loop), trains in a worker thread
  (``asyncio.to_thread``; XGBoost releases the GIL), swaps the bundle back on the loop
  and, with ``model_dir`` set, saves it so a restarted gateway starts warm.

Time comes from the :class:`~sluicegate.clock.Clock` given; durations for the metrics come
from ``timer`` (e.g. ``time.perf_counter``) when one is given, and are not measured
otherwise (the simulation passes none: no wall-clock reads).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sluicegate.clock import Clock
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import FeatureRow, Sample, feature_matrix
from sluicegate.latency.model import ModelBundle, TrainConfig, TrainingData, train_bundle
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.latency.store import SampleStore, StoreConfig

log = logging.getLogger("sluicegate.latency")

_FIRST_MODEL_POLL_S = 1.0
"""Seconds between checks for enough samples while no model exists yet."""


@dataclass(frozen=True, slots=True)
class PredictorSettings:
    """When to train and on what (defaults: the reference Helm chart's)."""

    retrain_interval_s: float = 10.0
    """Seconds between trainings (clock seconds)."""
    min_samples: int = 100
    """TTFT training samples needed before the first training (TPOT alike)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    model_dir: str | None = None
    """Where :meth:`InProcessPredictor.run_trainer` saves each new bundle (None: nowhere)."""
    online_calibration: bool = True
    """Rescale quantile predictions online against routed requests
    (:mod:`sluicegate.latency.calibration`); no effect on a mean objective."""
    max_classes: int = 16
    """Hardware classes a :class:`~sluicegate.latency.hardware.HardwareAwarePredictor`
    keeps models for (a further class takes the place of one idle for ``class_idle_s``,
    else its samples are refused)."""
    class_idle_s: float = 600.0
    """Seconds without a sample after which a class's lane may be evicted for a new class
    (its endpoints are most likely gone: pod churn)."""
    class_speeds: tuple[tuple[str, float], ...] = ()
    """Configured relative speed per hardware class (higher is faster), for classes
    without a model of their own (:mod:`sluicegate.latency.hardware`)."""
    ratio_samples: int = 20
    """TTFT samples of a class without a model before its latency ratio to a donor
    class's model is measured."""

    def __post_init__(self) -> None:
        if self.retrain_interval_s <= 0:
            raise ValueError(f"retrain_interval_s must be positive, got {self.retrain_interval_s}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, got {self.min_samples}")
        if not self.class_idle_s > 0:
            raise ValueError(f"class_idle_s must be positive, got {self.class_idle_s}")
        if self.max_classes < 1 or self.ratio_samples < 1:
            raise ValueError("max_classes and ratio_samples must be at least 1")


class InProcessPredictor(SynchronousPredictor):
    """TTFT/TPOT models trained on the gateway's own traffic.

    Metrics (plain attributes, read by the gateway's metrics module): ``trainings``,
    ``training_failures``, ``save_failures``, ``last_train_duration_s``,
    ``train_seconds_total``, ``prediction_calls``, ``predicted_rows``,
    ``last_prediction_duration_s``, ``prediction_seconds_total`` (durations stay 0 without
    a ``timer``), and the current bundle's ``ttft_mape``, ``ttft_coverage``,
    ``tpot_mape``, ``tpot_coverage`` (fractions, None until scored); sample counts via
    :attr:`ttft_samples`, :attr:`tpot_samples`, :attr:`held_out_samples` and ``store``
    (per-bucket counts, ``store.rejected``).
    """

    def __init__(
        self,
        clock: Clock,
        settings: PredictorSettings | None = None,
        *,
        timer: Callable[[], float] | None = None,
        bundle: ModelBundle | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings or PredictorSettings()
        self.timer = timer
        self.store = SampleStore(self.settings.store)
        self.bundle: ModelBundle | None = None
        """The models in use; replaced whole (never mutated)."""
        self._last_train_at = clock.now()
        self._trained_added = -1
        """``store.added`` when the last training's snapshot was taken."""
        self._training = False
        self.trainings = 0
        self.training_failures = 0
        self.save_failures = 0
        self.last_train_duration_s = 0.0
        self.train_seconds_total = 0.0
        self.prediction_calls = 0
        self.predicted_rows = 0
        self.last_prediction_duration_s = 0.0
        self.prediction_seconds_total = 0.0
        train = self.settings.train
        self.calibration: LatencyCalibration | None = (
            LatencyCalibration(train.alpha)
            if self.settings.online_calibration and train.objective == "quantile"
            else None
        )
        """Applied to predictions by the plugins (the models' own output is unscaled)."""
        self.ttft_mape: float | None = None
        self.ttft_coverage: float | None = None
        self.tpot_mape: float | None = None
        self.tpot_coverage: float | None = None
        self.log_trainings = False
        """Log every training at INFO (the training server); otherwise only the first
        model is (the gateway, which retrains every few seconds), the others at DEBUG."""
        if bundle is not None:
            self.swap(bundle)

    # ------------------------------------------------------------------ predicting

    @property
    def ready(self) -> bool:
        """Whether a model exists (trained or loaded); callers fall back until then."""
        return self.bundle is not None

    def predict(self, rows: Sequence[FeatureRow]) -> Predictions | None:
        """TTFT/TPOT (ms) for every row in one booster call per target; None without a
        model. Thread-safe."""
        bundle = self.bundle
        if bundle is None:
            return None
        timer = self.timer
        started = timer() if timer is not None else 0.0
        out = bundle.predict(feature_matrix(rows))
        self._count(len(rows), timer, started)
        return out

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        """:meth:`predict` of the query's rows (the producer's call)."""
        return self.predict(query.rows)

    def predict_using(self, bundle: ModelBundle, x: np.ndarray) -> Predictions:
        """Predictions of ``bundle`` (the one in use, read once by the caller) for a
        float32 feature matrix (see :func:`~sluicegate.latency.features.feature_matrix`)."""
        timer = self.timer
        started = timer() if timer is not None else 0.0
        out = bundle.predict(x)
        self._count(len(x), timer, started)
        return out

    def _count(self, rows: int, timer: Callable[[], float] | None, started: float) -> None:
        self.prediction_calls += 1
        self.predicted_rows += rows
        if timer is not None:
            elapsed = timer() - started
            self.last_prediction_duration_s = elapsed
            self.prediction_seconds_total += elapsed

    # ------------------------------------------------------------------ samples

    def observe(self, sample: Sample) -> None:
        """File a completed request's sample (O(1); call from one thread)."""
        self.store.add(sample)

    @property
    def ttft_samples(self) -> int:
        return self.store.ttft.train_count

    @property
    def tpot_samples(self) -> int:
        return self.store.tpot.train_count

    @property
    def held_out_samples(self) -> int:
        return self.store.ttft.test_count

    # ------------------------------------------------------------------ training

    def swap(self, bundle: ModelBundle) -> None:
        """Put ``bundle`` in use (one assignment) and publish its scores."""
        self.bundle = bundle
        self.ttft_mape = bundle.ttft.mape
        self.ttft_coverage = bundle.ttft.coverage
        self.tpot_mape = bundle.tpot.mape if bundle.tpot is not None else None
        self.tpot_coverage = bundle.tpot.coverage if bundle.tpot is not None else None

    def has_new_samples(self) -> bool:
        """Enough TTFT samples, and some arrived since the last training."""
        return (
            self.store.ttft.train_count >= self.settings.min_samples
            and self.store.added != self._trained_added
        )

    def retrain_due(self, now: float | None = None) -> bool:
        """Whether :meth:`maybe_retrain` would train at ``now`` (clock seconds): enough new
        samples, and no model yet or the retraining interval passed since the last."""
        now = self.clock.now() if now is None else now
        # Without a model every decision falls back to the heuristics: train as soon as
        # there are enough samples, then keep the interval.
        return (
            not self._training
            and (
                self.bundle is None or now - self._last_train_at >= self.settings.retrain_interval_s
            )
            and self.has_new_samples()
        )

    def maybe_retrain(self, now: float | None = None) -> bool:
        """Train synchronously if due at ``now`` (default: the clock's time); True if a
        new bundle is in use. For the simulation: deterministic with the default
        single-threaded :class:`TrainConfig`."""
        now = self.clock.now() if now is None else now
        if not self.retrain_due(now):
            return False
        data = self._begin(now)
        try:
            bundle = self._train(data, now)
        finally:
            self._training = False
        if bundle is None:
            return False
        self.swap(bundle)
        return True

    async def retrain_async(self) -> bool:
        """Train now in a worker thread if there are enough new samples (the interval is
        the caller's business); True if a new bundle is in use. Never blocks the loop."""
        if self._training or not self.has_new_samples():
            return False
        now = self.clock.now()
        data = self._begin(now)
        directory = self.settings.model_dir
        try:
            bundle = await asyncio.to_thread(self._train, data, now, directory)
        finally:
            self._training = False
        if bundle is None:
            return False
        self.swap(bundle)
        return True

    async def run_trainer(self, interval_s: float | None = None) -> None:
        """Retrain every ``interval_s`` (default: the settings' interval) until
        cancelled. Run it as a task of the live gateway."""
        interval = self.settings.retrain_interval_s if interval_s is None else interval_s
        while True:
            # Without a model every decision falls back to the heuristics: look again soon
            # (as retrain_due does for the simulation), then keep the interval.
            first = self.bundle is None
            await asyncio.sleep(min(interval, _FIRST_MODEL_POLL_S) if first else interval)
            await self.retrain_async()

    def _begin(self, now: float) -> TrainingData:
        self._training = True
        self._last_train_at = now
        self._trained_added = self.store.added
        return TrainingData.snapshot(self.store)

    def _train(
        self, data: TrainingData, now: float, directory: str | None = None
    ) -> ModelBundle | None:
        """Train (and save) a bundle; None on failure (logged and counted)."""
        timer = self.timer
        started = timer() if timer is not None else 0.0
        previous = self.bundle
        version = (previous.version if previous is not None else 0) + 1
        try:
            bundle = train_bundle(
                data,
                self.settings.train,
                now,
                version,
                previous,
                self.settings.min_samples,
            )
        except Exception:
            self.training_failures += 1
            log.exception("latency model training failed")
            return None
        if bundle is None:
            return None
        if directory is not None:
            try:
                bundle.save(directory)
            except OSError as exc:  # the new models are still used
                self.save_failures += 1
                log.warning("cannot save the latency models to %s: %s", directory, exc)
        self.trainings += 1
        if timer is not None:
            elapsed = timer() - started
            self.last_train_duration_s = elapsed
            self.train_seconds_total += elapsed
        first = previous is None
        log.log(
            logging.INFO if first or self.log_trainings else logging.DEBUG,
            "%slatency models v%d trained on %d TTFT / %d TPOT samples%s: TTFT MAPE %s "
            "coverage %s, TPOT MAPE %s coverage %s",
            "first " if first else "",
            bundle.version,
            bundle.ttft.samples,
            bundle.tpot.samples if bundle.tpot is not None else 0,
            f" in {self.last_train_duration_s:.2f}s" if timer is not None else "",
            _pct(bundle.ttft.mape),
            _pct(bundle.ttft.coverage),
            _pct(bundle.tpot.mape if bundle.tpot is not None else None),
            _pct(bundle.tpot.coverage if bundle.tpot is not None else None),
        )
        return bundle

    # ------------------------------------------------------------------ files

    def save(self, directory: str | os.PathLike[str]) -> bool:
        """Write the current bundle to ``directory``; False when there is none yet."""
        bundle = self.bundle
        if bundle is None:
            return False
        bundle.save(directory)
        return True

    def load(self, directory: str | os.PathLike[str]) -> bool:
        """Put the bundle saved in ``directory`` in use (warm start); False, logged, when
        there is none or it cannot be used (another feature schema, damaged files)."""
        try:
            bundle = ModelBundle.load(directory)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            log.warning("not using the latency models in %s: %s", Path(directory), exc)
            return False
        self.swap(bundle)
        return True


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
