"""``low-band-filter``: keep the endpoints in the lowest 1/n of a load metric's range.

Type: filter. Inputs: each candidate's waiting requests (``metric: waitingQueue``) or
KV-cache use 0..1 (``metric: kvCacheUsage``) — the gateway's load estimates
(:attr:`~sluicegate.datalayer.endpoint.Endpoint.waiting`,
:meth:`~sluicegate.datalayer.endpoint.Endpoint.kv_usage`). Parameters: ``metric``
(``waitingQueue``).

Formula, over the n candidates with values x, ``lo = min x``, ``hi = max x``: keep ``e``
when ``lo ≤ x(e) ≤ lo + (hi − lo) / n`` — integer (floor) division for the queue, which
counts requests, real division for KV use. Never empty for a non-empty input. This is
Gateway API Inference Extension v0.3.0's ``leastQueuingFilterFunc`` and
``leastKVCacheFilterFunc`` (``pkg/epp/scheduling/filter.go`` at tag v0.3.0,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v0.3.0/pkg/epp/scheduling/filter.go):
several endpoints near the minimum leave the next filter a choice, which its authors found
better than the minimum alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, Filter, LLMRequest, PluginParameters


class LowBandFilter(Filter):
    type_name = "low-band-filter"

    class Parameters(PluginParameters):
        metric: Literal["waitingQueue", "kvCacheUsage"] = "waitingQueue"

    params: Parameters

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        if not endpoints:
            return []
        n = len(endpoints)
        if self.params.metric == "waitingQueue":
            queues = [e.waiting for e in endpoints]
            lo = min(queues)
            limit = lo + (max(queues) - lo) // n
            return [e for e, q in zip(endpoints, queues, strict=True) if q <= limit]
        usage = [e.kv_usage() for e in endpoints]
        low = min(usage)
        bound = low + (max(usage) - low) / n
        return [e for e, u in zip(endpoints, usage, strict=True) if u <= bound]
