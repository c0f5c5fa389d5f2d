"""The shared state's metrics (``sluicegate_shared_state_*``; with in-flight sharing,
``sluicegate_endpoint_peer_inflight_requests``; with backlog sharing,
``sluicegate_flow_control_peer_*``; docs/metrics.md), read from
:class:`~sluicegate.runtime.shared.SharedState` when ``/metrics`` is scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.clock import Clock
from sluicegate.flowcontrol.peers import PeerYield
from sluicegate.runtime.shared import SharedState
from sluicegate.runtime.shared_backlog import BacklogSync


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
        for task in ("inflight", "prefix-write", "prefix-read", "backlog"):
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


class PeerYieldCollector(Collector):
    """Flow control across replicas: the other replicas' waiting requests (the last
    reading) and what the dispatch rule did with them, read when scraped."""

    def __init__(
        self, sync: BacklogSync, rule: Callable[[], PeerYield | None], clock: Clock
    ) -> None:
        self._sync = sync
        self._rule = rule
        """The director's dispatch rule (None: nothing held, nothing counted)."""
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        labels = ["inference_pool", "priority"]
        waiting = GaugeMetricFamily(
            "sluicegate_flow_control_peer_queue_size",
            "Requests waiting in the other gateway replicas' flow control, by pool and "
            "priority (last reading; none when older than the lease or Redis is down).",
            labels=labels,
        )
        for pool, bands in self._sync.view.reading(self._clock.now()).items():
            for priority, n in bands.items():
                waiting.add_metric([pool, str(priority)], n)
        yield waiting
        rule = self._rule() or PeerYield(self._sync.view)
        for name, text, counts in (
            (
                "peer_yields",
                "Requests that held back for the other replicas' higher-priority requests.",
                rule.yielded,
            ),
            (
                "peer_yield_releases",
                "Requests dispatched after holding maxYieldMs while peers' higher bands waited.",
                rule.released,
            ),
        ):
            family = CounterMetricFamily(f"sluicegate_flow_control_{name}", text, labels=labels)
            for (pool, priority), n in counts.items():
                family.add_metric([pool, str(priority)], n)
            yield family
        yield CounterMetricFamily(
            "sluicegate_shared_state_backlog_bad_snapshots",
            "Other replicas' backlog snapshots skipped as malformed.",
            value=self._sync.bad_snapshots,
        )


__all__ = ["PeerYieldCollector", "SharedStateCollector"]
