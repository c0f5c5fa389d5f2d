"""Online calibration of quantile predictions against the requests actually routed.

The α-quantile models are rescaled at training so that, on held-out samples of their own
store, a share α of outcomes lies at or below the prediction (``calibration_scale`` in
:mod:`sluicegate.latency.model`). Routing then breaks that promise in two ways: the router
sends each request to the endpoint with the *lowest* prediction, which favours the
endpoints whose latency the model underestimates at that moment; and near saturation the
load keeps rising after dispatch, which no feature taken at dispatch can see. Measured on
the simulator, TPOT p90 predictions for the chosen endpoint covered only ~40 % of outcomes
near saturation (docs/benchmarks/latency-accuracy.md).

:class:`QuantileTracker` corrects this with the chosen endpoint's prediction at dispatch
and what then happened: it keeps the ratios observed ÷ predicted of the last ``window``
routed requests and scales predictions by their α-quantile (split conformal calibration
over a sliding window), recomputed every ``refresh_every`` observations once
``min_observations`` exist. A window, rather than a stochastic step per observation
(adaptive conformal inference), because outcomes arrive late: a TPOT is known only when
the request ends, seconds after thousands of later requests were dispatched on the old
scale, and a per-observation step integrates all of those misses at once and overshoots.
The scale is clamped to [``min_scale``, ``max_scale``]. Predictions handed to the plugins
are the models' times the scale; a mean-objective model is not rescaled. On a mixed pool,
when what predicts a class's TPOT changes, its TPOT tracker is rebased
(:meth:`LatencyCalibration.rebase_tpot`): later outcomes are scored against the model in
use, not the one at dispatch.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

from sluicegate.latency.features import FeatureRow
from sluicegate.latency.presence import ClassPresence

log = logging.getLogger(__name__)

WINDOW = 1000
"""Routed requests whose outcome ratios set the scale (at 100 req/s: the last ~10 s)."""


@dataclass(slots=True)
class QuantileTracker:
    """The multiplier that makes ``scale · prediction`` an α-quantile on routed requests."""

    alpha: float
    window: int = WINDOW
    min_observations: int = 50
    refresh_every: int = 20
    min_scale: float = 0.5
    max_scale: float = 4.0
    scale: float = 1.0
    observations: int = 0
    misses: int = 0
    """Observations above ``scale · prediction`` at the time they were made (for a TPOT
    tracker scoring against the model in use, :meth:`ClassTrackers.observe_tpot`, that
    model's prediction, not the one the request was routed on)."""
    _ratios: deque[float] = field(init=False, repr=False)
    _updates: int = field(init=False, repr=False, default=0)
    """Ratios filed by this tracker (``observations`` may start higher: a restarted class's
    counters go on, its refreshes start over)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("alpha must be in (0, 1)")
        if self.window < 1 or self.min_observations < 1 or self.refresh_every < 1:
            raise ValueError("window, min_observations and refresh_every must be >= 1")
        if not 0.0 < self.min_scale <= 1.0 <= self.max_scale:
            raise ValueError("need 0 < min_scale <= 1 <= max_scale")
        self._ratios = deque(maxlen=self.window)

    def update(self, predicted: float, observed: float) -> None:
        """One routed request: the model's prediction at dispatch (before scaling) and
        the observed value, in the same unit. Non-positive or non-finite values are
        ignored."""
        if not (predicted > 0.0 and observed >= 0.0):
            return
        ratio = observed / predicted
        if not math.isfinite(ratio):
            return
        self.observations += 1
        self.misses += ratio > self.scale
        self._ratios.append(ratio)
        self._updates += 1
        n = len(self._ratios)
        if n >= self.min_observations and self._updates % self.refresh_every == 0:
            quantile = float(np.quantile(np.fromiter(self._ratios, float, n), self.alpha))
            self.scale = min(self.max_scale, max(self.min_scale, quantile))

    @property
    def until_refresh(self) -> int:
        """Valid updates until the scale may be recomputed (1 … ``refresh_every``)."""
        return self.refresh_every - self._updates % self.refresh_every

    @property
    def kept(self) -> int:
        """Ratios in the window (at most ``window``)."""
        return len(self._ratios)

    def rebase(self) -> None:
        """Forget the window's ratios but keep the scale until it is next recomputed: at
        the first multiple of ``refresh_every`` new ratios at or above
        ``min_observations`` (60 by default; the model they were residuals of was
        replaced)."""
        self._ratios.clear()
        self._updates = 0


TpotModel: TypeAlias = Callable[[Sequence[FeatureRow], str | None], Sequence[float]]
"""The unscaled TPOT (ms) the model in use predicts for rows of a hardware class (None: the
unnamed class), one value per row; ≤ 0 where it cannot say (then the prediction at
dispatch is used)."""

TTFT_BIN_EDGES_MS = (64.0, 128.0, 256.0, 512.0)
"""Edges of the TTFT calibration's bins, by the unscaled prediction (ms): five bins."""


def ttft_bin(predicted_ms: float) -> int:
    """The calibration bin of an unscaled TTFT prediction (0 … len(edges))."""
    for i, edge in enumerate(TTFT_BIN_EDGES_MS):
        if predicted_ms < edge:
            return i
    return len(TTFT_BIN_EDGES_MS)


@dataclass(slots=True)
class ClassTrackers:
    """One class's trackers: TTFT and TPOT over all its routed requests, and TTFT per bin
    of the unscaled prediction (:data:`TTFT_BIN_EDGES_MS`).

    TTFT per bin because its errors are additive more than proportional: a short prompt
    queued behind a long prefill waits what that prefill takes, whatever its own size, so
    the ratio observed ÷ predicted of the smallest predictions has by far the heaviest
    tail, and one scale over all sizes — their α-quantile — inflated every prediction by
    it (heterogeneous-pool, 80 req/s: the A100s' TTFT scale sat at its bound of 4 while the
    median A100 request took a fifth of its scaled prediction, so requests near the SLO,
    where validity is decided, were judged by the tail of requests far below it). Each bin
    is split conformal calibration of its own (Mondrian); a bin with fewer than the
    tracker's ``min_observations`` uses the all-sizes scale."""

    ttft: QuantileTracker
    tpot: QuantileTracker
    ttft_bins: tuple[QuantileTracker, ...]
    generation: int = 0
    """Which trackers these are (:attr:`LatencyCalibration.generation`): a request routed
    on predictions scaled by other trackers of its class is not theirs to learn from."""
    tpot_model: TpotModel | None = field(default=None, compare=False)
    """What predicts TPOT now (set by :class:`LatencyCalibration`): outcomes are scored
    against it (:meth:`observe_tpot`); None: against the prediction at dispatch."""
    _pending_tpot: list[tuple[float, float, FeatureRow, str | None]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    """Outcomes waiting to be scored against :attr:`tpot_model` (dispatch prediction,
    observed, row, class; fewer than the TPOT tracker's ``refresh_every``)."""

    @classmethod
    def new(cls, alpha: float, generation: int = 0) -> ClassTrackers:
        bins = tuple(QuantileTracker(alpha) for _ in range(len(TTFT_BIN_EDGES_MS) + 1))
        return cls(QuantileTracker(alpha), QuantileTracker(alpha), bins, generation)

    def ttft_scale(self, predicted_ms: float) -> float:
        """The TTFT multiplier for an unscaled prediction of ``predicted_ms``."""
        tracker = self.ttft_bins[ttft_bin(predicted_ms)]
        return tracker.scale if tracker.kept >= tracker.min_observations else self.ttft.scale

    def observe_tpot(
        self,
        predicted_ms: float,
        observed_ms: float,
        row: FeatureRow,
        hardware_class: str | None = None,
    ) -> None:
        """One routed request's unscaled TPOT prediction at dispatch, its observed TPOT
        (ms), the feature row it was predicted from and its endpoint's class. With
        :attr:`tpot_model` set the ratio is against the model in use now, not the one at
        dispatch.

        Why: a TPOT is known only when its request ends, seconds after dispatch, so after a
        retraining the ratios arriving are the previous model's residuals for seconds, and
        the window holds them for ``window`` outcomes (heterogeneous-pool, 80 req/s: a TPOT
        scale of ~2 set by a model that under-predicted a flood multiplied a retrained one
        that over-predicted the flood's end, and no endpoint was predicted to meet the TPOT
        SLO). An outcome that ends after the retraining was not in its training set, so
        its ratio is out of sample, as split conformal calibration needs.

        The outcomes are scored in batches up to the tracker's next refresh (one model
        call per class in a batch: a call of one row costs 130–200 µs, a batch of 20 about
        14 µs per row). The scale is recomputed only at a refresh, and each outcome kept
        here is one valid ratio, so it moves exactly as if each were scored on arrival;
        the observation and miss counters lag by fewer than ``refresh_every`` outcomes."""
        if self.tpot_model is None:
            self.tpot.update(predicted_ms, observed_ms)
            return
        if not (0.0 < predicted_ms < math.inf and 0.0 <= observed_ms < math.inf):
            return  # what :meth:`QuantileTracker.update` ignores
        self._pending_tpot.append((predicted_ms, observed_ms, row, hardware_class))
        if len(self._pending_tpot) >= self.tpot.until_refresh:
            self.flush_tpot()

    def flush_tpot(self) -> None:
        """Score the outcomes waiting for :attr:`tpot_model` now, in arrival order (each
        against its dispatch prediction where the model cannot say or fails)."""
        pending, self._pending_tpot = self._pending_tpot, []
        if not pending:
            return
        in_use = [0.0] * len(pending)
        model = self.tpot_model
        if model is not None:
            groups: dict[str | None, list[int]] = {}
            for i, entry in enumerate(pending):
                groups.setdefault(entry[3], []).append(i)
            try:
                for cls, index in groups.items():
                    values = model([pending[i][2] for i in index], cls)
                    for i, value in zip(index, values, strict=True):
                        in_use[i] = float(value)
            except Exception:  # a model that cannot predict must not lose the outcomes
                log.exception("latency calibration: TPOT outcomes scored at dispatch")
                in_use = [0.0] * len(pending)
        for now, (at_dispatch, observed_ms, _, _) in zip(in_use, pending, strict=True):
            valid = now > 0.0 and math.isfinite(observed_ms / now)
            self.tpot.update(now if valid else at_dispatch, observed_ms)

    def observe_ttft(self, predicted_ms: float, observed_ms: float) -> None:
        """One routed request's unscaled TTFT prediction and its observed TTFT (ms)."""
        self.ttft.update(predicted_ms, observed_ms)
        if predicted_ms > 0.0:
            self.ttft_bins[ttft_bin(predicted_ms)].update(predicted_ms, observed_ms)


@dataclass(slots=True)
class LatencyCalibration:
    """Online calibration for a predictor of the α-quantile: per hardware class (at most
    ``max_classes``), TTFT and TPOT trackers with TTFT binned by prediction size
    (:class:`ClassTrackers`).

    Per class because one scale for a mixed pool is the α-quantile of a mixture of error
    distributions (heterogeneous-pool, 60 req/s: one TTFT scale for H100s and A100s sat at
    its bound of 4 and sheddable requests the A100s would have served in time were shed).
    The unnamed class's trackers (a hardware-blind producer, rows without a class, and
    classes beyond ``max_classes``: bounded memory) are ``pool``; ``ttft``/``tpot`` are its
    all-sizes trackers, for the pool-wide metrics.

    Which classes the pool has is what the producer sees (:meth:`see`) among each decision's
    candidates (:class:`~sluicegate.latency.presence.ClassPresence`): a class whose servers
    all left stops counting after the presence window, so the pool is calibrated as one
    class again, and its slot goes to the next new class once the slots are full."""

    alpha: float
    max_classes: int = 0
    pool: ClassTrackers = field(init=False)
    classes: dict[str, ClassTrackers] = field(init=False)
    """The trackers of each hardware class seen (at most ``max_classes``)."""
    presence: ClassPresence = field(init=False)
    """The classes among recent candidates (:meth:`see`)."""
    _now: float = field(init=False, default=0.0)
    """Clock time (s) of the latest :meth:`see`."""
    _retired: dict[str, tuple[int, int]] = field(init=False)
    """Per target, the observations and misses of classes whose trackers were dropped."""
    _tpot_model: TpotModel | None = field(init=False, default=None)
    """What TPOT outcomes are scored against (:meth:`rebase_tpot`); None: the prediction
    at dispatch."""
    _generations: int = field(init=False, default=0)
    """Trackers created so far (the unnamed class's are generation 0): the next ones'
    :attr:`ClassTrackers.generation`."""

    def __post_init__(self) -> None:
        if self.max_classes < 0:
            raise ValueError(f"max_classes must be >= 0, got {self.max_classes!r}")
        self.pool = ClassTrackers.new(self.alpha)
        self.classes = {}
        self.presence = ClassPresence(max_classes=max(2, self.max_classes))
        self._retired = {"ttft": (0, 0), "tpot": (0, 0)}

    def see(self, classes: Sequence[str | None], now: float) -> None:
        """A decision's candidates' hardware classes at ``now`` (clock s); a hardware-blind
        calibration (``max_classes`` 0) ignores them."""
        if self.max_classes == 0:
            return
        self._now = now
        self.presence.see(classes, now)

    @property
    def ttft(self) -> QuantileTracker:
        """The unnamed class's TTFT tracker over all prediction sizes."""
        return self.pool.ttft

    @ttft.setter
    def ttft(self, tracker: QuantileTracker) -> None:
        self.pool.ttft = tracker

    @property
    def tpot(self) -> QuantileTracker:
        """The unnamed class's TPOT tracker."""
        return self.pool.tpot

    @tpot.setter
    def tpot(self, tracker: QuantileTracker) -> None:
        self.pool.tpot = tracker

    def of(self, hardware_class: str | None) -> ClassTrackers:
        """The trackers that scale and learn from rows of ``hardware_class`` (None, per-class
        calibration off, or classes full: the unnamed class's)."""
        if hardware_class is None or self.max_classes == 0:
            return self.pool
        trackers = self.classes.get(hardware_class)
        if trackers is None:
            if len(self.classes) >= self.max_classes and not self._free_slot():
                return self.pool
            trackers = self.classes[hardware_class] = self._new_trackers()
        return trackers

    def _new_trackers(self) -> ClassTrackers:
        self._generations += 1
        trackers = ClassTrackers.new(self.alpha, self._generations)
        trackers.tpot_model = self._tpot_model
        return trackers

    def generation(self, hardware_class: str | None) -> int:
        """The generation of the trackers :meth:`of` gives ``hardware_class`` now: a
        producer records it with the scales it routed on, and feeds the outcome back only
        while it is unchanged (:meth:`trackers_for_outcome`)."""
        return self.of(hardware_class).generation

    def trackers_for_outcome(
        self, hardware_class: str | None, generation: int
    ) -> ClassTrackers | None:
        """The trackers an outcome of a request routed on generation ``generation``'s
        scales may update: None when the class's trackers changed since (:meth:`restart`,
        or its slot was dropped and taken again) — the prediction was another model's, or
        scaled by other trackers, and its ratio would be a stale residual. Outcomes arrive
        seconds late (a TPOT when its request ends), so after a restart the first
        ``min_observations`` ratios would otherwise be mostly the old model's."""
        trackers = self.of(hardware_class)
        return trackers if trackers.generation == generation else None

    def _free_slot(self) -> bool:
        """Drop the trackers of one class no longer present (its servers left); False if
        every class with trackers is still present, or no caller reports presence (a
        calibration used without :meth:`see` keeps its first classes)."""
        if not self.presence.last_seen:
            return False
        now = self._now
        for cls in self.classes:
            if not self.presence.present(cls, now):
                self._retire(self.classes.pop(cls))
                return True
        return False

    def _retire(self, gone: ClassTrackers) -> None:
        """Keep the counts of trackers being dropped in :meth:`totals`."""
        gone.flush_tpot()
        for target, tracker in (("ttft", gone.ttft), ("tpot", gone.tpot)):
            seen, missed = self._retired[target]
            self._retired[target] = (seen + tracker.observations, missed + tracker.misses)

    def restart(self, hardware_class: str) -> bool:
        """Forget ``hardware_class``'s ratios (its scales back to 1; its observation and
        miss counts go on): its predictions now come from another model (a class that
        borrowed a donor's model times a ratio got its own, or another donor). True if it
        had trackers. The fresh trackers are a new :attr:`ClassTrackers.generation`:
        outcomes of requests routed before are not fed to them (:meth:`trackers_for_outcome`).

        Why: the ratios are residuals of the model that made the predictions, and a
        class's first own model errs unlike the donor it replaces. Kept, they set the new
        model's scale — heterogeneous-pool, 80 req/s, seed 2: the A100s' first 64 ratios,
        against the H100 model times a measured ratio, had a p90 of 4.2, so the A100's
        own model started at the bound of 4; judged 29× slower than they were (the
        oracle's TTFT), the A100s got 4 % of the requests for the next 9 s and too few
        outcomes to move the scale, while the H100s were flooded."""
        gone = self.classes.get(hardware_class)
        if gone is None:
            return False
        gone.flush_tpot()
        fresh = self._new_trackers()
        # The counters go on (the per-class observation counter stays monotonic).
        for old, new in zip(
            (gone.ttft, gone.tpot, *gone.ttft_bins),
            (fresh.ttft, fresh.tpot, *fresh.ttft_bins),
            strict=True,
        ):
            new.observations, new.misses = old.observations, old.misses
        self.classes[hardware_class] = fresh
        return True

    def trackers(self, hardware_class: str | None) -> tuple[QuantileTracker, QuantileTracker]:
        """The all-sizes (TTFT, TPOT) trackers of ``hardware_class`` (see :meth:`of`)."""
        trackers = self.of(hardware_class)
        return trackers.ttft, trackers.tpot

    def totals(self, target: str) -> tuple[int, int]:
        """Observations and misses of ``target`` (``ttft`` or ``tpot``) over every class,
        also those whose trackers were dropped: monotonic, for the pool-wide counters."""
        seen, missed = self._retired[target]
        for trackers in (self.pool, *self.classes.values()):
            tracker = trackers.ttft if target == "ttft" else trackers.tpot
            seen += tracker.observations
            missed += tracker.misses
        return seen, missed

    @property
    def mixed(self) -> bool:
        """Whether two or more hardware classes are present (:meth:`see`): the TTFT scales
        per prediction size apply, and streamed TTFTs count at their first token (the
        producer), only then. On a pool of one class both cost SLO attainment
        (``slo-mixed``, 85 req/s, 3 seeds: 83.9 % against 86.9 %, medians): there the
        all-sizes scale, updated when requests end, smooths what the finer one chases; on
        a mixed pool its lag let one class be flooded before its scale moved
        (``heterogeneous-pool``, 80 req/s: 69.6 % against 64.2 %). A class whose servers
        all left stops counting after the presence window (class docstring)."""
        return self.presence.mixed(self._now)

    def rebase_tpot(self, model: TpotModel, changed: Iterable[str | None]) -> None:
        """What predicts TPOT is now ``model``; the ``changed`` classes' TPOT models (or
        ratios) are not those of before. Outcomes still waiting are scored against the
        previous model (it was in use when they ended); then every later outcome, of
        every class, against ``model`` (:meth:`ClassTrackers.observe_tpot`), and the
        trackers of the changed classes forget their ratios (each scale stays until it
        is next recomputed). A changed class without trackers of its own (none yet, or
        beyond ``max_classes``: the unnamed class's) rebases the unnamed class's."""
        for trackers in self._all_trackers():
            trackers.flush_tpot()
        self._tpot_model = model
        rebased: list[ClassTrackers] = []
        for cls in changed:
            own = None if cls is None else self.classes.get(cls)
            if own is None and cls is not None and not self._overflows():
                continue  # no trackers yet: nothing to forget
            trackers = self.pool if own is None else own
            if all(trackers is not t for t in rebased):
                trackers.tpot.rebase()
                rebased.append(trackers)
        for trackers in self._all_trackers():
            trackers.tpot_model = model

    def _overflows(self) -> bool:
        """Whether a class without trackers would be calibrated as the unnamed class."""
        return self.max_classes == 0 or len(self.classes) >= self.max_classes

    def score_tpot_at_dispatch(self) -> None:
        """Score TPOT outcomes against the prediction each request was routed on again
        (the pool is of one class: :meth:`rebase_tpot` is for mixed pools); the ratios are
        kept."""
        for trackers in self._all_trackers():
            trackers.flush_tpot()
            trackers.tpot_model = None
        self._tpot_model = None

    def _all_trackers(self) -> list[ClassTrackers]:
        return [self.pool, *self.classes.values()]

    def scales(self, hardware_class: str | None, ttft_ms: float) -> tuple[float, float]:
        """The (TTFT, TPOT) multipliers for a row of ``hardware_class`` whose unscaled TTFT
        prediction is ``ttft_ms`` (binned by size on a :attr:`mixed` pool)."""
        trackers = self.of(hardware_class)
        ttft = trackers.ttft_scale(ttft_ms) if self.mixed else trackers.ttft.scale
        return ttft, trackers.tpot.scale


__all__ = [
    "TTFT_BIN_EDGES_MS",
    "WINDOW",
    "ClassTrackers",
    "LatencyCalibration",
    "QuantileTracker",
    "TpotModel",
]
