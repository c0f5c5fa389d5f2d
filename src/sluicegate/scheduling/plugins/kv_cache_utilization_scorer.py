"""``kv-cache-utilization-scorer``: prefer endpoints with free KV-cache memory.

Type: scorer (distribution). Inputs: each endpoint's KV-cache usage as a fraction 0..1 —
the last scrape's ``vllm:kv_cache_usage_perc`` plus the prompt tokens this gateway
dispatched since that scrape divided by the KV capacity in tokens (when the capacity is
known), capped at 1 (:meth:`~sluicegate.datalayer.endpoint.Endpoint.kv_usage`). An endpoint
that was never scraped counts as full. Parameters: none.

Formula: ``score = 1 − usage``, clamped to [0, 1] (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/kvcache_utilization.go).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Scorer


class KVCacheUtilizationScorer(Scorer):
    type_name = "kv-cache-utilization-scorer"
    category = "distribution"

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        out: list[float] = []
        for e in endpoints:
            s = 1.0 - e.kv_usage()
            # kv_usage() is at most 1 (never NaN); only a bogus negative scrape exceeds 1.
            out.append(s if s <= 1.0 else 1.0)
        return out
