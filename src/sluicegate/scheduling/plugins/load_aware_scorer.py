"""``load-aware-scorer``: prefer endpoints with short waiting queues, on an absolute scale.

Type: scorer (distribution). Inputs: each endpoint's waiting requests q (count), as for
``queue-scorer``: the last scrape's ``vllm:num_requests_waiting`` raised to what the
gateway's own in-flight count implies
(:attr:`~sluicegate.datalayer.endpoint.Endpoint.waiting`).
Parameters: ``threshold`` T (128) — waiting requests (count) at which an endpoint scores 0.

Formula (llm-d-router's ``load-aware-scorer``, source below): ``q ≤ 0 → 0.5``;
``q ≥ T → 0``; otherwise ``0.5 · (1 − q / T)``. Scores never exceed 0.5, so the scorer
only separates loaded endpoints and leaves idle ones level with each other.
Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/loadaware/load_aware.go
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, PluginParameters, Scorer


class LoadAwareScorer(Scorer):
    type_name = "load-aware-scorer"
    category = "distribution"

    class Parameters(PluginParameters):
        threshold: int = Field(128, ge=1)

    params: Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        t = self.params.threshold
        out: list[float] = []
        for e in endpoints:
            q = e.waiting
            if q <= 0:
                out.append(0.5)
            elif q >= t:
                out.append(0.0)
            else:
                out.append(0.5 * (1.0 - q / t))
        return out
