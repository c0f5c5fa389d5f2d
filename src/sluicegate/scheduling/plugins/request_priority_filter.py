"""``request-priority-filter``: pass every endpoint for requests of high enough priority.

Type: filter (a predicate on the request, the same for every endpoint). Inputs: the
request's priority (its InferenceObjective's, else its InferenceModel's criticality:
Critical 100, Standard 0, Sheddable −10). Parameters: ``minPriority`` (1).

Formula: keep all candidates when ``priority ≥ minPriority``, none otherwise. With the
default it is Gateway API Inference Extension v0.3.0's ``criticalRequestPredicate`` (only
Critical passes; ``pkg/epp/scheduling/filter.go`` at tag v0.3.0,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v0.3.0/pkg/epp/scheduling/filter.go),
useful as the first node of a ``decision-tree-filter``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, Filter, LLMRequest, PluginParameters


class RequestPriorityFilter(Filter):
    type_name = "request-priority-filter"

    class Parameters(PluginParameters):
        min_priority: int = 1

    params: Parameters

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        return list(endpoints) if request.priority >= self.params.min_priority else []
