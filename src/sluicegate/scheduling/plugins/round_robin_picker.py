"""``round-robin``: every candidate in turn, blind to load, scores and cache.

Type: picker (a baseline: what a Kubernetes Service in round-robin mode gives; not a
plugin of the reference endpoint picker — sluicegate's ``round-robin`` preset uses it).
Inputs: the candidates' names; scores are ignored. Parameters: ``maxNumOfEndpoints`` (1) —
how many endpoints to return (picker parameters as in llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/picker/common.go).

Algorithm: order the candidates by endpoint name; request number c (an internal counter
starting at 0, advanced by one per pick) goes to candidate ``c mod n``, with the next
``k − 1`` candidates in that order (wrapping around) as fallbacks. With a stable candidate
set each endpoint receives every n-th request; when the set changes the cycle continues
from the same counter over the new order.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    CycleState,
    LLMRequest,
    Picker,
    PickerParameters,
    PluginContext,
    PluginParameters,
    ScoredEndpoint,
)


def _name(s: ScoredEndpoint) -> str:
    return s.endpoint.name


class RoundRobinPicker(Picker):
    type_name = "round-robin"
    Parameters = PickerParameters
    params: PickerParameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        super().__init__(name, context, params)
        self._counter = 0

    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        n = len(scored)
        if n == 0:
            return []
        order = sorted(scored, key=_name)
        start = self._counter % n
        self._counter += 1
        k = min(self.params.max_num_of_endpoints, n)
        return [order[(start + j) % n].endpoint for j in range(k)]
