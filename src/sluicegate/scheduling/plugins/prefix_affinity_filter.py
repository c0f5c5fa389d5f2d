"""``prefix-cache-affinity-filter``: keep a request on the endpoints holding its prefix.

Type: filter. Inputs: the prefix-cache match of every candidate (from
``approx-prefix-cache-producer``), and an estimate of each candidate's TTFT.
Parameters (defaults of llm-d-router at ebab6879,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go):
``affinityThreshold`` (0.80), ``explorationProbability`` (0), ``maxTTFTPenaltyMs``
(18000), ``ttftSource`` (``prefillThroughput`` | ``latencyPredictor``),
``peakPrefillThroughput`` (15,928 tokens/s).

Algorithm: with one candidate, a threshold ≤ 0, or (with probability
``explorationProbability``) to explore, keep everything. Sticky endpoints are those whose
prefix score is ≥ ``affinityThreshold``; if there are none, keep everything. Otherwise,
when non-sticky endpoints exist and ``maxTTFTPenaltyMs`` > 0, estimate TTFT — the
predictor's (missing → ∞) or ``inFlightPrefillTokens / peakPrefillThroughput`` — and if the
best sticky endpoint is more than ``maxTTFTPenaltyMs`` slower than the best other one, keep
everything (affinity is not worth the wait); else keep only the sticky endpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    PREDICTIONS,
    PREFIX_MATCH,
    PREFIX_PRODUCER_TYPE,
    CycleState,
    Filter,
    LLMRequest,
    PluginParameters,
)


class PrefixCacheAffinityFilter(Filter):
    type_name = "prefix-cache-affinity-filter"
    requires = (PREFIX_PRODUCER_TYPE,)

    class Parameters(PluginParameters):
        affinity_threshold: float = Field(0.80, le=1.0)
        exploration_probability: float = Field(0.0, ge=0.0, le=1.0)
        max_ttft_penalty_ms: float = Field(18_000.0, alias="maxTTFTPenaltyMs", ge=0.0)
        ttft_source: Literal["prefillThroughput", "latencyPredictor"] = "prefillThroughput"
        peak_prefill_throughput: float = Field(15_928.0, gt=0.0)

    params: Parameters

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        p = self.params
        everything = list(endpoints)
        if len(endpoints) <= 1 or p.affinity_threshold <= 0:
            return everything
        if p.exploration_probability and self.rng.random() < p.exploration_probability:
            return everything
        match = state.get(PREFIX_MATCH)
        if match is None:
            return everything
        sticky = [e for e in endpoints if match.score(e.name) >= p.affinity_threshold]
        if not sticky:
            return everything
        others = [e for e in endpoints if match.score(e.name) < p.affinity_threshold]
        if others and p.max_ttft_penalty_ms > 0:
            ttft = self._ttft_estimates(state)
            best_sticky = min(ttft(e) for e in sticky)
            best_other = min(ttft(e) for e in others)
            if best_sticky - best_other > p.max_ttft_penalty_ms:
                return everything
        return sticky

    def _ttft_estimates(self, state: CycleState) -> Callable[[Endpoint], float]:
        if self.params.ttft_source == "latencyPredictor":
            predictions = state.get(PREDICTIONS) or {}

            def predicted(e: Endpoint) -> float:
                prediction = predictions.get(e.name)
                return prediction.ttft_ms if prediction is not None else math.inf

            return predicted
        rate = self.params.peak_prefill_throughput

        def from_queue(e: Endpoint) -> float:
            return e.inflight.prompt_tokens / rate * 1000.0

        return from_queue
