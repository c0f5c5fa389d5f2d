"""Approximate prefix-cache affinity: ``approx-prefix-cache-producer`` and ``prefix-cache-scorer``.

``approx-prefix-cache-producer`` — type: data producer and pre-request hook.
Inputs: the request's prompt (completions: the prompt text; chat: the JSON-serialised
``messages``), its target model and ``cache_salt``. It cuts the prompt's UTF-8 bytes into
blocks of ``blockSizeTokens`` built-in tokens (4 bytes each), hashes them as a chain
(xxhash64, seeded by target model and cache salt, so a hash names the whole prefix), and
looks each candidate up in the :class:`~sluicegate.scheduling.prefix_index.PrefixIndex`.
After scheduling it records the prompt's blocks for the chosen endpoint.

Parameters (defaults follow llm-d-router's ``approx-prefix-cache-producer``,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/README.md):

- ``blockSizeTokens`` (64): tokens per block. Smaller blocks match more finely but cost
  more hashing and memory; 64 is the floor (``minBlockSizeTokens`` in that directory's
  ``plugin.go``) llm-d-router adopted after small blocks exhausted memory.
- ``maxPrefixTokensToMatch`` (131072): tokens of the prompt considered; 0 = whole prompt.
- ``lruCapacityPerServer`` (31250): blocks remembered per endpoint when its KV capacity is
  unknown (8B model on an 80 GB H100 with 16-token blocks, llm-d-router's assumption),
  rescaled to this block size.
- ``autoTune`` (true): size each endpoint's memory from its scraped ``cache_config_info``
  (``num_gpu_blocks × block_size`` tokens).

``prefix-cache-scorer`` — type: scorer (affinity). Reads the producer's match.
Parameters: ``matchLengthWeight`` w (0), ``matchLengthScaleTokens`` (8192).
Formula: ``w · min(1, matchTokens / scale)² + (1 − w) · matchBlocks / totalBlocks``; with the
default w = 0 this is the share of the prompt's blocks the endpoint holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    PREFIX_MATCH,
    PREFIX_PRODUCER_TYPE,
    CycleState,
    DataProducer,
    EndpointObserver,
    LLMRequest,
    PluginContext,
    PluginParameters,
    PrefixIndexer,
    PreRequest,
    SchedulingResult,
    Scorer,
)
from sluicegate.scheduling.approximate import ApproximatePrefix, ApproximatePrefixParameters
from sluicegate.scheduling.prefix_index import PrefixIndex


class ApproxPrefixCacheProducer(DataProducer, PreRequest, EndpointObserver, PrefixIndexer):
    type_name = PREFIX_PRODUCER_TYPE

    class Parameters(ApproximatePrefixParameters):
        """The approximate match's parameters (see the module docstring)."""

    params: Parameters

    def __init__(self, name: str, context: PluginContext, params: PluginParameters | None = None):
        super().__init__(name, context, params)
        p = self.params
        self.matcher = ApproximatePrefix.of(p, context, name)

    @property
    def index(self) -> PrefixIndex:
        return self.matcher.index

    def capacity_blocks(self, endpoint: Endpoint) -> int | None:
        """Blocks to remember for ``endpoint``: its KV capacity when known and auto-tuned."""
        return self.matcher.capacity_blocks(endpoint)

    def produce(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        state.put(PREFIX_MATCH, self.matcher.match(request, endpoints))

    def pre_request(self, request: LLMRequest, state: CycleState, result: SchedulingResult) -> None:
        match = state.get(PREFIX_MATCH)
        if match is not None:
            self.matcher.remember(result.targets[0], match)

    def indexed_blocks(self) -> int:
        return len(self.matcher)

    def forget_endpoint(self, endpoint: Endpoint) -> None:
        self.matcher.forget(endpoint)


class PrefixCacheScorer(Scorer):
    type_name = "prefix-cache-scorer"
    category = "affinity"
    requires = (PREFIX_PRODUCER_TYPE,)

    class Parameters(PluginParameters):
        match_length_weight: float = Field(0.0, ge=0.0, le=1.0)
        match_length_scale_tokens: int = Field(8192, ge=1)
        prefix_match_info_producer_name: str = ""
        """Accepted for compatibility with reference configurations; sluicegate has one
        approximate producer, which is always the one read."""

    params: Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        match = state.get(PREFIX_MATCH)
        if match is None or not match.hashes:
            return [0.0] * len(endpoints)
        w = self.params.match_length_weight
        scale = self.params.match_length_scale_tokens
        total = match.total_blocks
        out: list[float] = []
        for e in endpoints:
            blocks = match.matched_blocks.get(e.name, 0)
            share = blocks / total
            if w:
                length = min(1.0, blocks * match.block_tokens / scale)
                out.append(w * length * length + (1.0 - w) * share)
            else:
                out.append(share)
        return out
