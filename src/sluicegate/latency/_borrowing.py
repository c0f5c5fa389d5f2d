"""How a hardware class without a model of its own is predicted, and when its online
calibration restarts (:mod:`sluicegate.latency.hardware`, module docstring: the donor, the
ratio and the order of preference of the model sources). Private: the base of
:class:`~sluicegate.latency.hardware.HardwareAwarePredictor`, split out of it to keep
that module to a few screens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import FeatureRow, feature_matrix
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.merged import MergedModels
from sluicegate.latency.model import ModelBundle, TargetModel

ModelSource = Literal["model", "measured-ratio", "configured-ratio", "heuristic"]
MODEL_SOURCES: tuple[ModelSource, ...] = (
    "model",
    "measured-ratio",
    "configured-ratio",
    "heuristic",
)


class Borrowed:
    """How a class without a model is predicted: ``donor``'s bundle times the ratios."""

    __slots__ = ("donor", "source", "tpot_ratio", "ttft_ratio")

    def __init__(
        self, donor: str | None, ttft_ratio: float, tpot_ratio: float, source: ModelSource
    ) -> None:
        self.donor = donor
        self.ttft_ratio = ttft_ratio
        self.tpot_ratio = tpot_ratio
        self.source: ModelSource = source


class DonorBorrowing:
    """The borrowing half of :class:`~sluicegate.latency.hardware.HardwareAwarePredictor`:
    which model predicts each class (``source_of``), recomputed after each training
    (``refresh_borrowing``), and the restart of a class's calibration when that changes.
    The attributes are the predictor's (set in its ``__init__``)."""

    settings: PredictorSettings
    lanes: dict[str | None, InProcessPredictor]
    calibration: LatencyCalibration | None
    _borrowed: dict[str | None, Borrowed]
    _speeds: dict[str, float]
    _sources: dict[str | None, tuple[ModelSource, str | None]]
    _tpot_in_use: dict[str | None, tuple[TargetModel, float]]
    _merged: MergedModels | None
    _coded: dict[str | None, tuple[float, float, float]]

    def source_of(self, cls: str | None) -> ModelSource:
        """What predicts class ``cls`` now (module docstring)."""
        lane = self.lanes.get(cls)
        if lane is not None and lane.bundle is not None:
            return "model"
        borrowed = self._borrowed.get(cls) or self._configured(cls)
        return borrowed.source if borrowed is not None else "heuristic"

    def _resolve(self, cls: str | None) -> tuple[ModelBundle, float, float] | None:
        lane = self.lanes.get(cls)
        if lane is not None and lane.bundle is not None:
            return lane.bundle, 1.0, 1.0
        borrowed = self._borrowed.get(cls)
        if borrowed is None:
            borrowed = self._configured(cls)
            if borrowed is None:
                return None
        donor = self.lanes.get(borrowed.donor)
        if donor is None or donor.bundle is None:
            return None
        return donor.bundle, borrowed.ttft_ratio, borrowed.tpot_ratio

    def _trained(self) -> list[str | None]:
        return [c for c, lane in self.lanes.items() if lane.bundle is not None]

    def _closest_by_speed(self, cls: str, trained: Sequence[str | None]) -> str | None:
        speed = self._speeds.get(cls)
        if speed is None:
            return None
        known = [(abs(math.log(self._speeds[c] / speed)), c) for c in trained if c in self._speeds]
        return min(known)[1] if known else None

    def _configured(self, cls: str | None) -> Borrowed | None:
        if cls is None:
            return None
        donor = self._closest_by_speed(cls, self._trained())
        if donor is None:
            return None
        ratio = self._speeds[donor] / self._speeds[cls]
        return Borrowed(donor, ratio, ratio, "configured-ratio")

    def refresh_borrowing(self) -> None:
        """Recompute how each class without a model is predicted (after a training)."""
        trained = self._trained()
        borrowed: dict[str | None, Borrowed] = {}
        for cls, lane in self.lanes.items():
            if lane.bundle is not None or not trained:
                continue
            measured = self._measured(cls, lane, trained)
            chosen = measured or self._configured(cls)
            if chosen is not None:
                borrowed[cls] = chosen
        self._borrowed = borrowed
        self._coded = self._coding(self._merged)
        self._restart_calibration()
        self._rebase_tpot_calibration()

    def _origin(self, cls: str | None) -> tuple[ModelSource, str | None]:
        """What predicts ``cls``: its source and, when it borrows, the donor."""
        source = self.source_of(cls)
        if source in ("model", "heuristic"):
            return source, None
        borrowed = self._borrowed.get(cls) or self._configured(cls)
        return source, None if borrowed is None else borrowed.donor

    def _restart_calibration(self) -> None:
        """Restart the online calibration of every class now predicted by another model:
        its source or its donor changed (:meth:`LatencyCalibration.restart`: its ratios
        were another model's residuals). Over the classes seen and those with a
        configured speed: such a class is predicted (``configured-ratio``) before its
        first sample, and may train within one trainer interval of it. On a pool of one
        class the only change is heuristic → model, before any prediction was
        calibrated: nothing to restart."""
        origins = {cls: self._origin(cls) for cls in (*self.lanes, *self._speeds)}
        calibration = self.calibration
        if calibration is not None:
            for cls, origin in origins.items():
                before = self._sources.get(cls)
                if cls is not None and before is not None and before != origin:
                    calibration.restart(cls)
        self._sources = origins

    def _rebase_tpot_calibration(self) -> None:
        """On a mixed pool, score TPOT outcomes against the model now in use, and rebase
        the calibration of exactly the classes whose TPOT model or ratio changed
        (:meth:`LatencyCalibration.rebase_tpot`); on a pool of one class, against the
        prediction at dispatch, as before.

        Why: a TPOT is known only when its request ends, seconds after dispatch, so after
        a retraining the ratios that keep arriving are the previous model's residuals
        (heterogeneous-pool, 3 seeds: `predicted-latency` at 80 req/s 90.4 / 86.2 / 78.1 %
        before, docs/benchmarks/heterogeneous-pool/report.md for after). Only mixed: on the
        homogeneous ``slo-mixed`` at 85 req/s it moved the seeds by −5.0 / +4.2 / −0.4
        points around an unchanged median: seed noise, no gain to trade for every
        homogeneous benchmark's rows. What is scored against is a snapshot of the
        models taken here (a retraining swaps lanes one at a time: outcomes between two
        swaps stay scored against one model), predicted without the predictor's call
        counters (they count routing)."""
        calibration = self.calibration
        if calibration is None:
            return
        before = self._tpot_in_use
        in_use: dict[str | None, tuple[TargetModel, float]] = {}
        for cls in dict.fromkeys((*self.lanes, *self._speeds)):
            resolved = self._resolve(cls)
            if resolved is not None and resolved[0].tpot is not None:
                in_use[cls] = (resolved[0].tpot, resolved[2])
        self._tpot_in_use = in_use
        if not calibration.mixed:
            calibration.score_tpot_at_dispatch()
            return
        changed = [
            cls
            for cls in dict.fromkeys((*before, *in_use))
            if not _same_model(before.get(cls), in_use.get(cls))
        ]

        def tpot(rows: Sequence[FeatureRow], cls: str | None) -> Sequence[float]:
            entry = in_use.get(cls)
            if entry is None:
                return [0.0] * len(rows)
            model, ratio = entry
            predicted: list[float] = (
                model.predict(feature_matrix(rows)) * np.float32(ratio)
            ).tolist()
            return predicted

        calibration.rebase_tpot(tpot, changed)

    def _coding(self, merged: MergedModels | None) -> dict[str | None, tuple[float, float, float]]:
        borrowed = dict(self._borrowed)
        for cls in self._speeds:  # configured classes not seen yet
            configured = None if cls in self.lanes else self._configured(cls)
            if configured is not None:
                borrowed[cls] = configured
        ratios = {c: (b.donor, b.ttft_ratio, b.tpot_ratio) for c, b in borrowed.items()}
        return {} if merged is None else merged.coding(ratios)

    def _measured(
        self, cls: str | None, lane: InProcessPredictor, trained: Sequence[str | None]
    ) -> Borrowed | None:
        if lane.store.ttft.train_count < self.settings.ratio_samples:
            return None
        donor = (self._closest_by_speed(cls, trained) if cls is not None else None) or max(
            trained, key=lambda c: self.lanes[c].ttft_samples
        )
        bundle = self.lanes[donor].bundle
        assert bundle is not None
        ttft = _median_ratio(bundle, lane.store.ttft.training_arrays(), "ttft")
        tpot = _median_ratio(bundle, lane.store.tpot.training_arrays(), "tpot")
        if ttft is None:
            return None
        return Borrowed(donor, ttft, ttft if tpot is None else tpot, "measured-ratio")

    def _borrowing_stale(self) -> bool:
        """A class without a model that has no donor yet while some class has a model,
        or that reached ``ratio_samples`` and is not measured yet."""
        if not self._trained():
            return False
        for cls, lane in self.lanes.items():
            if lane.bundle is not None:
                continue
            borrowed = self._borrowed.get(cls)
            if borrowed is None or (
                borrowed.source != "measured-ratio"
                and lane.store.ttft.train_count >= self.settings.ratio_samples
            ):
                return True
        return False


def _median_ratio(
    bundle: ModelBundle, data: tuple[np.ndarray, np.ndarray], target: str
) -> float | None:
    """Median of observed / predicted over ``data`` (None: nothing to compare), clamped
    to [1/16, 16] so a few odd samples cannot make predictions absurd."""
    x, y = data
    if len(y) == 0:
        return None
    model = bundle.ttft if target == "ttft" else bundle.tpot
    if model is None:
        return None
    predicted = model.predict(x)
    keep = predicted > 0
    if not keep.any():
        return None
    ratio = float(np.median(y[keep] / predicted[keep]))
    return min(max(ratio, 1 / 16), 16.0)


def _same_model(a: tuple[TargetModel, float] | None, b: tuple[TargetModel, float] | None) -> bool:
    if a is None or b is None:
        return a is b
    return a[0] is b[0] and a[1] == b[1]
