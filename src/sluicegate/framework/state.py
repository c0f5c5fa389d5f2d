"""Data that plugins and the host share through a request's cycle state.

Several plugins — and the host's metrics and in-flight accounting — read what one plugin
produced: the prefix-cache match of every candidate, the latency predictions, how the
prediction went. Their keys and value types live here, so a reader imports this module,
never the plugin that writes them.

- :data:`PREFIX_MATCH` (:class:`PrefixMatch`), written by the prefix-cache producer
  (:data:`PREFIX_PRODUCER_TYPE` by default);
- :data:`PREDICTIONS` (:class:`EndpointPrediction` by endpoint name) and
  :data:`PREDICTION_OUTCOME` (:class:`PredictionOutcome`), written by the
  predicted-latency producer, which asks the host's :data:`PREDICTOR_SERVICE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sluicegate.framework.scheduling import StateKey

PREFIX_PRODUCER_TYPE = "approx-prefix-cache-producer"
"""The producer type created when a plugin reads :data:`PREFIX_MATCH` and none is
configured."""
PREDICTOR_SERVICE = "latency-predictor"
"""The name under which the host provides the latency predictor (``PluginContext.services``):
a ``sluicegate.latency.predictor.LatencyPredictor``."""


class ReuseDistances(Protocol):
    """Tells how long ago a block was last sent to an endpoint (a prefix index)."""

    def distance(self, endpoint: str, block_hash: int) -> int | None:
        """Blocks recorded on ``endpoint`` since ``block_hash`` last was; None if unknown."""
        ...


@dataclass(slots=True)
class PrefixMatch:
    """How much of a request's prompt each candidate probably has cached."""

    hashes: list[int]
    block_tokens: int
    matched_blocks: dict[str, int]
    """Leading blocks recorded per endpoint name."""
    index: ReuseDistances | None = None
    """The index matched against (for :meth:`reuse_distance_tokens`)."""
    prompt_blocks: int | None = None
    """The prompt's blocks when ``hashes`` stops short of them (the precise producer
    keys a prompt only as far as any endpoint matches it); None: ``len(hashes)``."""

    @property
    def total_blocks(self) -> int:
        return len(self.hashes) if self.prompt_blocks is None else self.prompt_blocks

    def score(self, endpoint: str) -> float:
        """Share of the prompt's blocks the endpoint holds, 0..1 (0 for an empty prompt)."""
        total = self.total_blocks
        return self.matched_blocks.get(endpoint, 0) / total if total else 0.0

    def reuse_distance_tokens(self, endpoint: str) -> int | None:
        """Prompt tokens (whole blocks, a partial last block counted whole) recorded on
        ``endpoint`` since the deepest block of this prompt it holds was last sent there:
        the further, the likelier the server has evicted it. None when it holds none."""
        blocks = self.matched_blocks.get(endpoint, 0)
        if not blocks or self.index is None:
            return None
        distance = self.index.distance(endpoint, self.hashes[blocks - 1])
        return None if distance is None else distance * self.block_tokens


PREFIX_MATCH: StateKey[PrefixMatch] = StateKey("prefix-match")


@dataclass(frozen=True, slots=True)
class EndpointPrediction:
    """Predicted latency of a request on one endpoint, and its SLO headroom (ms)."""

    ttft_ms: float
    tpot_ms: float
    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float
    tpot_headroom: float
    dispatched: int
    """Requests this gateway has in flight on the endpoint."""

    @property
    def valid(self) -> bool:
        return self.ttft_valid and self.tpot_valid


PredictionStatus = Literal["predicted", "warming-up", "unavailable", "opted-out"]
"""``predicted``; ``warming-up`` (no model yet); ``unavailable`` (the predictor answered
nothing: a remote failure or timeout, or no usable prediction); ``opted-out`` (the request
asked not to be scheduled on predictions)."""


@dataclass(frozen=True, slots=True)
class PredictionOutcome:
    """How the latest scheduling pass of a request went, as far as predictions go."""

    status: PredictionStatus
    duration_s: float = 0.0
    """Time the one batched prediction call took (TTFT and TPOT together), in clock
    seconds; 0 unless ``status`` is ``predicted``."""

    @property
    def fallback(self) -> bool:
        """Scheduled on the heuristic composite although predictions were wanted."""
        return self.status in ("warming-up", "unavailable")


PREDICTION_OUTCOME: StateKey[PredictionOutcome] = StateKey("latency-prediction-outcome")
"""Set by every ``produce`` of the producer (the last one is the one scheduled on)."""
PREDICTIONS: StateKey[dict[str, EndpointPrediction]] = StateKey("latency-predictions")
"""Predictions by endpoint name; absent when no prediction could be made."""


__all__ = [
    "PREDICTIONS",
    "PREDICTION_OUTCOME",
    "PREDICTOR_SERVICE",
    "PREFIX_MATCH",
    "PREFIX_PRODUCER_TYPE",
    "EndpointPrediction",
    "PredictionOutcome",
    "PredictionStatus",
    "PrefixMatch",
    "ReuseDistances",
]
