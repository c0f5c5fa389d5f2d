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
    """One tracker per predicted target (TTFT, TPOT), for a predictor of the α-quantile."""

    alpha: float
    ttft: QuantileTracker = field(init=False)
    tpot: QuantileTracker = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = QuantileTracker(self.alpha)
        self.tpot = QuantileTracker(self.alpha)


__all__ = ["WINDOW", "LatencyCalibration", "QuantileTracker"]
