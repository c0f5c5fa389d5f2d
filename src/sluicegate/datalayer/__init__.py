"""The data layer: the endpoints, what the gateway knows about each, and keeping it fresh.

- :mod:`~sluicegate.datalayer.endpoint` — ``Endpoint`` and its state (``EngineMetrics``,
  ``ServedModels``, ``InFlight``, ``PeerLoad``, ``Health``);
- :mod:`~sluicegate.datalayer.datastore` — the endpoint set: ``Datastore``, ``Pool``,
  ``EndpointSpec``;
- :mod:`~sluicegate.datalayer.pools` — from configuration to endpoint set
  (``static_endpoints``, ``sync_pools``);
- :mod:`~sluicegate.datalayer.collector` — metric scrapes, served-model lists, health
  (``Collector``);
- :mod:`~sluicegate.datalayer.parsers` — model servers' Prometheus metrics per engine;
- :mod:`~sluicegate.datalayer.sharing` — what the prefix producers publish to and
  receive from other gateway replicas (``PrefixShare``, ``SHARED_PREFIX_SERVICE``);
- :mod:`~sluicegate.datalayer.outlier`, :mod:`~sluicegate.datalayer.stall` — taking out
  endpoints whose requests fail or stall (``OutlierDetector``).

The names are imported on first use (lazy): ``import sluicegate.framework`` runs this file
for :mod:`~sluicegate.datalayer.endpoint` alone and must not load the collector, its HTTP
client or the metrics parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "Collector": "sluicegate.datalayer.collector",
    "CollectorSettings": "sluicegate.datalayer.collector",
    "Datastore": "sluicegate.datalayer.datastore",
    "EndpointSpec": "sluicegate.datalayer.datastore",
    "Pool": "sluicegate.datalayer.datastore",
    "SAME_ITERATION_S": "sluicegate.datalayer.endpoint",
    "Endpoint": "sluicegate.datalayer.endpoint",
    "EngineMetrics": "sluicegate.datalayer.endpoint",
    "Hardware": "sluicegate.datalayer.endpoint",
    "Health": "sluicegate.datalayer.endpoint",
    "InFlight": "sluicegate.datalayer.endpoint",
    "PeerLoad": "sluicegate.datalayer.endpoint",
    "ServedModels": "sluicegate.datalayer.endpoint",
    "OutlierDetector": "sluicegate.datalayer.outlier",
    "OutlierSettings": "sluicegate.datalayer.outlier",
    "Result": "sluicegate.datalayer.outlier",
    "classify_status": "sluicegate.datalayer.outlier",
    "ENGINES": "sluicegate.datalayer.parsers",
    "MetricsParseError": "sluicegate.datalayer.parsers",
    "MetricsParser": "sluicegate.datalayer.parsers",
    "EndpointsByPool": "sluicegate.datalayer.pools",
    "static_endpoints": "sluicegate.datalayer.pools",
    "sync_pools": "sluicegate.datalayer.pools",
    "stalled": "sluicegate.datalayer.stall",
    "SHARED_PREFIX_SERVICE": "sluicegate.datalayer.sharing",
    "PrefixShare": "sluicegate.datalayer.sharing",
}

if TYPE_CHECKING:
    from sluicegate.datalayer.collector import Collector, CollectorSettings
    from sluicegate.datalayer.datastore import Datastore, EndpointSpec, Pool
    from sluicegate.datalayer.endpoint import (
        SAME_ITERATION_S,
        Endpoint,
        EngineMetrics,
        Hardware,
        Health,
        InFlight,
        PeerLoad,
        ServedModels,
    )
    from sluicegate.datalayer.outlier import (
        OutlierDetector,
        OutlierSettings,
        Result,
        classify_status,
    )
    from sluicegate.datalayer.parsers import ENGINES, MetricsParseError, MetricsParser
    from sluicegate.datalayer.pools import EndpointsByPool, static_endpoints, sync_pools
    from sluicegate.datalayer.sharing import SHARED_PREFIX_SERVICE, PrefixShare
    from sluicegate.datalayer.stall import stalled


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "ENGINES",
    "SAME_ITERATION_S",
    "SHARED_PREFIX_SERVICE",
    "Collector",
    "CollectorSettings",
    "Datastore",
    "Endpoint",
    "EndpointSpec",
    "EndpointsByPool",
    "EngineMetrics",
    "Hardware",
    "Health",
    "InFlight",
    "MetricsParseError",
    "MetricsParser",
    "OutlierDetector",
    "OutlierSettings",
    "PeerLoad",
    "Pool",
    "PrefixShare",
    "Result",
    "ServedModels",
    "classify_status",
    "stalled",
    "static_endpoints",
    "sync_pools",
]
