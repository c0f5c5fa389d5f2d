"""The predictor interface the scheduling plugins use, whatever runs the models.

Implementations: in-process XGBoost models (the default), a client of remote prediction
servers, and — in the benchmark lab — an oracle that asks the simulator. A predictor that
cannot answer (models still warming up, servers down, a timeout) returns None and the
plugins fall back to the heuristic composite score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import FeatureRow, Sample


@dataclass(frozen=True, slots=True)
class Predictions:
    """Predicted TTFT and TPOT in ms, one entry per input row."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray


class LatencyPredictor(Protocol):
    @property
    def calibration(self) -> LatencyCalibration | None:
        """Online rescaling of quantile predictions, applied and fed by the plugins (None:
        the predictions are used as they come)."""
        ...

    @property
    def ready(self) -> bool:
        """Whether predictions can be made (a model has been trained or loaded)."""
        ...

    def predict(self, rows: Sequence[FeatureRow]) -> Predictions | None:
        """TTFT/TPOT for every row in one call; None when no prediction can be made."""
        ...

    def observe(self, sample: Sample) -> None:
        """Record a completed request for training (cheap; never blocks)."""
        ...


class RemoteLatencyPredictor(Protocol):
    """A predictor behind the network: asked before scheduling, with a deadline."""

    @property
    def calibration(self) -> LatencyCalibration | None: ...

    async def predict_async(self, rows: Sequence[FeatureRow]) -> Predictions | None:
        """TTFT/TPOT for every row; None on failure or timeout (callers fall back)."""
        ...

    def observe(self, sample: Sample) -> None:
        """Queue a completed request for the training server (batched, never blocks)."""
        ...


class RequestAwarePredictor(Protocol):
    """A predictor that needs the request and endpoints themselves, not just the feature
    rows (the benchmark lab's oracle, which asks the simulated engines)."""

    def predict_request(
        self, request: Any, endpoints: Sequence[Any], rows: Sequence[FeatureRow]
    ) -> Predictions | None:
        """TTFT/TPOT of ``request`` on each of ``endpoints`` (rows in the same order)."""
        ...

    def observe(self, sample: Sample) -> None: ...
