"""``lora-affinity-scorer``: prefer endpoints that already have the request's LoRA adapter.

Type: scorer (affinity). Inputs: the request's ``target_model`` and ``is_adapter``; each
endpoint's last scrape of ``vllm:lora_requests_info`` — running adapters, waiting adapters
and ``max_lora`` (adapters per batch; 0 when not reported) — and the adapters it lists in
``/v1/models``. Parameters: none.

Formula, first match wins (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/lora_affinity.go;
adapter counts are numbers of distinct adapters):

- the adapter is running, **or listed as loaded in** ``/v1/models`` → **1.0**;
- ``|running adapters| + |waiting adapters| < max_lora`` (a free adapter slot) → **0.8**;
- the adapter is waiting → **0.6**;
- otherwise → **0**.

Deviations from llm-d-router, both deliberate: a loaded but idle adapter scores like a
running one (llm-d-inference-scheduler #2605: the metric only lists adapters with
requests, so an idle loaded adapter looked absent and its load cost was paid again
elsewhere); a request for a base model (``is_adapter`` false) scores 1.0 everywhere so the
scorer is neutral for it. An endpoint without metrics scores 0 for adapter requests.
Stale metrics are used as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Scorer


class LoraAffinityScorer(Scorer):
    type_name = "lora-affinity-scorer"
    category = "affinity"

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        if not request.is_adapter:
            return [1.0] * len(endpoints)
        adapter = request.target_model
        out: list[float] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                out.append(0.0)
            elif adapter in m.running_loras or adapter in e.models.adapters:
                out.append(1.0)
            elif len(m.running_loras) + len(m.waiting_loras) < m.max_loras:
                out.append(0.8)
            elif adapter in m.waiting_loras:
                out.append(0.6)
            else:
                out.append(0.0)
        return out
