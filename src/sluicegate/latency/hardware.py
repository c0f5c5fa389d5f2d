"""Hardware-aware latency models: one model per hardware class, for mixed pools.

:class:`HardwareAwarePredictor` implements
:class:`~sluicegate.latency.predictor.LatencyPredictor` with one
:class:`~sluicegate.latency.inprocess.InProcessPredictor` (its own stratified window and
XGBoost bundle) per hardware class (``Sample.hardware_class``, ``PredictionQuery.classes``).
Per class rather than one model with a class column: on simulated H100 and A100 samples
both predict alike (within a point of MAPE), and a pool of one class, or of none named, is
then exactly the single model it always had — same samples, trees and predictions
(``docs/benchmarks/heterogeneous-latency-models.md``). A request whose candidates span
classes is predicted by the classes' boosters merged into one per target
(:mod:`sluicegate.latency.merged`): one call, as on a homogeneous pool.

A class without a model of its own (it joined the pool later, or has too few samples) is
predicted by a *donor*: the trained class closest to it, its predictions multiplied by a
ratio, in this order of preference:

1. ``model`` — the class's own model;
2. ``measured-ratio`` — the class has at least ``ratio_samples`` TTFT samples: the ratio
   is the median over them of observed / donor-predicted time (TTFT and TPOT apart),
   recomputed at every training; the donor is the class with the closest configured
   speed, else the one with most samples;
3. ``configured-ratio`` — both the class and a trained class have a configured relative
   speed (``class_speeds``, e.g. ``h100-80gb: 3, a100-80gb: 1``; higher is faster): the
   donor is the trained class of closest speed (in log ratio) and the ratio is
   ``speed(donor) / speed(class)``;
4. ``heuristic`` — none of these: a query with such a row gets no prediction, so the
   request is scheduled by the heuristic fallback, and its samples soon allow 2.

When what predicts a class changes — its source, or the donor it borrows (it borrowed, and
now has its own model or a closer donor) — its online calibration restarts
(:meth:`~sluicegate.latency.calibration.LatencyCalibration.restart`): the ratios it kept
were another model's residuals. This covers the classes with a configured speed not seen
yet, and outcomes of requests routed before the restart are not fed to the fresh trackers
(:meth:`~sluicegate.latency.calibration.LatencyCalibration.trackers_for_outcome`). The
borrowing and the restart live in :mod:`sluicegate.latency._borrowing`.

``source_of(class)`` says which source predicts a class; the metrics publish it
(``sluicegate_predictor_latency_model_source{class,source}``). Classes are bounded
(``max_classes``, 16): a further class takes the lane of the class sampled least
recently if that one has had no sample for ``class_idle_s`` (600 s: its endpoints are
gone after pod churn; its models are dropped, files stay), else its samples are refused,
counted and logged (at most once a minute).

Files: the unnamed class's bundle lives in the model directory itself (today's layout);
class ``c``'s in ``<dir>/classes/<c>``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from sluicegate.clock import Clock
from sluicegate.latency._borrowing import MODEL_SOURCES as MODEL_SOURCES
from sluicegate.latency._borrowing import Borrowed, DonorBorrowing, ModelSource
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import FeatureRow, Sample, feature_matrix
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.merged import MergedModels, merge_bundles
from sluicegate.latency.model import ModelBundle, TargetModel
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.latency.wire import CLASS_NAME

log = logging.getLogger("sluicegate.latency")

CLASSES_DIR = "classes"
UNNAMED = "none"
"""The metric label of the unnamed class (samples and endpoints without a class)."""
_FIRST_MODEL_POLL_S = 1.0


class HardwareAwarePredictor(DonorBorrowing, SynchronousPredictor):
    """Per-class TTFT/TPOT models (module docstring). Same construction and training API
    as :class:`InProcessPredictor` (``maybe_retrain``, ``retrain_async``, ``run_trainer``,
    ``save``, ``load``), so the host and the simulation use either alike."""

    def __init__(
        self,
        clock: Clock,
        settings: PredictorSettings | None = None,
        *,
        timer: Callable[[], float] | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings or PredictorSettings()
        self.timer = timer
        self.lanes: dict[str | None, InProcessPredictor] = {}
        """One single-class predictor per class seen (bounded by ``max_classes``)."""
        self._borrowed: dict[str | None, Borrowed] = {}
        self._speeds: dict[str, float] = dict(self.settings.class_speeds)
        self._sources: dict[str | None, tuple[ModelSource, str | None]] = {}
        self._tpot_in_use: dict[str | None, tuple[TargetModel, float]] = {}
        """Each class's model source and donor at the last :meth:`refresh_borrowing`."""
        self.refused_class_samples = 0
        """Samples of a class beyond ``max_classes``."""
        self.evicted_classes = 0
        """Lanes given up for a new class (idle for ``class_idle_s``)."""
        self._last_sample: dict[str | None, float] = {}
        """Clock time (s) of each lane's last sample (or of its creation)."""
        self._refusal_logged: float | None = None
        self._merge_stale = False
        self._merged: MergedModels | None = None
        """The trained classes' models as one booster per target (mixed requests)."""
        self._coded: dict[str | None, tuple[float, float, float]] = {}
        """Per class predictable through ``_merged``: (code, TTFT factor, TPOT factor)."""
        self.merged_calls = 0
        self.merged_rows = 0
        train = self.settings.train
        self.calibration: LatencyCalibration | None = (
            LatencyCalibration(train.alpha, max_classes=self.settings.max_classes)
            if self.settings.online_calibration and train.objective == "quantile"
            else None
        )
        """Online scales per class (``LatencyCalibration.trackers``): each class's routed
        requests rescale that class's predictions only."""

    # ------------------------------------------------------------------ lanes

    def lane(self, cls: str | None) -> InProcessPredictor | None:
        """The class's predictor, created on first use; None beyond ``max_classes``."""
        lane = self.lanes.get(cls)
        if lane is not None:
            return lane
        if len(self.lanes) >= self.settings.max_classes and not self._evict_idle(cls):
            return None
        directory = self.settings.model_dir
        lane = InProcessPredictor(
            self.clock,
            replace(
                self.settings,
                online_calibration=False,  # the shared one above is used
                model_dir=None if directory is None else str(_class_dir(directory, cls)),
            ),
            timer=self.timer,
        )
        self.lanes[cls] = lane
        self._last_sample[cls] = self.clock.now()
        return lane

    def _evict_idle(self, newcomer: str | None) -> bool:
        """Free the lane sampled least recently if idle for ``class_idle_s``; else log the
        refusal of ``newcomer`` (at most once a minute) and say False."""
        now = self.clock.now()
        oldest = min(self._last_sample, key=self._last_sample.__getitem__)
        if now - self._last_sample[oldest] < self.settings.class_idle_s:
            if self._refusal_logged is None or now - self._refusal_logged >= 60.0:
                self._refusal_logged = now
                log.warning(
                    "latency predictor: %d hardware classes in use, samples of class %s refused "
                    "(none idle for %.0f s)",
                    len(self.lanes),
                    newcomer or UNNAMED,
                    self.settings.class_idle_s,
                )
            return False
        log.info("latency predictor: class %s idle, its lane goes to %s", oldest, newcomer)
        del self.lanes[oldest], self._last_sample[oldest]
        self.evicted_classes += 1
        # Its models may be in the merged booster (mixed queries predict class by class
        # until the next training merges again: merging takes ~0.1 s, not on this path)
        # or lent to other classes.
        self._merged = None
        self._merge_stale = True
        self.refresh_borrowing()
        return True

    def _bundles(self) -> dict[str | None, ModelBundle]:
        return {c: ln.bundle for c, ln in self.lanes.items() if ln.bundle is not None}

    def _set_merged(self, merged: MergedModels | None) -> None:
        # Only if the bundles did not change meanwhile (a training on another path).
        bundles = self._bundles()
        self._merged = merged if merged is None or list(merged.codes) == list(bundles) else None

    # ------------------------------------------------------------------ predicting

    @property
    def ready(self) -> bool:
        """Whether some class has a model (callers fall back until then)."""
        return any(lane.bundle is not None for lane in self.lanes.values())

    def predict(
        self, rows: Sequence[FeatureRow], classes: Sequence[str | None] | None = None
    ) -> Predictions | None:
        """TTFT/TPOT (ms) for every row, ``classes[i]`` the class of ``rows[i]`` (None:
        all of the unnamed class); None when some row's class has no model, donor or
        ratio (``heuristic``). One booster call per class and target."""
        if not rows:
            return None
        first = None if classes is None else classes[0]
        if classes is None or classes.count(first) == len(classes):
            resolved = self._resolve(first)
            if resolved is None:
                return None
            bundle, ttft_ratio, tpot_ratio = resolved
            out = self._lane_for_count(first).predict_using(bundle, feature_matrix(rows))
            if ttft_ratio != 1.0 or tpot_ratio != 1.0:
                out = Predictions(
                    out.ttft_ms * np.float32(ttft_ratio), out.tpot_ms * np.float32(tpot_ratio)
                )
            return out
        coded = self._coded
        merged = self._merged
        if merged is not None and all(c in coded for c in classes):
            self.merged_calls += 1
            self.merged_rows += len(rows)
            return merged.predict(feature_matrix(rows), [coded[c] for c in classes])
        groups: dict[str | None, list[int]] = {}
        for i, cls in enumerate(classes):
            groups.setdefault(cls, []).append(i)
        x = feature_matrix(rows)
        ttft = np.empty(len(rows), dtype=np.float32)
        tpot = np.empty(len(rows), dtype=np.float32)
        for cls, index in groups.items():
            resolved = self._resolve(cls)
            if resolved is None:
                return None
            bundle, ttft_ratio, tpot_ratio = resolved
            part = self._lane_for_count(cls).predict_using(bundle, x[index])
            ttft[index] = part.ttft_ms * np.float32(ttft_ratio)
            tpot[index] = part.tpot_ms * np.float32(tpot_ratio)
        return Predictions(ttft, tpot)

    def _lane_for_count(self, cls: str | None) -> InProcessPredictor:
        # Counted where the rows' class is (or, unseen, the first lane).
        lane = self.lanes.get(cls)
        return lane if lane is not None else next(iter(self.lanes.values()))

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        """:meth:`predict` of the query's rows and classes (the producer's call)."""
        return self.predict(query.rows, query.classes)

    # ------------------------------------------------------------------ samples

    def observe(self, sample: Sample) -> None:
        """File a completed request's sample in its class's window (O(1))."""
        self.add(sample)

    def add(self, sample: Sample) -> bool:
        """:meth:`observe`, saying whether the sample was kept (a trace's
        :func:`~sluicegate.latency.trace.load_trace` sink)."""
        lane = self.lane(sample.hardware_class)
        if lane is None:
            self.refused_class_samples += 1
            return False
        self._last_sample[sample.hardware_class] = self.clock.now()
        return lane.store.add(sample)

    # ------------------------------------------------------------------ training

    def maybe_retrain(self, now: float | None = None) -> bool:
        """Train every class that is due (see :meth:`InProcessPredictor.maybe_retrain`);
        True if some new bundle is in use."""
        trained = False
        for lane in list(self.lanes.values()):
            trained = lane.maybe_retrain(now) or trained
        if trained or self._merge_stale:
            self._merge_stale = False
            self._set_merged(merge_bundles(self._bundles()))
        if trained or self._borrowing_stale():
            self.refresh_borrowing()
        return trained

    async def retrain_async(self) -> bool:
        """Train every class with new samples in a worker thread; True if some new bundle
        is in use."""
        trained = False
        for lane in list(self.lanes.values()):
            trained = await lane.retrain_async() or trained
        if trained or self._merge_stale:
            self._merge_stale = False
            self._set_merged(await asyncio.to_thread(merge_bundles, self._bundles()))
        if trained or self._borrowing_stale():
            self.refresh_borrowing()
        return trained

    async def run_trainer(self, interval_s: float | None = None) -> None:
        """Retrain every ``interval_s`` (default: the settings') until cancelled."""
        interval = self.settings.retrain_interval_s if interval_s is None else interval_s
        while True:
            first = not self.ready
            await asyncio.sleep(min(interval, _FIRST_MODEL_POLL_S) if first else interval)
            await self.retrain_async()

    # ------------------------------------------------------------------ metrics

    @property
    def ttft_samples(self) -> int:
        return sum(lane.ttft_samples for lane in self.lanes.values())

    @property
    def tpot_samples(self) -> int:
        return sum(lane.tpot_samples for lane in self.lanes.values())

    @property
    def trainings(self) -> int:
        """Successful trainings, every class."""
        return sum(lane.trainings for lane in self.lanes.values())

    @property
    def prediction_calls(self) -> int:
        """Prediction calls: one per class present in a query, or one for a query of
        several classes predicted by the merged models."""
        return sum(lane.prediction_calls for lane in self.lanes.values()) + self.merged_calls

    def sources(self) -> dict[str, ModelSource]:
        """The model source of every class seen, by metric label."""
        return {UNNAMED if c is None else c: self.source_of(c) for c in self.lanes}

    # ------------------------------------------------------------------ files

    def save(self, directory: str | os.PathLike[str]) -> bool:
        """Write every class's bundle (module docstring); False when there is none."""
        saved = False
        for cls, lane in self.lanes.items():
            saved = lane.save(_class_dir(directory, cls)) or saved
        return saved

    def load(self, directory: str | os.PathLike[str]) -> bool:
        """Load the bundles saved in ``directory`` (the unnamed class's, and each class
        directory's); False when none could be used."""
        loaded = False
        root = Path(directory)
        names: list[str | None] = [None]
        classes = root / CLASSES_DIR
        if classes.is_dir():
            names += sorted(p.name for p in classes.iterdir() if CLASS_NAME.fullmatch(p.name))
        for cls in names:
            if cls is not None and not (classes / cls).is_dir():
                continue
            if cls is None and not (root / "bundle.json").exists():
                continue
            lane = self.lane(cls)
            if lane is not None and lane.load(_class_dir(directory, cls)):
                loaded = True
        self.models_changed()
        return loaded

    def models_changed(self) -> None:
        """Re-merge the classes' models and recompute borrowing, after bundles were put
        in use other than by training (synchronous: ~0.1 s per merge of 200-tree
        models)."""
        self._set_merged(merge_bundles(self._bundles()))
        self.refresh_borrowing()


def _class_dir(directory: str | os.PathLike[str], cls: str | None) -> Path:
    root = Path(directory)
    return root if cls is None else root / CLASSES_DIR / cls


def configured_speeds(speeds: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """``class_speeds`` for :class:`PredictorSettings` from a mapping, validated."""
    out = []
    for name, speed in sorted(speeds.items()):
        if CLASS_NAME.fullmatch(name) is None:
            raise ValueError(f"class name {name!r}: lower-case letters, digits, '.', '_', '-'")
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"class {name!r}: speed must be a positive number, got {speed}")
        out.append((name, float(speed)))
    return tuple(out)
