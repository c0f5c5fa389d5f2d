"""``load-threshold-filter``: keep endpoints whose queue and KV-cache use are under limits.

Type: filter. Inputs: each candidate's waiting requests and KV-cache use 0..1 — the
gateway's load estimates (:attr:`~sluicegate.datalayer.endpoint.Endpoint.waiting`,
:meth:`~sluicegate.datalayer.endpoint.Endpoint.kv_usage`: the last scrape, raised by what
the gateway dispatched since, so a stale scrape cannot hide load the gateway put there).
Parameters: ``maxWaitingQueue`` (none), ``maxKvCacheUsage`` (none); a limit left out is
not checked.

Formula: keep ``e`` when ``waiting(e) ≤ maxWaitingQueue`` and ``kv_usage(e) ≤
maxKvCacheUsage`` (both inclusive). Gateway API Inference Extension v0.3.0's predicates
(``pkg/epp/scheduling/filter.go`` at tag v0.3.0,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v0.3.0/pkg/epp/scheduling/filter.go):
``lowQueueingPodPredicate`` (``queue < QUEUING_THRESHOLD_LORA`` = 128) is
``maxWaitingQueue: 127``; ``noQueueAndLessThanKVCacheThresholdPredicate`` (``queue ≤
QUEUE_THRESHOLD_CRITICAL`` = 5 and ``kv ≤ KV_CACHE_THRESHOLD`` = 0.8) is
``maxWaitingQueue: 5, maxKvCacheUsage: 0.8``. (v0.3.0 read the scrape alone.)
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, Filter, LLMRequest, PluginParameters


class LoadThresholdFilter(Filter):
    type_name = "load-threshold-filter"

    class Parameters(PluginParameters):
        max_waiting_queue: int | None = Field(None, ge=0)
        max_kv_cache_usage: float | None = Field(None, ge=0.0, le=1.0)

    params: Parameters

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        max_queue = self.params.max_waiting_queue
        max_kv = self.params.max_kv_cache_usage
        return [
            e
            for e in endpoints
            if (max_queue is None or e.waiting <= max_queue)
            and (max_kv is None or e.kv_usage() <= max_kv)
        ]
