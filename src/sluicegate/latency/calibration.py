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
and what then happened, by online quantile tracking of the ratio observed ÷ predicted
(the update of adaptive conformal inference, Gibbs & Candès, NeurIPS 2021)::

    log s ← log s + η · (1[observed > s · predicted] − (1 − α))

At equilibrium the share of outcomes above ``s · predicted`` is 1 − α: each miss raises
``s`` by a factor e^(η·α), each hit lowers it by e^(−η·(1−α)). ``s`` is clamped to
[``min_scale``, ``max_scale``] so one burst of outliers cannot run it away. Predictions
handed to the plugins are the models' times ``s``; a mean-objective model is not rescaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_RATE = 0.02
"""η: the step of log s per observation. At α = 0.9 one miss raises s by 1.8 %, one hit
lowers it by 0.2 %; the scale follows a shift in a few hundred requests."""


@dataclass(slots=True)
class QuantileTracker:
    """The multiplier that makes ``s · prediction`` an α-quantile on routed requests."""

    alpha: float
    rate: float = DEFAULT_RATE
    min_scale: float = 0.5
    max_scale: float = 4.0
    scale: float = 1.0
    observations: int = 0
    misses: int = 0
    """Observations above ``scale · prediction`` at the time they were made."""
    _log_scale: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("alpha must be in (0, 1)")
        if self.rate <= 0.0:
            raise ValueError("rate must be > 0")
        if not 0.0 < self.min_scale <= 1.0 <= self.max_scale:
            raise ValueError("need 0 < min_scale <= 1 <= max_scale")
        self._log_scale = math.log(self.scale)

    def update(self, predicted: float, observed: float) -> None:
        """One routed request: the model's prediction at dispatch (before scaling) and
        the observed value, in the same unit. Non-positive or non-finite values are
        ignored."""
        if not (predicted > 0.0 and observed >= 0.0) or not math.isfinite(predicted * observed):
            return
        miss = observed > self.scale * predicted
        self.observations += 1
        self.misses += miss
        step = self.rate * ((1.0 if miss else 0.0) - (1.0 - self.alpha))
        self._log_scale = min(
            math.log(self.max_scale), max(math.log(self.min_scale), self._log_scale + step)
        )
        self.scale = math.exp(self._log_scale)


@dataclass(slots=True)
class LatencyCalibration:
    """One tracker per predicted target (TTFT, TPOT), for a predictor of the α-quantile."""

    alpha: float
    rate: float = DEFAULT_RATE
    ttft: QuantileTracker = field(init=False)
    tpot: QuantileTracker = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = QuantileTracker(self.alpha, self.rate)
        self.tpot = QuantileTracker(self.alpha, self.rate)


__all__ = ["DEFAULT_RATE", "LatencyCalibration", "QuantileTracker"]
