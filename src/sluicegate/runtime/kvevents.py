"""The runtime's side of precise prefix-cache routing: subscribing to the servers' KV-cache
events as the pools' ``kvEvents`` say, and what ``/metrics`` and ``/health`` tell of them.

:class:`KVEventsHost` keeps one
:class:`~sluicegate.datalayer.kvevents.KVEventSubscribers` (and so one
:class:`~sluicegate.datalayer.kvevents.PreciseIndex`) per pool whose ``kvEvents`` is on,
in the :class:`~sluicegate.datalayer.kvevents.KVEventsService` plugins read. After every
change of the endpoint set (start, reload, discovery) :meth:`~KVEventsHost.request_sync`
recomputes each endpoint's publisher address and re-subscribes in a background task (one
at a time, the latest wanted set wins). A pool without ``kvEvents`` costs nothing: no
socket, no task, no per-request work.

Capacity: an endpoint's index entries are bounded by ``capacityBlocks`` when set, else by
its scraped ``num_gpu_blocks`` (vLLM's ``vllm:cache_config_info``) plus
``capacityMarginPercent``, applied when a scrape first reports it or it changes, else by
:data:`DEFAULT_CAPACITY_BLOCKS`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.api.loader import Config
from sluicegate.api.resources import KVEventsSettings
from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.kvevents.index import PreciseIndex
from sluicegate.datalayer.kvevents.service import KVEventsService
from sluicegate.datalayer.kvevents.subscriber import KVEventSource, KVEventSubscribers, View

log = logging.getLogger(__name__)

DEFAULT_CAPACITY_BLOCKS = 31_250
"""Index entries per endpoint when neither ``capacityBlocks`` nor a scrape tells: an 8B
model on an 80 GB H100 in 16-token blocks (the approximate producer's assumption)."""

Wanted = dict[str, dict[str, tuple[KVEventSource, KVEventsSettings]]]


def wanted_sources(config: Config, datastore: Datastore) -> Wanted:
    """Per pool, per endpoint name, its event source and settings (pools and endpoints
    with ``kvEvents`` off are absent)."""
    out: Wanted = {}
    for pool_name, pool in config.pools.items():
        spec = pool.spec
        overrides = {(s.name or _bare(s.address)): s.kv_events for s in spec.endpoints}
        if spec.kv_events is None and all(o is None for o in overrides.values()):
            continue
        base = spec.kv_events or KVEventsSettings()
        live = datastore.pools.get(pool_name)
        sources: dict[str, tuple[KVEventSource, KVEventsSettings]] = {}
        for e in live.endpoints if live is not None else ():
            override = overrides.get(e.name)
            if spec.kv_events is None and override is None:
                continue
            settings = base.merged(override)
            if not settings.enabled:
                continue
            pub, replay = settings.addresses(e.host, e.port, e.name)
            source = KVEventSource(pub, replay, settings.topic, settings.capacity_blocks)
            sources[e.name] = (source, settings)
        if sources:
            out[pool_name] = sources
    return out


def _bare(address: str) -> str:
    return address.removeprefix("http://").removeprefix("https://")


class KVEventsHost:
    """Subscribers per pool, kept in step with the endpoint set."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.service = KVEventsService()
        self._wanted: Wanted = {}
        self._started = False
        self._task: asyncio.Task[None] | None = None
        self._dirty = False
        self._applied_blocks: dict[tuple[str, str], int] = {}
        """Scraped ``num_gpu_blocks`` last applied as capacity, per (pool, endpoint)."""

    @property
    def active(self) -> bool:
        """Whether any endpoint is to be subscribed to."""
        return bool(self._wanted)

    def request_sync(self, config: Config, datastore: Datastore) -> None:
        """The endpoint set or configuration changed: subscribe to what it now names."""
        self._wanted = wanted_sources(config, datastore)
        if self._started:
            self._kick()

    def start(self) -> None:
        """Start subscribing (inside the running event loop)."""
        self._started = True
        self._kick()

    async def stop(self) -> None:
        """Close every subscriber; the indexes empty."""
        self._started = False
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for subs in self.service.pools.values():
            await subs.close()
        self.service.pools.clear()

    def _kick(self) -> None:
        if not self._wanted and not self.service.pools:
            return  # nothing configured, nothing to close: no task at all
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sync(), name="kvevents-sync")

    async def _sync(self) -> None:
        while self._dirty and self._started:
            self._dirty = False
            try:
                await self._apply(self._wanted)
            except Exception:  # a bad address must not stop later syncs
                log.exception("kv events: subscribing failed")

    async def _apply(self, wanted: Wanted) -> None:
        pools = self.service.pools
        for name in [n for n in pools if n not in wanted]:
            await pools.pop(name).close()
        for name, sources in wanted.items():
            subs = pools.get(name)
            if subs is None:
                subs = pools[name] = KVEventSubscribers(
                    PreciseIndex(DEFAULT_CAPACITY_BLOCKS), clock=self.clock
                )
            await subs.sync({key: source for key, (source, _) in sources.items()})
        self._applied_blocks = {
            k: v for k, v in self._applied_blocks.items() if k[1] in wanted.get(k[0], {})
        }

    def on_scrape(self, endpoint: Endpoint) -> None:
        """A scrape may report the server's ``num_gpu_blocks``: bound its entries by it."""
        sources = self._wanted.get(endpoint.pool)
        if sources is None:
            return
        wanted = sources.get(endpoint.name)
        m = endpoint.metrics
        if wanted is None or m is None or not m.num_gpu_blocks:
            return
        source, settings = wanted
        key = (endpoint.pool, endpoint.name)
        if source.capacity_blocks is not None or self._applied_blocks.get(key) == m.num_gpu_blocks:
            return
        subs = self.service.pools.get(endpoint.pool)
        if subs is None or endpoint.name not in subs.streams:
            return  # not subscribed yet: the next scrape applies it
        margin = math.ceil(m.num_gpu_blocks * settings.capacity_margin_percent / 100.0)
        subs.index.set_capacity(endpoint.name, m.num_gpu_blocks + margin)
        self._applied_blocks[key] = m.num_gpu_blocks

    def unknown_views(self) -> list[dict[str, str]]:
        """Subscribed endpoints whose event view is unknown, as ``{"pool", "endpoint"}``."""
        out: list[dict[str, str]] = []
        for pool, sources in sorted(self._wanted.items()):
            subs = self.service.pools.get(pool)
            for name in sorted(sources):
                if subs is None or subs.view(name) is View.UNKNOWN:
                    out.append({"pool": pool, "endpoint": name})
        return out


# llm-d's KV-cache indexer names (kvcache_index_*), from
# https://github.com/llm-d/llm-d-kv-cache-manager/blob/286e6326/pkg/kvcache/metrics/collector.go
_STREAM_COUNTERS = (
    ("received", "KV-event messages received"),
    ("decoded", "KV-event batches decoded and applied (replayed ones included)"),
    ("dropped", "Malformed KV-event messages dropped"),
    ("gaps", "Sequence gaps in an endpoint's KV-event stream"),
    ("replays", "Replays that filled a KV-event gap"),
    ("replay_failures", "Replays that did not fill a KV-event gap (view lost)"),
    ("restarts", "KV-event publisher restarts (sequence went back)"),
    ("unknown_events", "KV events of a kind this decoder does not know"),
)


class KVEventsCollector(Collector):
    """KV-event and precise-index metrics, read from the host when scraped."""

    def __init__(self, host: KVEventsHost) -> None:
        self._host = host

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        host = self._host
        if not host.active and not host.service.pools:
            return
        labels = ["pool", "endpoint"]
        streams = {
            name: CounterMetricFamily(f"sluicegate_kv_events_{name}", text, labels=labels)
            for name, text in _STREAM_COUNTERS
        }
        blocks = GaugeMetricFamily(
            "sluicegate_kv_events_index_blocks",
            "Blocks the index holds per endpoint.",
            labels=labels,
        )
        synced = GaugeMetricFamily(
            "sluicegate_kv_events_view_synced",
            "1 when the index's view of the endpoint's cache is complete, 0 when unknown.",
            labels=labels,
        )
        admissions = CounterMetricFamily(
            "kvcache_index_admissions", "KV blocks indexed from events.", labels=["pool"]
        )
        evictions = CounterMetricFamily(
            "kvcache_index_evictions",
            "KV blocks removed from the index (removal events and capacity).",
            labels=["pool"],
        )
        skipped = CounterMetricFamily(
            "sluicegate_kv_events_index_skipped_blocks",
            "Stored blocks not indexed: orphan (parent unknown), ignored (other medium or "
            "group), invalid.",
            labels=["pool", "reason"],
        )
        for pool, subs in sorted(host.service.pools.items()):
            for name, stream in sorted(subs.streams.items()):
                values = [pool, name]
                c = stream.counters
                for key, family in streams.items():
                    family.add_metric(values, getattr(c, key))
                blocks.add_metric(values, subs.index.size(name))
                synced.add_metric(values, 1.0 if stream.view is View.SYNCED else 0.0)
            ic = subs.index.counters
            admissions.add_metric([pool], ic.stored)
            evictions.add_metric([pool], ic.removed + ic.evictions)
            skipped.add_metric([pool, "orphan"], ic.orphans)
            skipped.add_metric([pool, "ignored"], ic.ignored)
            skipped.add_metric([pool, "invalid"], ic.invalid)
        yield from streams.values()
        yield from (blocks, synced, admissions, evictions, skipped)
        lookups = host.service.lookups
        yield CounterMetricFamily(
            "kvcache_index_lookup_requests",
            "Requests looked up in the precise index.",
            value=lookups.requests,
        )
        keys = CounterMetricFamily(
            "kvcache_index_lookup_key",
            "Prompt blocks looked up, by result (hit: held by the best-matching endpoint).",
            labels=["result"],
        )
        keys.add_metric(["hit"], lookups.hit_blocks)
        keys.add_metric(["miss"], lookups.miss_blocks)
        yield keys
        yield CounterMetricFamily(
            "sluicegate_kv_events_fallbacks",
            "Candidates whose prefix match came from the approximate index (view unknown).",
            value=lookups.fallbacks,
        )
