"""``token-load-scorer``: prefer endpoints with fewer tokens in flight from this gateway.

Type: scorer (distribution). Inputs: each endpoint's in-flight tokens (built-in tokens) —
uncached prompt tokens still to prefill plus the expected output tokens of its running
requests, as the gateway accounted them at dispatch
(``inflight.prompt_tokens + inflight.decode_tokens``), plus the other replicas' with shared
state (``Endpoint.dispatched_tokens`` is the sum).
Parameters: ``queueThresholdTokens`` T (4,194,304 tokens = 128 requests × 32K) — in-flight
tokens at which an endpoint scores 0.

Formula (llm-d-router's): ``score = 1 − min(1, tokens / T)``.
Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, PluginParameters, Scorer


class TokenLoadScorer(Scorer):
    type_name = "token-load-scorer"
    category = "distribution"

    class Parameters(PluginParameters):
        queue_threshold_tokens: int = Field(4_194_304, ge=1)

    params: Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        t = self.params.queue_threshold_tokens
        out: list[float] = []
        for e in endpoints:
            tokens = e.dispatched_tokens
            out.append(1.0 if tokens <= 0 else 0.0 if tokens >= t else 1.0 - tokens / t)
        return out
