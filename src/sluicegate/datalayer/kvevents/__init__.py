"""Precise prefix-cache state from the model servers' own KV-cache events (issue 17).

- :mod:`~sluicegate.datalayer.kvevents.wire` — vLLM's ZeroMQ/msgpack event protocol,
  decoded into ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared`` (``decode_batch``);
- :mod:`~sluicegate.datalayer.kvevents.index` — ``PreciseIndex``: which endpoint holds
  which block, keyed by sluicegate's own chain of token-id hashes (``block_keys``);
- :mod:`~sluicegate.datalayer.kvevents.subscriber` — ``KVEventSubscribers``: one SUB
  socket per endpoint, gaps replayed, restarts and losses drop that endpoint's entries;
- :mod:`~sluicegate.datalayer.kvevents.service` — ``KVEventsService``: each pool's
  subscribers, as the ``precise-prefix-cache-producer`` finds them.

The runtime's :mod:`sluicegate.runtime.kvevents` subscribes per the pools' ``kvEvents``.
The simulator publishes the same protocol (:mod:`sluicegate.sim.kvevents`); the wire
structs both use are in :mod:`sluicegate.kv_wire`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_WIRE = "sluicegate.datalayer.kvevents.wire"
_INDEX = "sluicegate.datalayer.kvevents.index"
_SUBSCRIBER = "sluicegate.datalayer.kvevents.subscriber"
_SERVICE = "sluicegate.datalayer.kvevents.service"
_EXPORTS = {
    "AllBlocksCleared": _WIRE,
    "BlockRemoved": _WIRE,
    "BlockStored": _WIRE,
    "KVEvent": _WIRE,
    "KVEventBatch": _WIRE,
    "KVEventDecodeError": _WIRE,
    "decode_batch": _WIRE,
    "extra_key_bytes": _WIRE,
    "ROOT_KEY": _INDEX,
    "IndexCounters": _INDEX,
    "PreciseIndex": _INDEX,
    "block_keys": _INDEX,
    "EndpointStream": _SUBSCRIBER,
    "KVEventCounters": _SUBSCRIBER,
    "KVEventSource": _SUBSCRIBER,
    "KVEventSubscribers": _SUBSCRIBER,
    "SubscriberSettings": _SUBSCRIBER,
    "View": _SUBSCRIBER,
    "KV_EVENTS_SERVICE": _SERVICE,
    "KVEventsService": _SERVICE,
    "LookupCounters": _SERVICE,
}

if TYPE_CHECKING:
    from sluicegate.datalayer.kvevents.index import (
        ROOT_KEY,
        IndexCounters,
        PreciseIndex,
        block_keys,
    )
    from sluicegate.datalayer.kvevents.service import (
        KV_EVENTS_SERVICE,
        KVEventsService,
        LookupCounters,
    )
    from sluicegate.datalayer.kvevents.subscriber import (
        EndpointStream,
        KVEventCounters,
        KVEventSource,
        KVEventSubscribers,
        SubscriberSettings,
        View,
    )
    from sluicegate.datalayer.kvevents.wire import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEvent,
        KVEventBatch,
        KVEventDecodeError,
        decode_batch,
        extra_key_bytes,
    )


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())

__all__ = [
    "KV_EVENTS_SERVICE",
    "ROOT_KEY",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EndpointStream",
    "IndexCounters",
    "KVEvent",
    "KVEventBatch",
    "KVEventCounters",
    "KVEventDecodeError",
    "KVEventSource",
    "KVEventSubscribers",
    "KVEventsService",
    "LookupCounters",
    "PreciseIndex",
    "SubscriberSettings",
    "View",
    "block_keys",
    "decode_batch",
    "extra_key_bytes",
]
