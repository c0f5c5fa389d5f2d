"""Metrics computed when ``/metrics`` is scraped, from live state rather than counted per
request: each pool's load as the gateway estimates it, the flow-control queues, and the
standalone gateway's client connections. :class:`~sluicegate.metrics.GatewayMetrics`
registers them in its registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore


@dataclass(frozen=True, slots=True)
class ClientConnections:
    """The standalone gateway's client side, as its HTTP server counts it."""

    open: int
    """Client connections open now."""
    refused: int
    """Connections refused by the server's client limits since start."""
    buffered_body_bytes: int
    """Request-body bytes held now, across all connections (bytes)."""
    body_timeouts: int
    """Requests whose body did not arrive within ``bodyTimeoutMs``, since start."""


ClientCounts = Callable[[], ClientConnections]


class ClientCollector(Collector):
    """Client-connection gauges and counters, read when scraped."""

    def __init__(self, counts: ClientCounts) -> None:
        self._counts = counts

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        now = self._counts()
        yield GaugeMetricFamily(
            "sluicegate_client_connections", "Client connections open.", value=now.open
        )
        yield CounterMetricFamily(
            "sluicegate_client_connections_refused",
            "Client connections refused by the client limits (maxConnections, ...).",
            value=now.refused,
        )
        yield GaugeMetricFamily(
            "sluicegate_request_body_buffered_bytes",
            "Request-body bytes buffered across client connections.",
            value=now.buffered_body_bytes,
        )
        yield CounterMetricFamily(
            "sluicegate_request_body_timeouts",
            "Requests whose body did not arrive within bodyTimeoutMs.",
            value=now.body_timeouts,
        )


FlowState = Callable[[], Iterable[tuple[str, float, Iterable[tuple[int, str, int, int]]]]]
"""(pool, saturation, [(priority, fairness id, queued requests, queued bytes)]) for each
pool."""


class FlowCollector(Collector):
    """Flow-control queue sizes and pool saturation, read when scraped."""

    def __init__(self, state: FlowState) -> None:
        self._state = state

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "inference_extension_flow_control_queue_size",
            "Requests waiting in flow control, by pool, priority and flow (fairness id).",
            labels=["inference_pool", "priority", "fairness_id"],
        )
        size_bytes = GaugeMetricFamily(
            "inference_extension_flow_control_queue_bytes",
            "Bytes of request bodies waiting in flow control, by pool, priority and flow.",
            labels=["inference_pool", "priority", "fairness_id"],
        )
        saturation = GaugeMetricFamily(
            "inference_extension_flow_control_pool_saturation",
            "Pool saturation as the flow control detector sees it (1.0 = full).",
            labels=["inference_pool"],
        )
        for pool, pool_saturation, bands in self._state():
            saturation.add_metric([pool], pool_saturation)
            for priority, flow, requests, nbytes in bands:
                size.add_metric([pool, str(priority), flow], requests)
                size_bytes.add_metric([pool, str(priority), flow], nbytes)
        yield from (size, size_bytes, saturation)


class PoolCollector(Collector):
    """Per-pool gauges computed from endpoint state at scrape time."""

    def __init__(
        self,
        datastore: Datastore,
        clock: Clock,
        staleness_s: float,
        prefix_index_size: Callable[[], int] | None,
    ) -> None:
        self._datastore = datastore
        self._clock = clock
        self._staleness = staleness_s
        self._prefix_size = prefix_index_size

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        now = self._clock.now()
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization",
            "Mean KV-cache use of the pool's fresh endpoints (0..1).",
            labels=["name"],
        )
        queue = GaugeMetricFamily(
            "inference_pool_average_queue_size",
            "Mean waiting requests per fresh endpoint.",
            labels=["name"],
        )
        running = GaugeMetricFamily(
            "inference_pool_average_running_requests",
            "Mean running requests per fresh endpoint.",
            labels=["name"],
        )
        ready = GaugeMetricFamily(
            "inference_pool_ready_pods", "Endpoints neither ejected nor stale.", labels=["name"]
        )
        ejected = GaugeMetricFamily(
            "sluicegate_endpoints_ejected",
            "Endpoints out of scheduling now (failed requests or scrapes).",
            labels=["pool"],
        )
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "Waiting requests per endpoint.",
            labels=["name", "model_server_pod"],
        )
        inflight = GaugeMetricFamily(
            "sluicegate_endpoint_inflight_requests",
            "Requests this gateway has in flight per endpoint.",
            labels=["name", "model_server_pod"],
        )
        hardware = GaugeMetricFamily(
            "sluicegate_endpoint_hardware_info",
            "1 per endpoint, labelled with its hardware class (empty: none known).",
            labels=["name", "model_server_pod", "accelerator"],
        )
        cost = GaugeMetricFamily(
            "sluicegate_endpoint_cost_per_hour",
            "What each endpoint costs per hour, in the configured currency (endpoints "
            "with a known cost only).",
            labels=["name", "model_server_pod"],
        )
        for pool in self._datastore.pools.values():
            fresh = [
                e
                for e in pool.endpoints
                if not e.health.ejected and not e.is_stale(now, self._staleness)
            ]
            n = len(fresh)
            kv.add_metric([pool.name], sum(e.kv_usage() for e in fresh) / n if n else 0.0)
            queue.add_metric([pool.name], sum(e.waiting for e in fresh) / n if n else 0.0)
            running.add_metric([pool.name], sum(e.running for e in fresh) / n if n else 0.0)
            ready.add_metric([pool.name], n)
            ejected.add_metric([pool.name], sum(1 for e in pool.endpoints if e.health.ejected))
            for e in pool.endpoints:
                per_pod.add_metric([pool.name, e.name], e.waiting)
                inflight.add_metric([pool.name, e.name], e.inflight.requests)
                hardware.add_metric([pool.name, e.name, e.hardware.accelerator or ""], 1.0)
                if e.hardware.cost_per_hour is not None:
                    cost.add_metric([pool.name, e.name], e.hardware.cost_per_hour)
        yield from (kv, queue, running, ready, ejected, per_pod, inflight, hardware, cost)
        if self._prefix_size is not None:
            size = GaugeMetricFamily(
                "inference_extension_prefix_indexer_size", "Block hashes held by the prefix index."
            )
            size.add_metric([], self._prefix_size())
            yield size


__all__ = [
    "ClientCollector",
    "ClientConnections",
    "ClientCounts",
    "FlowCollector",
    "FlowState",
    "PoolCollector",
]
