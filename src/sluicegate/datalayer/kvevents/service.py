"""What the precise prefix-cache producer reads: each pool's index and event views.

The host (:mod:`sluicegate.runtime.kvevents`) keeps one
:class:`~sluicegate.datalayer.kvevents.subscriber.KVEventSubscribers` — with its own
:class:`~sluicegate.datalayer.kvevents.index.PreciseIndex` — per pool whose ``kvEvents``
is on, and offers them to plugins under :data:`KV_EVENTS_SERVICE`. A pool absent from
:attr:`KVEventsService.pools` has no event stream: its endpoints' views are unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from sluicegate.datalayer.kvevents.subscriber import KVEventSubscribers

KV_EVENTS_SERVICE: Final = "kv-events"
"""The name under which the host provides a :class:`KVEventsService`
(``PluginContext.services``)."""


@dataclass
class LookupCounters:
    """Totals since start of the precise producer's lookups: requests looked up, their
    blocks the best-matching synced endpoint held (hits) and did not (misses), and
    endpoints whose match came from the approximate index (view unknown)."""

    requests: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    fallbacks: int = 0


@dataclass(eq=False)
class KVEventsService:
    """Per pool name, the subscribers (and so the index) of its servers' KV events."""

    pools: dict[str, KVEventSubscribers] = field(default_factory=dict)
    lookups: LookupCounters = field(default_factory=LookupCounters)


__all__ = ["KV_EVENTS_SERVICE", "KVEventsService", "LookupCounters"]
