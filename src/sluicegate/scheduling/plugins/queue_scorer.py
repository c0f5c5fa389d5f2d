"""``queue-scorer``: prefer endpoints with shorter waiting queues.

Type: scorer (distribution). Inputs: each endpoint's waiting requests — the last scrape's
``vllm:num_requests_waiting``, raised to what the gateway's own in-flight count implies
(in-flight − running) so a stale scrape cannot hide a queue the gateway built itself.
Parameters: ``capacityNormalization`` (``off`` | ``configured`` | ``measured``, default
``off``) and ``classCapacity`` (per hardware class, empty) — see
:mod:`sluicegate.scheduling.capacity`.

Formula: ``score = (maxQ − q) / (maxQ − minQ)`` over the candidates; 1.0 for every endpoint
when all queues are equal (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go).
With capacity normalisation ``q`` is ``q · f``, ``f = c_max / c`` the endpoint's load
factor (its class's capacity ``c`` against the fastest candidate's): the queue in units of
the fastest endpoint's drain time. ``f = 1`` everywhere on a homogeneous pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    CycleState,
    LLMRequest,
)
from sluicegate.framework.helpers import min_max_inverse
from sluicegate.scheduling.capacity import CapacityScorer


class QueueScorer(CapacityScorer):
    type_name = "queue-scorer"
    category = "distribution"

    params: CapacityScorer.Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        factors = self.capacity.factors(endpoints)
        if factors is None:
            return min_max_inverse([e.waiting for e in endpoints])
        return min_max_inverse([e.waiting * f for e, f in zip(endpoints, factors, strict=True)])
