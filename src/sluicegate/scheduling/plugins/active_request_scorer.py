"""``active-request-scorer``: prefer endpoints with fewer requests in flight from the gateway.

Type: scorer (distribution). Inputs: each endpoint's in-flight requests r (count) — those
this gateway dispatched and that have not completed (``inflight.requests``, updated at
dispatch and completion, so it needs no scrape), plus, with shared state, the other
replicas' (``peers.requests``; ``Endpoint.dispatched_requests`` is the sum).
Parameters (names and defaults as in llm-d-router; the formula below is sluicegate's):

- ``idleThreshold`` T (0): an endpoint with at most T requests in flight is idle.
- ``maxBusyScore`` B (1.0, in [0, 1]): scale of the scores of busy endpoints.

Formula, with ``maxR`` the largest r among the candidates:

- idle (``r ≤ T``) → **1.0**;
- busy (``r > T``) → ``B · (maxR − r) / (maxR − T)``, which lies in [0, B): the busiest
  candidate scores 0 and a busy endpoint never reaches an idle one's 1.0.

With capacity normalisation (``capacityNormalization``: ``off`` | ``configured`` |
``measured``, default ``off``; ``classCapacity`` per hardware class — see
:mod:`sluicegate.scheduling.capacity`) a busy endpoint's ``r`` (and ``maxR``) is ``r · f``,
``f = c_max / c`` its load factor: requests in flight in units of the fastest candidate's
service time; idleness is judged on the plain count. ``f = 1`` everywhere on a homogeneous
pool.

With the defaults this is llm-d-router's ``active-request-scorer``
(https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/activerequest/active_request.go):
1.0 for no requests, else ``(maxR − r) / maxR``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    CycleState,
    LLMRequest,
)
from sluicegate.scheduling.capacity import CapacityParameters, CapacityScorer


class ActiveRequestScorer(CapacityScorer):
    type_name = "active-request-scorer"
    category = "distribution"

    class Parameters(CapacityParameters):
        idle_threshold: int = Field(0, ge=0)
        max_busy_score: float = Field(1.0, ge=0.0, le=1.0)

    params: Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        factors = self.capacity.factors(endpoints)
        if factors is not None:
            return self._normalised(endpoints, factors)
        idle = self.params.idle_threshold
        max_r = idle
        for e in endpoints:
            r = e.dispatched_requests
            if r > max_r:
                max_r = r
        if max_r == idle:  # every candidate is idle
            return [1.0] * len(endpoints)
        scale = self.params.max_busy_score / (max_r - idle)
        out: list[float] = []
        for e in endpoints:
            r = e.dispatched_requests
            out.append(1.0 if r <= idle else scale * (max_r - r))
        return out

    def _normalised(self, endpoints: Sequence[Endpoint], factors: Sequence[float]) -> list[float]:
        idle = self.params.idle_threshold
        # Peers' requests count as in the plain path: with shared state on, an endpoint
        # another replica has loaded is busy here too.
        counts = [e.dispatched_requests for e in endpoints]
        loads = [None if r <= idle else r * f for r, f in zip(counts, factors, strict=True)]
        max_r = max((r for r in loads if r is not None), default=None)
        if max_r is None:
            return [1.0] * len(endpoints)
        scale = self.params.max_busy_score / (max_r - idle)
        return [1.0 if r is None else scale * (max_r - r) for r in loads]
