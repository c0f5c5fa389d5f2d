"""Precise prefix-cache affinity from the servers' own KV-cache events:
``precise-prefix-cache-producer`` (the reference's type name, llm-d-router).

Type: data producer and pre-request hook; it writes the same
:data:`~sluicegate.framework.PREFIX_MATCH` state as ``approx-prefix-cache-producer``, so
``prefix-cache-scorer``, ``prefix-cache-affinity-filter`` and the predicted-latency
producer read it unchanged (it *provides* the approximate type: configuring it does not
add the approximate producer).

Inputs: the request's prompt bytes, its target model when that is a LoRA adapter, its
``cache_salt``, and the pool's :class:`~sluicegate.datalayer.kvevents.PreciseIndex`
(the host's ``kv-events`` service, filled from the servers' events per the pool's
``kvEvents`` configuration). Token ids are, for now, the built-in tokenizer's
(:func:`sluicegate.tokens.token_ids`, 4 UTF-8 bytes per token) — exact against the
simulator, which publishes the same ids; matching a real vLLM server needs the model's own
tokenizer, a later slice of issue 17 (until then real servers' blocks never match and
every request scores 0 there, as for a cold cache).

Per request: the ids are cut into blocks of the servers' block size — the ``block_size``
vLLM sends in every ``BlockStored`` (the first synced candidate's; else the scraped
``cache_config_info`` block size; else vLLM's default 16) — and keyed by
:func:`~sluicegate.datalayer.kvevents.block_keys` with the extra keys vLLM puts in a
block's identity: the LoRA name on every block, then the cache salt on the first. A
candidate whose event view is *synced* gets ``matchedBlocks`` = the leading blocks the
index says it holds. A candidate whose view is *unknown* (no stream configured, a lost
batch not yet replayed or turned over, another block size) gets the approximate
producer's match instead, converted to these blocks: ``⌊approxBlocks × approxBlockTokens
/ blockSize⌋``, at most the prompt's blocks. The approximate index keeps learning from
every decision (its pre-request hook runs here), so the fallback is warm when needed.

Parameters: ``maxPrefixTokensToMatch`` (131072; tokens of the prompt considered, 0 =
whole prompt), and for the fallback the approximate producer's ``blockSizeTokens`` (64),
``lruCapacityPerServer`` (31250) and ``autoTune`` (true), with the same meanings and
defaults as there (docs/plugins.md#approx-prefix-cache-producer).

Cost on top of the approximate producer: one token-id conversion and one xxh3 per block
of the prompt, one dict lookup per matched block (the index's ``longest_prefix``).
Measured (CPython 3.11, shared 2-core machine, 8 synced endpoints holding 1/8 … 8/8 of
the prompt in 16-token blocks): a 16 KB prompt (256 blocks) about 92 µs per request
(approximate alone: 13 µs), a 1 KB prompt about 26 µs.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.kvevents.index import block_keys
from sluicegate.datalayer.kvevents.service import KV_EVENTS_SERVICE, KVEventsService
from sluicegate.datalayer.kvevents.subscriber import KVEventSubscribers, View
from sluicegate.datalayer.kvevents.wire import extra_key_bytes
from sluicegate.framework import (
    PREFIX_MATCH,
    PREFIX_PRODUCER_TYPE,
    CycleState,
    DataProducer,
    EndpointObserver,
    LLMRequest,
    PluginConfigError,
    PluginContext,
    PluginParameters,
    PrefixIndexer,
    PrefixMatch,
    PreRequest,
    SchedulingResult,
    StateKey,
)
from sluicegate.scheduling.approximate import ApproximatePrefix, ApproximatePrefixParameters
from sluicegate.tokens import token_id_array

"""The approximate producer's default ``lruCapacityPerServer`` (16-token blocks)."""

VLLM_DEFAULT_BLOCK_SIZE = 16
"""vLLM's default ``--block-size`` (tokens), used before any event or scrape told it."""

_APPROXIMATE: StateKey[PrefixMatch] = StateKey("precise-prefix/approximate")


class PrecisePrefixCacheProducer(DataProducer, PreRequest, EndpointObserver, PrefixIndexer):
    type_name = "precise-prefix-cache-producer"
    provides = (PREFIX_PRODUCER_TYPE,)

    class Parameters(ApproximatePrefixParameters):
        """The approximate match's parameters (see the module docstring)."""

    params: Parameters

    def __init__(self, name: str, context: PluginContext, params: PluginParameters | None = None):
        super().__init__(name, context, params)
        p = self.params
        service = context.services.get(KV_EVENTS_SERVICE)
        if service is not None and not isinstance(service, KVEventsService):
            raise PluginConfigError(
                f"the {KV_EVENTS_SERVICE!r} service ({type(service).__name__}) is not a "
                "KVEventsService"
            )
        self.service = service
        """None when the host has no event streams (every view unknown: approximate)."""
        # the fallback: the approximate producer's own match
        self.approximate = ApproximatePrefix.of(p, context, name)

    def produce(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        subs = self._subscribers(endpoints)
        if subs is None:  # no stream for this pool: the approximate match as it is
            approx = self.approximate.match(request, endpoints)
            state.put(_APPROXIMATE, approx)
            state.put(PREFIX_MATCH, approx)
            if self.service is not None:
                self.service.lookups.fallbacks += len(endpoints)
            return
        index = subs.index
        size = self._block_size(subs, endpoints)
        synced: list[str] = []
        unknown: list[Endpoint] = []
        for e in endpoints:
            learned = index.block_size(e.name)
            if subs.view(e.name) is View.SYNCED and learned in (0, size):
                synced.append(e.name)
            else:
                unknown.append(e)
        approx = self.approximate.match(request, unknown)
        state.put(_APPROXIMATE, approx)
        keys = self._keys(request, size)
        held = index.longest_prefix(keys) if keys and synced else {}
        matched = {name: held[name] for name in synced if name in held}
        total = len(keys)
        for e in unknown:
            blocks = approx.matched_blocks.get(e.name, 0)
            if blocks:
                matched[e.name] = min(total, blocks * approx.block_tokens // size)
        assert self.service is not None  # a pool's subscribers come from the service
        counters = self.service.lookups
        best = max((matched.get(n, 0) for n in synced), default=0)
        counters.requests += 1
        counters.hit_blocks += best
        counters.miss_blocks += total - best
        counters.fallbacks += len(unknown)
        state.put(PREFIX_MATCH, PrefixMatch(keys, size, matched))

    def _subscribers(self, endpoints: Sequence[Endpoint]) -> KVEventSubscribers | None:
        if self.service is None or not endpoints:
            return None
        return self.service.pools.get(endpoints[0].pool)

    def _block_size(self, subs: KVEventSubscribers, endpoints: Sequence[Endpoint]) -> int:
        """The servers' block size: from their events, else their scraped cache config."""
        for e in endpoints:
            size = subs.index.block_size(e.name)
            if size and subs.view(e.name) is View.SYNCED:
                return size
        for e in endpoints:
            m = e.metrics
            if m is not None and m.block_size:
                return m.block_size
        return VLLM_DEFAULT_BLOCK_SIZE

    def _keys(self, request: LLMRequest, size: int) -> list[int]:
        """The request's block keys, built as vLLM names blocks (extra keys: the LoRA name
        on every block, the cache salt after it on the first)."""
        ids = token_id_array(request.prompt, self.params.max_prefix_tokens_to_match)
        n = len(ids) // size
        if not n:
            return []
        lora = (request.target_model,) if request.is_adapter else ()
        extras: list[bytes | None] | None = None
        if lora or request.cache_salt:
            rest = extra_key_bytes(lora)
            extras = [rest] * n
            extras[0] = extra_key_bytes((*lora, request.cache_salt) if request.cache_salt else lora)
        try:
            return block_keys(ids, size, extras)
        except OverflowError:  # cannot happen for built-in ids (4 bytes each)
            return []

    def pre_request(self, request: LLMRequest, state: CycleState, result: SchedulingResult) -> None:
        approx = state.get(_APPROXIMATE)
        if approx is not None:
            self.approximate.remember(result.targets[0], approx)

    def indexed_blocks(self) -> int:
        return len(self.approximate)

    def forget_endpoint(self, endpoint: Endpoint) -> None:
        self.approximate.forget(endpoint)
