"""``queue-scorer``: prefer endpoints with shorter waiting queues.

Type: scorer (distribution). Inputs: each endpoint's waiting requests — the last scrape's
``vllm:num_requests_waiting``, raised to what the gateway's own in-flight count implies
(in-flight − running) so a stale scrape cannot hide a queue the gateway built itself.
Parameters: none.

Formula: ``score = (maxQ − q) / (maxQ − minQ)`` over the candidates; 1.0 for every endpoint
when all queues are equal (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Scorer
from sluicegate.framework.helpers import min_max_inverse


class QueueScorer(Scorer):
    type_name = "queue-scorer"
    category = "distribution"

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        return min_max_inverse([e.waiting for e in endpoints])
