"""``kv-cache-utilization-scorer``: prefer endpoints with free KV-cache memory.

Type: scorer (distribution). Inputs: each endpoint's KV-cache usage as a fraction 0..1 —
the last scrape's ``vllm:kv_cache_usage_perc`` plus the prompt tokens this gateway
dispatched since that scrape divided by the KV capacity in tokens (when the capacity is
known), capped at 1 (:meth:`~sluicegate.datalayer.endpoint.Endpoint.kv_usage`). An endpoint
that was never scraped counts as full. Parameters: ``capacityNormalization`` (``off`` |
``configured`` | ``measured``, default ``off``) and ``classCapacity`` (per hardware class,
empty) — see :mod:`sluicegate.scheduling.capacity`.

Formula: ``score = 1 − usage``, clamped to [0, 1] (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization/kvcache_utilization.go).
With capacity normalisation: ``score = (1 − usage) / f``, ``f = c_max / c`` the endpoint's
load factor — free KV weighed by how fast the endpoint serves what it admits (an A100 a
third as fast as the H100 beside it scores a third of the H100's score at the same use).
``f = 1`` everywhere on a homogeneous pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    CycleState,
    LLMRequest,
)
from sluicegate.scheduling.capacity import CapacityScorer


class KVCacheUtilizationScorer(CapacityScorer):
    type_name = "kv-cache-utilization-scorer"
    category = "distribution"

    params: CapacityScorer.Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        out: list[float] = []
        for e in endpoints:
            s = 1.0 - e.kv_usage()
            # kv_usage() is at most 1 (never NaN); only a bogus negative scrape exceeds 1.
            out.append(s if s <= 1.0 else 1.0)
        factors = self.capacity.factors(endpoints)
        if factors is not None:
            return [s / f for s, f in zip(out, factors, strict=True)]
        return out
