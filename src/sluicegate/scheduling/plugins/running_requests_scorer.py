"""``running-requests-size-scorer``: prefer endpoints running fewer requests.

Type: scorer (distribution). Inputs: each endpoint's running requests (count) — the last
scrape's ``vllm:num_requests_running``, raised to what the gateway's own in-flight count
implies (in-flight − waiting), or the in-flight count itself for an endpoint that was never
scraped (:attr:`~sluicegate.datalayer.endpoint.Endpoint.running`).
Parameters: none.

Formula: ``score = (maxR − r) / (maxR − minR)`` over the candidates; 1.0 for every
endpoint when all counts are equal — the queue-scorer's min-max inverse applied to running
requests (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/runningrequests/runningrequest.go).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Scorer
from sluicegate.framework.helpers import min_max_inverse


class RunningRequestsSizeScorer(Scorer):
    type_name = "running-requests-size-scorer"
    category = "distribution"

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        return min_max_inverse([e.running for e in endpoints])
