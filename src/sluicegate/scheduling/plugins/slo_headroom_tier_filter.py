"""``slo-headroom-tier-filter``: prefer endpoints predicted to meet the request's SLOs.

Type: filter. Inputs: the predictions of ``predicted-latency-producer``.
Parameters: ``epsilonExploreNeg`` (0.01).

Algorithm (llm-d-router's, source below): the positive tier holds endpoints whose TTFT and
TPOT headroom are both ≥ 0; the rest (and endpoints without a prediction) form the negative
tier. With both tiers non-empty, keep the positive one — or, with probability
``epsilonExploreNeg``, the negative one, so the models keep learning about busy endpoints.
With one tier, keep it; with no predictions at all, keep everything. Without SLO headers
every headroom is negative, so the filter keeps everything.
Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier/plugin.go
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import PREDICTIONS, CycleState, Filter, LLMRequest, PluginParameters


class SloHeadroomTierFilter(Filter):
    type_name = "slo-headroom-tier-filter"

    class Parameters(PluginParameters):
        epsilon_explore_neg: float = Field(0.01, ge=0.0, le=1.0)

    params: Parameters

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        predictions = state.get(PREDICTIONS)
        if not predictions:
            return list(endpoints)
        positive, negative = [], []
        for e in endpoints:
            p = predictions.get(e.name)
            if p is not None and p.ttft_headroom >= 0 and p.tpot_headroom >= 0:
                positive.append(e)
            else:
                negative.append(e)
        if positive and negative:
            return negative if self.rng.random() < self.params.epsilon_explore_neg else positive
        return positive or negative
