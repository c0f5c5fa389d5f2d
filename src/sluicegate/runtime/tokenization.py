"""The runtime's side of request-path tokenization: the pools' tokenizers, kept in step
with the configuration, and what ``/metrics`` tells of them.

:class:`TokenizersHost` builds them at start and on every reload (a pool whose
``spec.tokenizer`` did not change keeps its tokenizer, and so its cache) in the
:class:`~sluicegate.tokenization.TokenizerService` plugins read. A pool with the default
``builtin`` source has no entry and costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.api.loader import Config
from sluicegate.tokenization.base import FALLBACK_REASONS, PoolTokenizer, TokenizerService

log = logging.getLogger(__name__)


def _build(config: Config, previous: dict[str, PoolTokenizer]) -> dict[str, PoolTokenizer]:
    # Only a configured tokenizer loads the tokenizers/jinja2 libraries.
    if all(p.spec.tokenizer.source == "builtin" for p in config.pools.values()):
        return {}
    from sluicegate.tokenization.build import build_tokenizers

    return build_tokenizers(config, previous)


class TokenizersHost:
    """The pools' tokenizers (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        """Build every pool's tokenizer; raises ConfigError when one cannot be loaded."""
        self.service = TokenizerService(_build(config, {}))
        self._closing: set[asyncio.Task[None]] = set()
        """Close tasks of tokenizers a reload dropped, until they finish."""

    def prepare(self, config: Config) -> dict[str, PoolTokenizer]:
        """The tokenizers ``config`` wants (unchanged ones reused), without applying them;
        raises ConfigError."""
        return _build(config, self.service.pools)

    def apply(self, pools: dict[str, PoolTokenizer]) -> None:
        """Switch to ``pools`` (from :meth:`prepare`); tokenizers dropped are closed."""
        kept = {id(t) for t in pools.values()}
        dropped = [t for t in self.service.pools.values() if id(t) not in kept]
        self.service.pools = pools
        for tokenizer in dropped:
            self._close_later(tokenizer)

    def _close_later(self, tokenizer: PoolTokenizer) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not started: nothing was opened
            return
        task = loop.create_task(tokenizer.close(), name="tokenizer-close")
        self._closing.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.warning("closing a replaced tokenizer failed: %s", exc)

    async def stop(self) -> None:
        for tokenizer in self.service.pools.values():
            try:
                await tokenizer.close()
            except Exception:  # shutting down: log, go on
                log.exception("closing a tokenizer failed")


class TokenizerCollector(Collector):
    """Tokenizer and prefix-cache metrics, read from the service when scraped."""

    def __init__(self, service: TokenizerService) -> None:
        self._service = service

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        pools = self._service.pools
        if not pools:
            return
        requests = CounterMetricFamily(
            "sluicegate_tokenizer_requests",
            "Requests the pool's tokenizer was asked for, by result (tokenized, or the "
            "reason it was routed approximately).",
            labels=["pool", "source", "result"],
        )
        seconds = CounterMetricFamily(
            "sluicegate_tokenizer_seconds",
            "Seconds spent producing token ids (rendering, encoding, /tokenize calls).",
            labels=["pool", "source"],
        )
        lookups = CounterMetricFamily(
            "sluicegate_tokenizer_cache_lookups",
            "Prefix-cache lookups of the local tokenizer, by result (hit: a prompt seen "
            "whole; prefix: continued from one seen; miss: encoded whole).",
            labels=["pool", "result"],
        )
        saved = CounterMetricFamily(
            "sluicegate_tokenizer_cache_tokens",
            "Tokens taken from the prefix cache (saved) and tokens encoded (encoded).",
            labels=["pool", "kind"],
        )
        mismatches = CounterMetricFamily(
            "sluicegate_tokenizer_cache_mismatches",
            "Continuations whose re-encoded overlap differed (encoded whole instead).",
            labels=["pool"],
        )
        evictions = CounterMetricFamily(
            "sluicegate_tokenizer_cache_evictions",
            "Prefix-cache entries evicted for their bounds.",
            labels=["pool"],
        )
        size = GaugeMetricFamily(
            "sluicegate_tokenizer_cache_bytes",
            "Bytes the prefix cache's entries take (estimated).",
            labels=["pool"],
        )
        entries = GaugeMetricFamily(
            "sluicegate_tokenizer_cache_entries",
            "Prompts the prefix cache holds.",
            labels=["pool"],
        )
        deferred = CounterMetricFamily(
            "sluicegate_tokenizer_deferred_prompts",
            "Prompts whose rest was to be encoded after dispatch, by result (finished; "
            "dropped: the worker's queue was full; failed).",
            labels=["pool", "result"],
        )
        deferred_seconds = CounterMetricFamily(
            "sluicegate_tokenizer_deferred_seconds",
            "CPU seconds the worker spent encoding prompts after dispatch.",
            labels=["pool"],
        )
        for pool, tokenizer in sorted(pools.items()):
            c = tokenizer.counters
            requests.add_metric([pool, tokenizer.source, "tokenized"], c.tokenized)
            for reason in FALLBACK_REASONS:
                requests.add_metric([pool, tokenizer.source, reason], c.fallbacks[reason])
            seconds.add_metric([pool, tokenizer.source], c.seconds)
            d = tokenizer.deferred_counters
            if d is not None:
                deferred.add_metric([pool, "finished"], d.finished)
                deferred.add_metric([pool, "dropped"], d.dropped)
                deferred.add_metric([pool, "failed"], d.failed)
                deferred_seconds.add_metric([pool], d.seconds)
            cache = tokenizer.prefix_cache
            if cache is None:
                continue
            cc = cache.counters
            lookups.add_metric([pool, "hit"], cc.hits)
            lookups.add_metric([pool, "prefix"], cc.prefix_hits)
            lookups.add_metric([pool, "miss"], cc.misses)
            saved.add_metric([pool, "saved"], cc.tokens_saved)
            saved.add_metric([pool, "encoded"], cc.tokens_encoded)
            mismatches.add_metric([pool], cc.mismatches)
            evictions.add_metric([pool], cc.evictions)
            size.add_metric([pool], cache.nbytes)
            entries.add_metric([pool], len(cache))
        yield from (requests, seconds, lookups, saved, mismatches, evictions, size, entries)
        yield from (deferred, deferred_seconds)


__all__ = ["TokenizerCollector", "TokenizersHost"]
