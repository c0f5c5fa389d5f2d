"""``cost-aware-scorer``: among endpoints predicted to meet the SLO, prefer the cheapest.

Type: scorer (balance). Inputs: the predictions of ``predicted-latency-producer`` (TTFT and
TPOT per candidate, and whether they meet the request's SLOs), each endpoint's cost
(``Endpoint.hardware.cost_per_hour``, currency per hour) and running requests, and the
request's expected output length. Parameters: ``unknownCost`` (``most-expensive``): how an
endpoint without a cost counts — ``most-expensive`` (as the dearest known cost per hour
among the candidates) or ``free`` (0 per hour); ``sharedBatch`` (false): whether the
endpoint's predicted output rate counts the batch the request joins (below).

Formula, for a candidate ``e`` with this request added:

- ``b = running + 1`` sequences in its batch with ``sharedBatch``, else ``b = 1`` (the
  request's own stream), each producing a token every ``τ`` ms —
  the predicted TPOT, or, when there is none (non-streaming: TTFT stands for the whole
  request), predicted TTFT / max(expected output tokens, 1);
- predicted output rate ``T = b · 1000 / τ`` tokens/s, and
  **cost per predicted token** ``k = cost_per_hour / (3600 · T)``;
- the *meeting* set ``M``: candidates with a prediction whose TTFT and TPOT are both
  predicted within the SLOs (``EndpointPrediction.valid``);
- score ``k_min / k`` for ``e ∈ M`` (the cheapest 1.0; a cost of 0 with ``k_min = 0``
  scores 1), 0 outside ``M``. If no candidate has a cost, every member of ``M`` scores 1.0
  (cost cannot tell them apart). If ``M`` is empty (no prediction, no SLO, or none meets
  it) every candidate scores 0: the other scorers decide.

Why per token: an endpoint's price is per hour, its output per token; the cheapest
hardware per token is packed first and the SLO test moves requests to other hardware once
it would miss them. ``sharedBatch`` also credits a busy endpoint with the batch the
request shares (its cost per token falls with load), which packs harder — measured on the
``heterogeneous-pool`` scenario (80 req/s, seed 0) it herded requests onto the busiest
endpoint: SLO attainment 59.9 % against 71.1 % per stream, at a higher cost per 1M output
tokens ($0.302 against $0.290, busy). Use it next to ``latency-scorer`` (which breaks ties
by headroom) in the ``cost-aware`` preset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import PREDICTIONS, CycleState, LLMRequest, PluginParameters, Scorer

_MIN_TAU_MS = 1e-3
"""Floor of the per-token time (ms), so a zero prediction cannot divide by zero."""


class CostAwareScorer(Scorer):
    type_name = "cost-aware-scorer"
    category = "balance"

    class Parameters(PluginParameters):
        unknown_cost: Literal["most-expensive", "free"] = "most-expensive"
        shared_batch: bool = False

    params: Parameters

    @property
    def hardware_aware(self) -> bool:
        """It prices each endpoint by its hardware."""
        return True

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        predictions = state.get(PREDICTIONS)
        out = [0.0] * len(endpoints)
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
        for k, (i, _, _) in zip(per_token, meeting, strict=True):
            out[i] = 1.0 if k <= cheapest else cheapest / k
        return out
