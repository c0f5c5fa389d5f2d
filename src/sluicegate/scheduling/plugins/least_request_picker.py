"""``least-request``: the endpoint with the fewest requests in flight from this gateway.

Type: picker (a baseline: a "least connections" load balancer, blind to scores; not a
plugin of the reference endpoint picker — sluicegate's ``least-request`` preset uses it).
Inputs: each endpoint's in-flight requests (count) — dispatched by this gateway and not yet
completed (``inflight.requests``), plus the other replicas' with shared state
(``Endpoint.dispatched_requests``). Parameters: ``maxNumOfEndpoints`` (1) — how many
endpoints to return, fewest first.

Algorithm: the minimum count wins; ties are broken uniformly at random with the context's
seeded RNG (for k = 1 one uniform draw among the tied candidates; for k > 1 a shuffle
followed by a stable sort by count, as ``max-score-picker`` does).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Picker, PickerParameters, ScoredEndpoint


def _requests(s: ScoredEndpoint) -> int:
    return s.endpoint.dispatched_requests


class LeastRequestPicker(Picker):
    type_name = "least-request"
    Parameters = PickerParameters
    params: PickerParameters

    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        rng = self.rng
        k = self.params.max_num_of_endpoints
        if k > 1:
            order = list(scored)
            rng.shuffle(order)
            order.sort(key=_requests)
            return [s.endpoint for s in order[:k]]
        if not scored:
            return []
        # Two passes and at most one random draw: the minimum and its ties, then the chosen tie.
        best_r = scored[0].endpoint.dispatched_requests
        ties = 0
        for s in scored:
            r = s.endpoint.dispatched_requests
            if r < best_r:
                best_r, ties = r, 1
            elif r == best_r:
                ties += 1
        nth = rng.randrange(ties) if ties > 1 else 0
        for s in scored:
            if s.endpoint.dispatched_requests == best_r:
                if nth == 0:
                    return [s.endpoint]
                nth -= 1
        raise AssertionError("unreachable: the minimum is among the candidates")
