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
are the models' times the scale; a mean-objective model is not rescaled.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

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
    """Observations above ``scale · prediction`` at the time they were made."""
    _ratios: deque[float] = field(init=False, repr=False)

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
        n = len(self._ratios)
        if n >= self.min_observations and self.observations % self.refresh_every == 0:
            quantile = float(np.quantile(np.fromiter(self._ratios, float, n), self.alpha))
            self.scale = min(self.max_scale, max(self.min_scale, quantile))

    @property
    def kept(self) -> int:
        """Ratios in the window (at most ``window``)."""
        return len(self._ratios)


@dataclass(slots=True)
class LatencyCalibration:
    """One tracker per predicted target (TTFT, TPOT), for a predictor of the α-quantile;
    with ``max_classes`` > 0, one such pair per hardware class as well.

    Per class because one scale for a mixed pool is the α-quantile of a mixture: on the
    ``heterogeneous-pool`` scenario (2 × H100 + 4 × A100, 60 req/s, seed 0) the shared
    TTFT scale sat at its 4.0 bound while the median A100 request took 0.19 of its scaled
    prediction, so most requests the A100s served in time were predicted to miss and
    sheddable ones were shed. ``ttft``/``tpot`` are the unnamed class's pair (a
    hardware-blind producer, or rows without a class): a pool of one class, or of none
    named, is calibrated exactly as before. Classes beyond ``max_classes`` share the
    unnamed pair (bounded memory)."""

    alpha: float
    max_classes: int = 0
    ttft: QuantileTracker = field(init=False)
    tpot: QuantileTracker = field(init=False)
    classes: dict[str, tuple[QuantileTracker, QuantileTracker]] = field(init=False)
    """The (TTFT, TPOT) trackers of each hardware class seen (at most ``max_classes``)."""

    def __post_init__(self) -> None:
        if self.max_classes < 0:
            raise ValueError("max_classes must be >= 0")
        self.ttft = QuantileTracker(self.alpha)
        self.tpot = QuantileTracker(self.alpha)
        self.classes = {}

    def trackers(self, hardware_class: str | None) -> tuple[QuantileTracker, QuantileTracker]:
        """The (TTFT, TPOT) trackers that scale and learn from rows of ``hardware_class``
        (None, per-class calibration off, or classes full: the unnamed pair)."""
        if hardware_class is None or self.max_classes == 0:
            return self.ttft, self.tpot
        pair = self.classes.get(hardware_class)
        if pair is None:
            if len(self.classes) >= self.max_classes:
                return self.ttft, self.tpot
            pair = (QuantileTracker(self.alpha), QuantileTracker(self.alpha))
            self.classes[hardware_class] = pair
        return pair

    def scales(self, hardware_class: str | None) -> tuple[float, float]:
        """The (TTFT, TPOT) multipliers for rows of ``hardware_class``."""
        ttft, tpot = self.trackers(hardware_class)
        return ttft.scale, tpot.scale


__all__ = ["WINDOW", "LatencyCalibration", "QuantileTracker"]
