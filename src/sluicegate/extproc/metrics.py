"""Metrics of the Envoy endpoint picker itself, exported beside the runtime's.

They live in the runtime's registry (:attr:`sluicegate.metrics.GatewayMetrics.registry`),
so ``/metrics`` serves them together with the ``inference_*`` families. The time from the
request headers to the routing answer (body upload and any flow-control wait included) is
``sluicegate_gateway_overhead_seconds``, shared with the standalone gateway.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry

from sluicegate.instruments import Counter, Gauge


class ExtProcMetrics:
    """Streams, decisions and immediate answers of the ext_proc server. One set per
    registry: get it with :meth:`of` (a server restarted on the same runtime reuses it)."""

    @classmethod
    def of(cls, registry: CollectorRegistry) -> ExtProcMetrics:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = _BY_REGISTRY[registry] = cls(registry)
        return metrics

    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Counter(
            "sluicegate_extproc_streams",
            "ext_proc streams opened by the proxy (one per HTTP request).",
            registry=registry,
        )
        self.active_streams = Gauge(
            "sluicegate_extproc_active_streams",
            "ext_proc streams open now.",
            registry=registry,
        )
        self.immediate = Counter(
            "sluicegate_extproc_immediate_responses",
            "Requests answered by the picker itself, by HTTP status and reason.",
            ("status", "reason"),
            registry=registry,
        )
        self.internal_errors = Counter(
            "sluicegate_extproc_internal_errors",
            "Unexpected faults while processing a message, by phase (request/response).",
            ("phase",),
            registry=registry,
        )


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, ExtProcMetrics] = (
    weakref.WeakKeyDictionary()
)
