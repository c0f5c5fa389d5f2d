"""One simulated gateway replica: the real director stack of :mod:`sluicegate.bench.des`.

A replica owns what a ``sluicegate serve`` process owns: its datastore (its view of the
pool's endpoints: scraped metrics, its own in-flight counts, its peers' when shared), the
scheduler built from the run's configuration (its prefix index, its latency predictor),
its flow-control queues and the :class:`~sluicegate.requestcontrol.director.Director`
over them. A run has one replica unless it simulates several (``--gateway-replicas``,
:mod:`sluicegate.bench.des_sharing`); they share only what their ``services`` share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from sluicegate.bench.des_backlog import BacklogFeed, Pump
from sluicegate.bench.des_sharing import (
    Delivery,
    Schedule,
    ShareChannel,
    SharedFeed,
    Spreader,
    shared_feeds,
)
from sluicegate.bench.des_spec import (
    POOL,
    ClusterSpec,
    RequestRecord,
    hardware,
    pool_config,
    replica_profiles,
)
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import ServedModels
from sluicegate.datalayer.sharing import SHARED_PREFIX_SERVICE, PrefixShare
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import build_flow_control
from sluicegate.framework import PluginContext, QueueItem
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.scheduling.config import build_scheduler

SEED_STRIDE = 7919
"""Replica *g*'s plugins draw from seed ``decision seed + g × SEED_STRIDE`` (the decision
seed defaults to the run's): independent processes do not share a random stream (replica
0 keeps the decision seed, so one replica is the single-gateway run exactly, and one
replica with decision seed ``seed + g × SEED_STRIDE`` draws as replica *g* does)."""


class QueueOwner(Protocol):
    """What a waiting request's ticket calls back into (the simulation)."""

    def left_queue(self, gateway: int, record: RequestRecord, raw: bytes, d: Dispatch) -> None: ...

    def refused_from_queue(
        self, gateway: int, record: RequestRecord, request_id: str, error: GatewayError
    ) -> None: ...


class Queued:
    """The ticket of a request waiting in one replica's flow control."""

    __slots__ = ("gateway", "owner", "raw", "record")

    def __init__(self, owner: QueueOwner, gateway: int, record: RequestRecord, raw: bytes) -> None:
        self.owner = owner
        self.gateway = gateway
        self.record = record
        self.raw = raw

    def dispatched(self, item: QueueItem, dispatch: Dispatch) -> None:
        self.owner.left_queue(self.gateway, self.record, self.raw, dispatch)

    def rejected(self, item: QueueItem, error: GatewayError) -> None:
        self.owner.refused_from_queue(self.gateway, self.record, item.request.request_id, error)


class GatewayReplica:
    """Replica ``number`` of the run ``spec``, on ``clock``, with the host ``services``
    (the KV-events view, the latency predictor, the shared prefix outbox when on)."""

    def __init__(
        self,
        number: int,
        spec: ClusterSpec,
        clock: ManualClock,
        services: Mapping[str, object],
    ) -> None:
        self.number = number
        profiles = replica_profiles(spec)
        config = pool_config(spec)
        self.datastore = Datastore()
        self.datastore.set_endpoints(
            POOL,
            [
                EndpointSpec(f"sim-{i}", f"10.0.0.{i + 1}", 8000, hardware=hardware(p))
                for i, p in enumerate(profiles)
            ],
        )
        self.endpoints = self.datastore.pools[POOL].endpoints
        models = ServedModels(frozenset({spec.model}), frozenset(spec.adapters), 0.0)
        for endpoint in self.endpoints:
            endpoint.models = models
        share = services.get(SHARED_PREFIX_SERVICE)
        self.share = share if isinstance(share, PrefixShare) else None
        """This replica's prefix outbox and sinks (shared state on), else None."""
        seed = spec.draws_seed + number * SEED_STRIDE
        context = PluginContext(clock, seed, services=dict(services))
        registry = default_registry()
        built = build_scheduler(config.picker, context, registry)
        self.datastore.pools[POOL].annotations = dict(config.pools[POOL].metadata.annotations)
        self.director = Director(
            self.datastore,
            built,
            ModelTable(config),
            clock,
            spec.staleness_s,
            flow=build_flow_control(config.picker, built.plugins, context, registry),
            # The scenarios send no prediction header and measure prediction-based routing:
            # stated here, so that they keep doing so whatever the setting's default.
            prediction_default=True,
        )
        self.queued = 0
        """Requests waiting in this replica's flow control."""
        self.expiry_at: float | None = None
        """The earliest queue deadline an expiry event is scheduled for."""


class GatewayGroup:
    """The run's gateway replicas (``spec.gateways``), how arrivals reach them and what
    they share. ``services(g)`` gives replica *g*'s host services (its KV-events view, its
    predictor); with shared state each also gets its own prefix outbox. ``schedule``
    puts a shared message's delivery on the event queue; ``pump(g, now)`` runs replica
    *g*'s dispatch pass (after a backlog reading: held requests may go now).

    The seam for more shared state: build each replica's object here beside its prefix
    outbox (or over its director, as the backlog feed does), offer it under its service
    name, and give :func:`~sluicegate.bench.des_sharing.shared_feeds` its feed (what a
    replica publishes per tick, what a receiver applies); the channel, its delay and loss,
    and the event loop need no change."""

    def __init__(
        self,
        spec: ClusterSpec,
        clock: ManualClock,
        names: list[str],
        services: Callable[[int], dict[str, object]],
        schedule: Schedule,
        pump: Pump,
    ) -> None:
        settings = spec.gateways
        shares: list[PrefixShare] = []
        self.replicas: list[GatewayReplica] = []
        for g in range(settings.gateways):
            offered = services(g)
            if settings.sharing:
                share = prefix_share(names)
                shares.append(share)
                offered[SHARED_PREFIX_SERVICE] = share
            self.replicas.append(GatewayReplica(g, spec, clock, offered))
        self.spreader = Spreader(settings.gateways, settings.spread)
        self.feeds: list[SharedFeed] = shared_feeds(
            settings,
            shares,
            [r.datastore for r in self.replicas],
            [r.director for r in self.replicas],
            pump,
        )
        """What the replicas exchange (empty: independent, or one replica)."""
        self.channel = ShareChannel(
            settings.gateways, settings.delay_s, settings.loss, spec.seed, schedule
        )

    def first_ticks(self) -> list[tuple[float, tuple[int, int]]]:
        """Each (feed, replica)'s first tick, the replicas staggered over the period."""
        n = len(self.replicas)
        return [
            (feed.interval_s * (g + 1) / n, (f, g))
            for f, feed in enumerate(self.feeds)
            for g in range(n)
        ]

    def tick(self, feed: int, replica: int, now: float) -> float:
        """Replica ``replica`` publishes ``feed``; the feed's period (s)."""
        f = self.feeds[feed]
        for message in f.publish(replica, now):
            self.channel.send(feed, replica, message, now)
        return f.interval_s

    def deliver(self, delivery: Delivery, now: float) -> None:
        self.channel.delivered += 1
        self.feeds[delivery.feed].receive(
            delivery.receiver, delivery.sender, delivery.payload, delivery.sent_at, now
        )

    def queued(self) -> bool:
        """Whether any replica holds requests in its flow control."""
        return any(r.queued for r in self.replicas)

    def counters(self) -> dict[str, int] | None:
        """What the replicas exchanged (None: they shared nothing)."""
        if not self.feeds:
            return None
        counters = self.channel.counters()
        counters["prefix_records_applied"] = sum(
            r.share.received for r in self.replicas if r.share is not None
        )
        for feed in self.feeds:
            if isinstance(feed, BacklogFeed):
                counters.update(feed.counters())
        return counters


def prefix_share(names: list[str]) -> PrefixShare:
    """A replica's prefix outbox, accepting records for the pool's endpoint names only."""
    known = frozenset(names)
    return PrefixShare(known.__contains__)


__all__ = ["SEED_STRIDE", "GatewayGroup", "GatewayReplica", "QueueOwner", "Queued", "prefix_share"]
