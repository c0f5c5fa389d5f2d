"""The shared state's metrics (``sluicegate_shared_state_*`` and, with in-flight sharing,
``sluicegate_endpoint_peer_inflight_requests``; docs/metrics.md), read from
:class:`~sluicegate.runtime.shared.SharedState` when ``/metrics`` is scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.runtime.shared import SharedState


class SharedStateCollector(Collector):
    """The shared state's metrics, read when scraped."""

    def __init__(self, state: SharedState) -> None:
        self._state = state

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        s = self._state
        yield GaugeMetricFamily(
            "sluicegate_shared_state_up",
            "1 while the last Redis call succeeded (state shared), 0 on local state.",
            value=1 if s.up else 0,
        )
        fallbacks = CounterMetricFamily(
            "sluicegate_shared_state_fallbacks",
            "Redis calls that failed or timed out (the replica used local state).",
            labels=["task"],
        )
        for task in ("inflight", "prefix-write", "prefix-read"):
            fallbacks.add_metric([task], s.fallbacks.get(task, 0))
        yield fallbacks
        yield GaugeMetricFamily(
            "sluicegate_shared_state_peer_replicas",
            "Other replicas whose in-flight lease was alive at the last sync.",
            value=s.peer_replicas,
        )
        if s.settings.inflight:
            peers = GaugeMetricFamily(
                "sluicegate_endpoint_peer_inflight_requests",
                "Requests the other gateway replicas have in flight per endpoint (last sync).",
                labels=["name", "model_server_pod"],
            )
            for pool in s.datastore.pools.values():
                for e in pool.endpoints:
                    peers.add_metric([pool.name, e.name], e.peers.requests)
            yield peers
        share = s.share
        values: list[tuple[str, str, Callable[[], int]]] = [
            ("batches_written", "Prefix batches this replica wrote.", lambda: s.batches_written),
            ("batches_read", "Other replicas' prefix batches applied.", lambda: s.batches_read),
            ("bad_batches", "Prefix batches skipped as malformed.", lambda: s.bad_batches),
            ("lost_records", "Prefix decisions not shipped (Redis down).", lambda: s.lost_records),
            (
                "received_records",
                "Other replicas' prefix decisions inserted locally.",
                lambda: share.received if share is not None else 0,
            ),
            (
                "dropped_records",
                "Prefix decisions dropped from a full outbox.",
                lambda: share.dropped if share is not None else 0,
            ),
        ]
        for name, text, read in values:
            yield CounterMetricFamily(f"sluicegate_shared_state_prefix_{name}", text, value=read())


__all__ = ["SharedStateCollector"]
