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
``kvEvents`` configuration). Token ids come from the pool's tokenizer (the host's
``tokenizer`` service, per the pool's ``spec.tokenizer``): by default the built-in one
(:func:`sluicegate.tokenization.builtin.builtin_token_ids`, 4 UTF-8 bytes per token, chat
messages rendered with the simulator's template) — exact against the simulator, which
publishes the same ids; ``local``, the model's own ``tokenizer.json``
and chat template, rendered and encoded as vLLM does (with a prefix cache, so a new turn
encodes only what is new); ``server``, the servers' ``/tokenize``, awaited in this
producer's prefetch (it is then an I/O-bound producer); ``local`` prompts over 8 KiB are
tokenized in that prefetch too, in a worker thread. The prefetch runs per request only
when the pool's tokenizer wants it (else the host skips the pass), before the fetchers
that read the prefix match (a remote latency predictor), and sets the precise match for
them; lookups are counted only in the pass in ``submit``. A request the pool's tokenizer
cannot tokenize (the template rejects it, ``/tokenize`` times out) is matched
approximately on every candidate, and counted by the tokenizer.

Progressive encoding (``local``, unless ``encodeWholePrompt: true``): the prompt is
encoded only as far as the decision needs — up to the first block no synced candidate
still matching holds, and at least as far as the unknown candidates' converted
approximate matches reach (:mod:`sluicegate.scheduling.precise_frontier`,
:mod:`sluicegate.tokenization.progressive`); the rest is encoded after dispatch by the
tokenizer's worker. Every candidate's ``matchedBlocks`` (so the cached tokens the latency
features use) is exactly the whole encoding's; the prompt's block count (``totalBlocks``,
the scores' denominator) is then estimated from the encoded part's tokens per character,
and with speculation the blocks past the decision's become speculative entries when the
worker is done.

Per request: the ids are cut into blocks of the servers' block size — the ``block_size``
vLLM sends in every ``BlockStored`` (the first synced candidate's; else the scraped
``cache_config_info`` block size; else vLLM's default 16) — and keyed by
:func:`~sluicegate.datalayer.kvevents.block_keys` with the extra keys vLLM puts in a
block's identity: the LoRA name on every block, then the cache salt on the first. A
candidate whose event view is *synced* gets ``matchedBlocks`` = the leading blocks the
index says it holds. A candidate whose view is *unknown* (no stream configured, a lost
batch not yet replayed or turned over, another block size) gets the approximate
producer's match instead, converted to these blocks: ``⌊approxBlocks × approxBlockTokens
/ blockSize⌋``, at most the prompt's blocks. The approximate index learns from a
decision (its pre-request hook runs here) when a candidate is unknown, or with
``approximateLearnsWhenSynced`` / ``approximateWhenNoneHolds``: learning when all are
synced costs 0.4–0.5 ms of a 100k-token decision and keeps the fallback warm for a
stream that later loses events (the trade-off: docs/plugins.md).

Speculative entries (the reference router's ``speculativeIndexing``, off by default
there and here): with ``speculativeIndexing: true`` the pre-request hook inserts the
request's blocks for the chosen endpoint, when its view is synced, into a store of
:class:`~sluicegate.scheduling.speculative.SpeculativeEntries` valid for
``speculativeTtlSeconds`` (2.0 s); a synced candidate's ``matchedBlocks`` is then the
index's leading blocks extended by its unexpired speculative ones. A burst of requests
sharing a new prefix so sticks to one endpoint before that server's events arrive. Real
events take over as they come (the index is read first), unconfirmed guesses expire; at
most ``maxSpeculativeEntries`` (block, endpoint) pairs (100,000, about 20 MB) are kept,
the oldest dropped first.

Cold prefixes: with ``approximateWhenNoneHolds: true`` (default false, the reference's
behaviour), a request whose first block no synced endpoint holds gets the approximate
index's match on every candidate instead of zeros: a prefix evicted everywhere is then
recomputed where it was last sent (which keeps a tenant's later requests together)
rather than wherever load is lowest, which copies it across the pool under cache
pressure (docs/benchmarks/cache-pressure). The lookup counters count such requests as
misses.

Parameters: ``maxPrefixTokensToMatch`` (131072; tokens of the prompt considered, 0 =
whole prompt), the speculative ones above, ``approximateWhenNoneHolds``,
``approximateLearnsWhenSynced`` (false), ``encodeWholePrompt`` (false), and for the
fallback the approximate producer's ``blockSizeTokens`` (64), ``lruCapacityPerServer``
(31250) and ``autoTune`` (true), with the same meanings and defaults as there
(docs/plugins.md#approx-prefix-cache-producer).

Cost: measured in docs/benchmarks/scheduling.md (``sluicegate bench micro
tokenization``), the built-in tokenizer's in docs/plugins.md.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.kvevents.service import KV_EVENTS_SERVICE, KVEventsService
from sluicegate.datalayer.kvevents.subscriber import KVEventSubscribers, View
from sluicegate.framework import (
    PREFETCH_PASS,
    PREFIX_MATCH,
    PREFIX_PRODUCER_TYPE,
    AsyncDataProducer,
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
from sluicegate.scheduling.precise_frontier import Frontier, keying
from sluicegate.scheduling.precise_views import (
    VLLM_DEFAULT_BLOCK_SIZE,
    blocks_reach,
    reach,
    views,
)
from sluicegate.scheduling.speculative import SpeculativeEntries
from sluicegate.tokenization.base import TOKENIZER_SERVICE, PoolTokenizer, TokenizerService
from sluicegate.tokenization.builtin import builtin_token_ids

if TYPE_CHECKING:
    from sluicegate.tokenization.progressive import Progress

_APPROXIMATE: StateKey[PrefixMatch] = StateKey("precise-prefix/approximate")
_FETCHED: StateKey[array[int] | None] = StateKey("precise-prefix/token-ids")
"""The token ids a ``server`` tokenizer answered in the prefetch (None: it did not)."""
_FETCH_DONE: StateKey[bool] = StateKey("precise-prefix/fetched")
"""Set once the prefetch asked; before that (the host's pass ahead of the prefetch) a
missing answer is not a fallback yet."""
_PROGRESS: StateKey[Progress | None] = StateKey("precise-prefix/progress")
"""A progressive tokenizer's encoding of the prompt (None: it could not tokenize it)."""
_KEYS: StateKey[list[int]] = StateKey("precise-prefix/keys")
"""The request's block keys, when the pool has event streams (for speculative entries)."""


class PrecisePrefixCacheProducer(
    DataProducer, AsyncDataProducer, PreRequest, EndpointObserver, PrefixIndexer
):
    type_name = "precise-prefix-cache-producer"
    provides = (PREFIX_PRODUCER_TYPE,)

    class Parameters(ApproximatePrefixParameters):
        """The approximate match's parameters and the speculative entries' (see the
        module docstring)."""

        speculative_indexing: bool = False
        speculative_ttl_seconds: float = Field(default=2.0, gt=0, le=3600)
        max_speculative_entries: int = Field(default=100_000, ge=1, le=100_000_000)
        approximate_when_none_holds: bool = False
        approximate_learns_when_synced: bool = False
        encode_whole_prompt: bool = False

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
        tokenizers = context.services.get(TOKENIZER_SERVICE)
        if tokenizers is not None and not isinstance(tokenizers, TokenizerService):
            raise PluginConfigError(
                f"the {TOKENIZER_SERVICE!r} service ({type(tokenizers).__name__}) is not a "
                "TokenizerService"
            )
        self.tokenizers = tokenizers
        """The pools' tokenizers; None or a pool absent: the built-in tokenizer."""
        # the fallback: the approximate producer's own match
        self.approximate = ApproximatePrefix.of(p, context, name)
        self.speculative = (
            SpeculativeEntries(p.speculative_ttl_seconds, p.max_speculative_entries)
            if p.speculative_indexing
            else None
        )
        """Blocks just dispatched, before their events (None: speculation off)."""
        self.clock = context.clock

    def produce(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        # Ahead of the prefetch the match only feeds the fetchers: nothing is counted
        # then (the pass in submit counts), and ids a fetch will bring are not made here.
        counting = not state.get(PREFETCH_PASS)
        subs = self._subscribers(endpoints)
        if subs is None:  # no stream for this pool: the approximate match as it is
            approx = self.approximate.match(request, endpoints)
            state.put(_APPROXIMATE, approx)
            state.put(PREFIX_MATCH, approx)
            if self.service is not None and counting:
                self.service.lookups.fallbacks += len(endpoints)
            return
        tokenizer = self._tokenizer(endpoints[0].pool)
        progressive = (
            tokenizer is not None and tokenizer.progressive and not self.params.encode_whole_prompt
        )
        ids = None if progressive else self._token_ids(request, state, endpoints[0].pool)
        if ids is None and not progressive:
            self._approximate_only(request, state, endpoints, tokenizer, counting)
            return
        index = subs.index
        size, synced, unknown = views(subs, endpoints)
        approx = self._fallback(request, unknown)
        state.put(_APPROXIMATE, approx)
        limit = self.params.max_prefix_tokens_to_match
        frontier: Frontier | None = None
        progress: Progress | None = None
        if progressive:
            assert tokenizer is not None
            progress, frontier = self._progress(
                request, state, tokenizer, subs, size, synced, approx
            )
            if progress is None:
                self._approximate_only(request, state, endpoints, tokenizer, counting)
                return
            # a snapshot: the worker extends the progress's own list after dispatch
            keys = progress.keys if progress.whole else list(progress.keys)
            total = progress.estimated_blocks()
            if limit:
                keys = keys[: limit // size]
                total = min(total, limit // size)
            estimated = not progress.whole
        else:
            assert ids is not None
            keys = []
            keying(request, size).extend(keys, ids)
            total = len(keys)
            estimated = False
        held = frontier.matched(keys) if frontier is not None else None
        if held is None:
            held = index.longest_prefix(keys) if keys and synced else {}
        matched = {name: held[name] for name in synced if name in held}
        spec = self.speculative
        if spec is not None and keys:
            now = self.clock.now()
            for name in synced:
                depth = spec.extend(name, keys, matched.get(name, 0), now)
                if depth:
                    matched[name] = depth
        for e in unknown:
            blocks = approx.matched_blocks.get(e.name, 0)
            if blocks:
                matched[e.name] = min(total, blocks * approx.block_tokens // size)
        assert self.service is not None  # a pool's subscribers come from the service
        counters = self.service.lookups
        best = max((matched.get(n, 0) for n in synced), default=0)
        if counting:
            counters.requests += 1
            counters.hit_blocks += best
            counters.miss_blocks += total - best
            counters.fallbacks += len(unknown)
        if not best and keys and synced and self.params.approximate_when_none_holds:
            # no synced endpoint holds even the first block: keep the affinity the
            # approximate index remembers, so a cold prefix is recomputed where it last
            # was, not wherever load is lowest (which would copy it across the pool)
            names = set(synced)
            cold = self.approximate.match(request, [e for e in endpoints if e.name in names])
            need = reach(cold, size)
            if estimated and progress is not None and tokenizer is not None and need > len(keys):
                # as for the unknown candidates: keys as far as the converted matches reach
                # (or the prompt's end), so the cap below is the prompt's real block count
                enough = Frontier(index, (), None, need)
                tokenizer.decide(request, keying(request, size), enough, limit, progress)
                estimated = not progress.whole
                keys = progress.keys if progress.whole else list(progress.keys)
                total = progress.estimated_blocks()
                if limit:
                    keys, total = keys[: limit // size], min(total, limit // size)
            for name, blocks in cold.matched_blocks.items():
                if blocks:
                    matched[name] = min(total, blocks * cold.block_tokens // size)
        state.put(_KEYS, keys)
        state.put(
            PREFIX_MATCH,
            PrefixMatch(keys, size, matched, prompt_blocks=total if estimated else None),
        )

    def _approximate_only(
        self,
        request: LLMRequest,
        state: CycleState,
        endpoints: Sequence[Endpoint],
        tokenizer: PoolTokenizer | None,
        counting: bool,
    ) -> None:
        """The pool's tokenizer could not tokenize the request: the approximate match on
        every candidate (counted once the tokenizer was asked)."""
        approx = self.approximate.match(request, endpoints)
        state.put(_APPROXIMATE, approx)
        state.put(PREFIX_MATCH, approx)
        assert self.service is not None
        asked = tokenizer is None or not tokenizer.needs_io or state.get(_FETCH_DONE)
        if counting and asked:
            self.service.lookups.fallbacks += len(endpoints)

    def _fallback(self, request: LLMRequest, unknown: Sequence[Endpoint]) -> PrefixMatch:
        """The approximate match of the ``unknown`` candidates; with none, an empty match
        (nothing for the pre-request hook to learn) unless the approximate index is to
        learn from this decision all the same (see the module docstring)."""
        p = self.params
        if unknown or p.approximate_learns_when_synced or p.approximate_when_none_holds:
            return self.approximate.match(request, unknown)
        return PrefixMatch([], self.approximate.block_size_tokens, {})

    def _subscribers(self, endpoints: Sequence[Endpoint]) -> KVEventSubscribers | None:
        if self.service is None or not endpoints:
            return None
        return self.service.pools.get(endpoints[0].pool)

    @property
    def fetches(self) -> bool:
        return self.tokenizers is not None and self.tokenizers.fetching

    def fetches_for(self, request: LLMRequest, pool: str) -> bool:
        tokenizer = self._tokenizer(pool)
        return tokenizer is not None and tokenizer.wants_fetch(request)

    async def prefetch(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        tokenizer = self._tokenizer(endpoints[0].pool) if endpoints else None
        if tokenizer is None or not tokenizer.wants_fetch(request):
            return
        subs = self._subscribers(endpoints)
        if subs is None:
            return
        limit = self.params.max_prefix_tokens_to_match
        if tokenizer.progressive and not self.params.encode_whole_prompt:
            size, synced, unknown = views(subs, endpoints)
            approx = self._fallback(request, unknown)
            enough = self._frontier(subs, synced, approx, size)
            if self.params.approximate_when_none_holds and synced and approx.hashes:
                # the cold fallback's reach: its catch-up is then encoded in the thread
                cold = self.approximate.index.match(approx.hashes, synced)
                enough.cold_blocks = blocks_reach(cold, approx.block_tokens, size)
            state.put(
                _PROGRESS,
                await tokenizer.fetch_decision(request, keying(request, size), enough, limit),
            )
        else:
            state.put(_FETCHED, await tokenizer.fetch(request, endpoints, limit))
        state.put(_FETCH_DONE, True)
        # the match from the fetched ids, for fetchers after this one (a remote latency
        # predictor builds its rows from it); nothing is counted in this pass
        self.produce(request, state, endpoints)

    def _frontier(
        self, subs: KVEventSubscribers, synced: Sequence[str], approx: PrefixMatch, size: int
    ) -> Frontier:
        """The ``enough`` test of a progressive decision over these candidates."""
        return Frontier(subs.index, synced, self.speculative, reach(approx, size))

    def _progress(
        self,
        request: LLMRequest,
        state: CycleState,
        tokenizer: PoolTokenizer,
        subs: KVEventSubscribers,
        size: int,
        synced: Sequence[str],
        approx: PrefixMatch,
    ) -> tuple[Progress | None, Frontier | None]:
        """The prompt encoded as far as this decision needs (None: route approximately),
        continuing what an earlier pass (the prefetch) encoded, and the walk that
        decided how far."""
        limit = self.params.max_prefix_tokens_to_match
        done = state.get(_FETCH_DONE)
        if not done and state.get(PREFETCH_PASS) and tokenizer.wants_fetch(request):
            return None, None  # ahead of its fetch
        earlier = state.get(_PROGRESS) if done else None
        if done and earlier is None:
            return None, None  # the fetch could not tokenize it
        enough = self._frontier(subs, synced, approx, size)
        progress = tokenizer.decide(request, keying(request, size), enough, limit, earlier)
        state.put(_PROGRESS, progress)
        if state.get(PREFETCH_PASS):
            state.put(_FETCH_DONE, True)
        return progress, enough

    def _tokenizer(self, pool: str) -> PoolTokenizer | None:
        return None if self.tokenizers is None else self.tokenizers.pools.get(pool)

    def _token_ids(self, request: LLMRequest, state: CycleState, pool: str) -> array[int] | None:
        """The prompt's token ids from the pool's tokenizer (None: route approximately),
        at most ``maxPrefixTokensToMatch``. Without one, the built-in tokenizer's. Ids
        made ahead of the prefetch, or fetched, are kept for the pass in submit."""
        limit = self.params.max_prefix_tokens_to_match
        tokenizer = self._tokenizer(pool)
        if tokenizer is None:
            return builtin_token_ids(request, limit)
        if state.get(_FETCH_DONE):
            ids = state.get(_FETCHED)
        elif tokenizer.needs_io or (state.get(PREFETCH_PASS) and tokenizer.wants_fetch(request)):
            return None  # ahead of its fetch (or a host without one: no I/O here)
        else:
            ids = tokenizer.token_ids(request, limit)
            if state.get(PREFETCH_PASS):
                state.put(_FETCHED, ids)
                state.put(_FETCH_DONE, True)
        if ids is not None and 0 < limit < len(ids):
            return ids[:limit]
        return ids

    def pre_request(self, request: LLMRequest, state: CycleState, result: SchedulingResult) -> None:
        target = result.targets[0]
        approx = state.get(_APPROXIMATE)
        if approx is not None:
            self.approximate.remember(target, approx)
        spec = self.speculative
        keys = state.get(_KEYS) if spec is not None else None
        if spec is not None and keys:
            self._speculate(target.name, target.pool, keys)
        progress = state.get(_PROGRESS)
        tokenizer = self._tokenizer(target.pool)
        if progress is not None and tokenizer is not None and tokenizer.progressive:
            # the rest of the prompt, after dispatch: the prefix cache gets the whole
            # conversation, and speculation the blocks the decision did not need
            more = spec is not None and not progress.whole
            done = partial(self._speculate, target.name, target.pool) if more else None
            tokenizer.finish_later(progress, done)

    def _speculate(self, endpoint: str, pool: str, keys: list[int]) -> None:
        """Mark ``keys`` (at most ``maxPrefixTokensToMatch``'s blocks) speculatively held
        by ``endpoint`` when its view is synced."""
        spec = self.speculative
        subs = None if self.service is None else self.service.pools.get(pool)
        if spec is None or subs is None or subs.view(endpoint) is not View.SYNCED:
            return
        limit = self.params.max_prefix_tokens_to_match
        size = subs.index.block_size(endpoint) or VLLM_DEFAULT_BLOCK_SIZE
        spec.insert(endpoint, keys[: limit // size] if limit else keys, self.clock.now())

    def indexed_blocks(self) -> int:
        return len(self.approximate)

    def forget_endpoint(self, endpoint: Endpoint) -> None:
        self.approximate.forget(endpoint)
        if self.speculative is not None:
            self.speculative.forget(endpoint.name)
