"""The approximate prefix match both prefix producers use: the prompt's block hashes looked
up in what the gateway remembers sending where.

``approx-prefix-cache-producer`` is this and nothing else; ``precise-prefix-cache-producer``
falls back to it for endpoints whose KV-event stream it cannot trust. Plugins do not import
each other, so the logic lives here, once. See the producer's module docstring
(:mod:`sluicegate.scheduling.plugins.prefix_cache`) for the hashing and the parameters.

With shared state (the host offers a :class:`~sluicegate.datalayer.sharing.PrefixShare`
under ``SHARED_PREFIX_SERVICE``), each decision is also queued for the other gateway
replicas and their decisions are inserted here as they arrive, so N replicas match against
one index (``docs/replicas.md``). Lookups read only the local index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.sharing import SHARED_PREFIX_SERVICE, PrefixShare
from sluicegate.framework import LLMRequest, PluginContext, PluginParameters, PrefixMatch
from sluicegate.scheduling.prefix_index import PrefixIndex
from sluicegate.tokens import block_hashes, hash_seed

DEFAULT_LRU_BLOCKS_16 = 31_250
"""llm-d-router's default ``lruCapacityPerServer`` per endpoint, in 16-token blocks."""


class ApproximatePrefixParameters(PluginParameters):
    """The approximate match's parameters, the same in both prefix producers (meanings and
    defaults in :mod:`sluicegate.scheduling.plugins.prefix_cache`)."""

    block_size_tokens: int = Field(64, ge=1)
    max_prefix_tokens_to_match: int = Field(131_072, ge=0)
    lru_capacity_per_server: int = Field(DEFAULT_LRU_BLOCKS_16, ge=1)
    auto_tune: bool = True


class ApproximatePrefix:
    """Block hashing and the :class:`PrefixIndex` of one producer.

    ``block_size_tokens``: tokens per block; ``max_prefix_tokens``: tokens of the prompt
    considered (0 = all); ``lru_capacity_per_server``: blocks (of 16 tokens) remembered per
    endpoint whose capacity is unknown; ``auto_tune``: size each endpoint's memory from its
    scraped KV capacity."""

    __slots__ = (
        "_capacities",
        "_max_blocks",
        "_share",
        "_space",
        "auto_tune",
        "block_size_tokens",
        "index",
    )

    def __init__(
        self,
        block_size_tokens: int,
        max_prefix_tokens: int,
        lru_capacity_per_server: int,
        auto_tune: bool,
    ) -> None:
        self.block_size_tokens = block_size_tokens
        self.auto_tune = auto_tune
        self.index = PrefixIndex(max(1, lru_capacity_per_server * 16 // block_size_tokens))
        self._max_blocks = -(-max_prefix_tokens // block_size_tokens)
        self._share: PrefixShare | None = None
        self._space = ""
        self._capacities: dict[str, int] = {}
        """Each endpoint's capacity in blocks as this replica sized it (one entry per
        endpoint routed to; dropped by :meth:`forget`)."""

    @classmethod
    def of(
        cls,
        params: ApproximatePrefixParameters,
        context: PluginContext | None = None,
        name: str = "",
    ) -> ApproximatePrefix:
        """The match of producer ``name``; shared with the other gateway replicas when
        ``context`` offers a :class:`PrefixShare`."""
        matcher = cls(
            params.block_size_tokens,
            params.max_prefix_tokens_to_match,
            params.lru_capacity_per_server,
            params.auto_tune,
        )
        share = context.services.get(SHARED_PREFIX_SERVICE) if context is not None else None
        if share is not None:
            if not isinstance(share, PrefixShare):
                raise TypeError(
                    f"the {SHARED_PREFIX_SERVICE!r} service ({type(share).__name__}) is not "
                    "a PrefixShare"
                )
            matcher.share(share, f"{name}/{params.block_size_tokens}")
        return matcher

    def share(self, share: PrefixShare, space: str) -> None:
        """Publish this index's decisions to ``share`` and take the other replicas' for
        the same ``space`` (producer name and block size: the same on every replica)."""
        self._share = share
        self._space = space
        share.register(space, self._insert_remote)

    def _insert_remote(self, endpoint: str, hashes: Sequence[int], capacity: int | None) -> None:
        # The bound is this replica's own: a peer's capacity (from the wire, so anything up
        # to 2^31 - 1) may only lower it, never let the index grow past what we would keep.
        local = self._capacities.get(endpoint, self.index.default_capacity)
        bound = min(capacity, local) if capacity and capacity > 0 else local
        self.index.insert(endpoint, hashes, bound)

    def match(self, request: LLMRequest, endpoints: Iterable[Endpoint]) -> PrefixMatch:
        """The request's block hashes and how many of them each of ``endpoints`` holds."""
        size = self.block_size_tokens
        seed = hash_seed(request.target_model, request.cache_salt)
        hashes = block_hashes(
            request.prompt, size, seed, max_blocks=self._max_blocks, include_partial=True
        )
        names = [e.name for e in endpoints]
        matched = self.index.match(hashes, names) if names else {}
        return PrefixMatch(hashes, size, matched, self.index)

    def remember(self, target: Endpoint, match: PrefixMatch) -> None:
        """``target`` was chosen for the request of ``match``: it holds its blocks now."""
        if match.hashes:
            capacity = self.capacity_blocks(target)
            if capacity is not None:
                self._capacities[target.name] = capacity
            self.index.insert(target.name, match.hashes, capacity)
            if self._share is not None:
                self._share.publish(self._space, target.name, match.hashes, capacity)

    def capacity_blocks(self, endpoint: Endpoint) -> int | None:
        """Blocks to remember for ``endpoint``: its KV capacity when known and auto-tuned."""
        if not self.auto_tune:
            return None
        tokens = endpoint.kv_capacity_tokens
        return max(1, tokens // self.block_size_tokens) if tokens else None

    def forget(self, endpoint: Endpoint) -> None:
        self.index.remove_endpoint(endpoint.name)
        self._capacities.pop(endpoint.name, None)

    def __len__(self) -> int:
        return len(self.index)


__all__ = ["DEFAULT_LRU_BLOCKS_16", "ApproximatePrefix", "ApproximatePrefixParameters"]
