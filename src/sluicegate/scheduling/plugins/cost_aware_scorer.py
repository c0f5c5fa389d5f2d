"""``cost-aware-scorer``: among endpoints predicted to meet the SLO, prefer the cheapest.

Type: scorer (balance). Inputs: the predictions of ``predicted-latency-producer`` (TTFT and
TPOT per candidate, and whether they meet the request's SLOs), each endpoint's cost
(``Endpoint.hardware.cost_per_hour``, currency per hour), hardware class and running
requests, and the request's expected output length. Parameters: ``unknownCost``
(``most-expensive``): how an endpoint without a cost counts — ``most-expensive`` (as the
dearest known cost per hour among the candidates) or ``free`` (0 per hour);
``capacityNormalization`` (``off``) and ``classCapacity`` (empty), as the capacity-aware
heuristics (:mod:`sluicegate.scheduling.capacity`): the output rate an endpoint of each
class sustains, configured or measured while saturated; ``sharedBatch`` (false): whether
the per-stream fallback counts the batch the request joins (below); ``costExponent`` (1,
from 1 to 64): the power the cost ratio is raised to (64: all but strict).

Formula, for a candidate ``e`` with this request added:

- its output rate ``T`` in tokens/s: with capacity normalisation on and every
  candidate's class capacity known, ``T = c(class)`` — what a token costs on that hardware
  when the engine's batch is shared, independent of the moment's load; otherwise, per
  stream, ``T = b · 1000 / τ`` with ``b = running + 1`` (``sharedBatch``) or 1, and ``τ``
  the predicted TPOT (ms), or, without one (non-streaming: TTFT stands for the whole
  request), predicted TTFT / max(expected output tokens, 1);
- **cost per predicted token** ``k = cost_per_hour / (3600 · T)``;
- the *meeting* set ``M``: candidates with a prediction whose TTFT and TPOT are both
  predicted within the SLOs (``EndpointPrediction.valid``);
- score ``(k_min / k) ** costExponent`` for ``e ∈ M`` (the cheapest 1.0; a cost of 0
  with ``k_min = 0`` scores 1), 0 outside ``M``. If no candidate has a cost, every member
  of ``M`` scores 1.0 (cost cannot tell them apart). If ``M`` is empty (no prediction, no
  SLO, or none meets it) every candidate scores 0: the other scorers decide.

Why class capacity: a request's share of an endpoint's hour is its tokens over what the
engine emits in that hour, so the per-token cost is price / throughput of the class. The
per-stream rate prices the request as if it had the engine to itself: ``k ∝ price · τ``,
which ranks by the moment's TPOT ratio rather than by the hardware's cost per token (an
H100 at 3.95/h looks dearer than an A100 at 2.50/h as soon as its TPOT exceeds 0.63 × the
A100's, though per token at saturation it is ~1.7× cheaper on the ``heterogeneous-pool``
scenario: busy $0.187 against $0.326 per 1M output tokens, ``default`` at 100 req/s,
seed 0). ``sharedBatch`` credits a busy endpoint with its batch (its cost per token falls
with load), which herds: on that scenario (80 req/s, seed 0) SLO attainment 59.9 %
against 71.1 % per stream, at a higher cost ($0.302 against $0.290 per 1M, busy).

Why an exponent: beside the latency scorer's 0–1 under a weighted random pick, a score
in proportion to cheapness only shifts the odds, and the requests spread as without it
(heterogeneous-pool, seed 0, 30 req/s: 0 % saved). The ``cost-aware`` preset sets 64
with weight 100, so the pick stays in the cheapest meeting class (a class 10 % dearer
scores 0.002) and the latency scorer spreads the load within it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import PREDICTIONS, CycleState, LLMRequest
from sluicegate.scheduling.capacity import CapacityParameters, CapacityScorer

_MIN_TAU_MS = 1e-3
"""Floor of the per-token time (ms), so a zero prediction cannot divide by zero."""


class CostAwareScorer(CapacityScorer):
    type_name = "cost-aware-scorer"
    category = "balance"

    class Parameters(CapacityParameters):
        unknown_cost: Literal["most-expensive", "free"] = "most-expensive"
        shared_batch: bool = False
        cost_exponent: float = Field(default=1.0, ge=1.0, le=64.0)

    params: Parameters

    @property
    def hardware_aware(self) -> bool:
        """It prices each endpoint by its hardware, capacity normalisation on or off."""
        return True

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        predictions = state.get(PREDICTIONS)
        out = [0.0] * len(endpoints)
        # Every candidate, not only the meeting ones: measured capacity learns from them all.
        capacities = self.capacity.capacities(endpoints)
        if not predictions:
            return out
        meeting: list[tuple[int, Endpoint, float]] = []
        output_tokens = max(request.expected_output_tokens, 1)
        for i, e in enumerate(endpoints):
            p = predictions.get(e.name)
            if p is None or not p.valid:
                continue
            tau = p.tpot_ms if p.tpot_ms > 0 else p.ttft_ms / output_tokens
            batch = e.running + 1 if self.params.shared_batch else 1
            rate = batch * 1000.0 / max(tau, _MIN_TAU_MS)
            meeting.append((i, e, rate))
        if not meeting:
            return out
        if capacities is not None:
            meeting = [(i, e, capacities[i]) for i, e, _ in meeting]
        costs = [e.hardware.cost_per_hour for _, e, _ in meeting]
        known = [c for c in costs if c is not None]
        if not known:
            for i, _, _ in meeting:
                out[i] = 1.0
            return out
        fill = max(known) if self.params.unknown_cost == "most-expensive" else 0.0
        per_token = [
            (fill if c is None else c) / (3600.0 * rate)
            for c, (_, _, rate) in zip(costs, meeting, strict=True)
        ]
        cheapest = min(per_token)
        exponent = self.params.cost_exponent
        for k, (i, _, _) in zip(per_token, meeting, strict=True):
            out[i] = 1.0 if k <= cheapest else (cheapest / k) ** exponent
        return out
