"""``lora-soft-affinity-filter``: mostly keep the endpoints already serving the adapter.

Type: filter. Inputs: the request's ``target_model``; each candidate's last scrape of
``vllm:lora_requests_info`` — its active adapters (running ∪ waiting) and ``max_lora``.
Parameters: ``affinityThreshold`` (0.999).

Algorithm (Gateway API Inference Extension v0.3.0's ``loRASoftAffinityFilter``,
``pkg/epp/scheduling/filter.go`` at tag v0.3.0,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v0.3.0/pkg/epp/scheduling/filter.go):
*affinity* endpoints have ``target_model`` active; *available* ones do not but have a free
adapter slot (``|active| < max_lora``). Both non-empty: return the affinity group with
probability ``affinityThreshold``, else the available group (the seeded plugin RNG draws).
Otherwise whichever group is non-empty, else nothing (the filter fails; in a
``decision-tree-filter`` the next node then gets the input back). A base-model request is
looked up like an adapter, as v0.3.0 did: no server lists a base model as an active
adapter, so it only ever finds *available* endpoints, or none when LoRA is off.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, Filter, LLMRequest, PluginParameters


class LoraSoftAffinityFilter(Filter):
    type_name = "lora-soft-affinity-filter"

    class Parameters(PluginParameters):
        affinity_threshold: float = Field(0.999, ge=0.0, le=1.0)

    params: Parameters

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        target = request.target_model
        affinity: list[Endpoint] = []
        available: list[Endpoint] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                continue
            if target in m.running_loras or target in m.waiting_loras:
                affinity.append(e)
            elif len(m.running_loras | m.waiting_loras) < m.max_loras:
                available.append(e)
        if affinity and available:
            return affinity if self.rng.random() < self.params.affinity_threshold else available
        return affinity or available
