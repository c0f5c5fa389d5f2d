"""Gateway replicas in the discrete-event lab: how arrivals are spread over them and what
they share, on the virtual clock (``--gateway-replicas``, ``--replica-state``).

Each replica is a whole director stack (:mod:`sluicegate.bench.des_gateway`). With
``independent`` state they share nothing but what every replica sees by construction —
the servers' scraped metrics and, with precise routing, the servers' KV events (each
replica has its own subscription and index, :mod:`sluicegate.bench.des_kvevents`). With
``shared`` state they also exchange, through a :class:`ShareChannel`, what the runtime
shares through Redis (``docs/replicas.md``, :mod:`sluicegate.runtime.shared`):

- **prefix decisions** (:class:`PrefixFeed`): every replica's approximate prefix producers
  write to a real :class:`~sluicegate.datalayer.sharing.PrefixShare`; every
  ``prefix_flush_s`` the replica's outbox is packed into the wire's batches
  (:func:`~sluicegate.runtime.shared_wire.encode_prefix`), carried, decoded and delivered
  into each other replica's local index (``PrefixShare.deliver``), as the Redis stream's
  writer and reader do;
- **in-flight counts** (:class:`InflightFeed`): every ``inflight_sync_s`` the replica's
  snapshot (:func:`~sluicegate.runtime.shared_wire.encode_load`) goes to each other
  replica, which sums the live snapshots (younger than ``lease_s``) into each endpoint's
  :class:`~sluicegate.datalayer.endpoint.PeerLoad`, as the sync script's reply is summed.

The channel is generic: a :class:`SharedFeed` says what a replica publishes on its tick
and what a receiver does with it; the channel delays every message by ``delay_s`` and loses
each copy (one per receiver) with probability ``loss``, from its own random stream, so
``loss=1.0`` routes exactly as ``independent`` — for policies without online-trained
models, or with ``share_models`` off: the training service's models are still shared
(below). Flow control's per-priority-band backlog
across replicas is one more feed (:class:`~sluicegate.bench.des_backlog.BacklogFeed`, with
flow control on), added in :func:`shared_feeds` with no change to the channel. Online-trained
latency models are not a feed: shared replicas' models come from one training service
(:mod:`sluicegate.bench.des_models`, ``share_models``), which the channel does not carry.

What the model simplifies: the live in-flight sync stores a snapshot and reads the others'
in one call, so a count is up to two sync periods old; here a snapshot is applied on
arrival (up to one period plus ``delay_s``). Redis's outages are losses, not the
fallback's zeroing (the runtime's tests cover that).
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from sluicegate.api.settings import SharedStateSettings
from sluicegate.bench.des_backlog import Pump, backlog_feed
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.sharing import PrefixShare
from sluicegate.requestcontrol.director import Director
from sluicegate.runtime.shared_wire import (
    WireError,
    decode_load,
    decode_prefix,
    encode_load,
    encode_prefix,
)

ReplicaState = Literal["independent", "shared"]
ReplicaSpread = Literal["round-robin", "session"]
REPLICA_STATES: Final[tuple[ReplicaState, ...]] = ("independent", "shared")
REPLICA_SPREADS: Final[tuple[ReplicaSpread, ...]] = ("round-robin", "session")
LatencyModels = Literal["shared", "own", "none"]
"""Where a run's online-trained latency models came from: one training service
(``shared``), one per replica (``own``), or nowhere (``none``: the policy has none)."""

_DEFAULTS = SharedStateSettings.model_fields
DEFAULT_SHARE_DELAY_S: Final = 0.001
"""1 ms from a replica's write to another replica's local state: one Redis round trip in
one data centre plus the reader's wake-up (a loopback round trip measures ~0.25 ms,
``docs/replicas.md``). The write-behind's own period is modelled apart (``prefix_flush_s``)."""
MAX_GATEWAY_REPLICAS: Final = 64
DEFAULT_MODEL_SYNC_S: Final = 1.0
"""How often each replica's prediction server pulls the shared training service's
models (``--sync-interval``, which the replicas' configuration in ``docs/replicas.md``
sets to 1 s; the server's own default is 10 s)."""
MAX_SHARE_DELAY_S: Final = 1.0
"""Bound of ``--replica-share-delay-ms`` (simulated seconds): half the default lease."""
_TAKE = 4096
"""Records packed per flush, at most (as the runtime's writer)."""


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """How many gateway replicas a run has, how arrivals reach them and what they share.
    Times in simulated seconds; the sharing periods default to ``sharedState``'s."""

    gateways: int = 1
    state: ReplicaState = "independent"
    spread: ReplicaSpread = "round-robin"
    """round-robin: each request to the next replica (an L4 balancer per request);
    session: a conversation's requests to one replica (hash of its session id)."""
    delay_s: float = DEFAULT_SHARE_DELAY_S
    loss: float = 0.0
    """Probability that one copy of a shared message never reaches one receiver."""
    prefix_flush_s: float = float(_DEFAULTS["prefix_flush_ms"].default) / 1000.0
    inflight_sync_s: float = float(_DEFAULTS["inflight_sync_ms"].default) / 1000.0
    lease_s: float = float(_DEFAULTS["lease_ms"].default) / 1000.0
    backlog_sync_s: float = float(_DEFAULTS["backlog_sync_ms"].default) / 1000.0
    max_yield_s: float = float(_DEFAULTS["max_yield_ms"].default) / 1000.0
    share_models: bool = True
    """Shared state with online-trained models: the replicas' predictors are fed and
    served by one training service (:mod:`sluicegate.bench.des_models`); False: each
    trains its own, as independent replicas do."""
    model_sync_s: float = DEFAULT_MODEL_SYNC_S
    """How often each replica pulls the training service's newest models."""

    def __post_init__(self) -> None:
        if not 1 <= self.gateways <= MAX_GATEWAY_REPLICAS:
            raise ValueError(
                f"gateway replicas must be 1 … {MAX_GATEWAY_REPLICAS}, got {self.gateways}"
            )
        if self.state not in REPLICA_STATES:
            raise ValueError(
                f"replica state {self.state!r} is not one of {', '.join(REPLICA_STATES)}"
            )
        if self.spread not in REPLICA_SPREADS:
            raise ValueError(
                f"replica spread {self.spread!r} is not one of {', '.join(REPLICA_SPREADS)}"
            )
        # Below the lease, or every in-flight snapshot would arrive expired (and the
        # channel holds one event per copy in flight: n(n-1) x ~40 messages/s x delay,
        # at most ~160k events with 64 replicas and this bound).
        if not (math.isfinite(self.delay_s) and 0 <= self.delay_s <= MAX_SHARE_DELAY_S):
            raise ValueError(
                f"share delay must be 0 … {MAX_SHARE_DELAY_S * 1000:g} ms, got "
                f"{self.delay_s * 1000:g} ms"
            )
        if self.delay_s >= self.lease_s:
            raise ValueError(
                f"share delay ({self.delay_s * 1000:g} ms) must be below the lease "
                f"({self.lease_s * 1000:g} ms): every in-flight snapshot would arrive expired"
            )
        if not (math.isfinite(self.loss) and 0.0 <= self.loss <= 1.0):
            raise ValueError(f"share loss must be 0 … 1, got {self.loss:g}")
        for name in (
            "prefix_flush_s",
            "inflight_sync_s",
            "lease_s",
            "backlog_sync_s",
            "max_yield_s",
            "model_sync_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value:g}")

    @property
    def sharing(self) -> bool:
        """Whether the replicas exchange anything through the channel."""
        return self.state == "shared" and self.gateways > 1

    @property
    def models_shared(self) -> bool:
        """Whether online-trained latency models come from one training service."""
        return self.sharing and self.share_models

    def describe(self, latency_models: LatencyModels) -> dict[str, object]:
        """The fields every ``runs[]`` entry records, for a run whose online-trained
        models came from ``latency_models`` (the simulation's ``RunResult`` says); the
        model sync period only when a training service served them (else None)."""
        return {
            "gateway_replicas": self.gateways,
            "replica_state": self.state,
            "replica_spread": self.spread,
            "replica_share_delay_ms": self.delay_s * 1000.0,
            "replica_share_loss": self.loss,
            "replica_models": latency_models,
            "replica_model_sync_ms": (
                self.model_sync_s * 1000.0 if latency_models == "shared" else None
            ),
        }


class Spreader:
    """Which replica receives each arriving request (the L4 balancer in front of them)."""

    __slots__ = ("_gateways", "_next", "_spread")

    def __init__(self, gateways: int, spread: ReplicaSpread) -> None:
        self._gateways = gateways
        self._spread = spread
        self._next = 0

    def pick(self, session: int) -> int:
        """The replica of a request of ``session`` (−1: not part of a conversation, which
        the session spread sends round-robin too)."""
        n = self._gateways
        if n == 1:
            return 0
        if self._spread == "session" and session >= 0:
            # crc32, not hash(): the same replica for a session on every run
            return zlib.crc32(str(session).encode()) % n
        g = self._next
        self._next = (g + 1) % n
        return g


class SharedFeed(Protocol):
    """One kind of state the replicas share: what replica ``replica`` publishes on each of
    its ticks (every ``interval_s``) and what a receiver does with one message."""

    name: str
    interval_s: float

    def publish(self, replica: int, now: float) -> Sequence[bytes]: ...

    def receive(
        self, replica: int, sender: int, payload: bytes, sent_at: float, now: float
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """One copy of a message on its way: ``feed`` (its index), from ``sender`` to
    ``receiver``, sent at ``sent_at`` (simulated s)."""

    feed: int
    sender: int
    receiver: int
    payload: bytes
    sent_at: float


Schedule = Callable[[float, Delivery], None]
"""Puts a delivery on the event queue at a simulated time."""


class ShareChannel:
    """The store between the replicas: every message reaches each other replica
    ``delay_s`` later, unless that copy is lost (probability ``loss``). Counts in
    :attr:`sent`, :attr:`delivered`, :attr:`lost` (copies) and :attr:`bytes_sent`."""

    def __init__(
        self, gateways: int, delay_s: float, loss: float, seed: int, schedule: Schedule
    ) -> None:
        self.gateways = gateways
        self.delay_s = delay_s
        self.loss = loss
        # Its own stream, so that losses never shift the workload's or the policies' draws.
        self._rng = random.Random(f"replica-share-{seed}")
        self._schedule = schedule
        self.sent = 0
        self.delivered = 0
        self.lost = 0
        self.bytes_sent = 0

    def send(self, feed: int, sender: int, payload: bytes, now: float) -> None:
        self.sent += 1
        self.bytes_sent += len(payload)
        for receiver in range(self.gateways):
            if receiver == sender:
                continue
            if self.loss and self._rng.random() < self.loss:
                self.lost += 1
                continue
            self._schedule(now + self.delay_s, Delivery(feed, sender, receiver, payload, now))

    def counters(self) -> dict[str, int]:
        return {
            "messages_sent": self.sent,
            "copies_delivered": self.delivered,
            "copies_lost": self.lost,
            "bytes_sent": self.bytes_sent,
        }


class PrefixFeed:
    """Each replica's prefix decisions, shipped in the wire's batches (see the module)."""

    name = "prefix"

    def __init__(self, shares: Sequence[PrefixShare], interval_s: float) -> None:
        self.shares = shares
        self.interval_s = interval_s
        self.bad_batches = 0

    def publish(self, replica: int, now: float) -> Sequence[bytes]:
        share = self.shares[replica]
        if not share.outbox:
            return ()
        return list(encode_prefix(share.take(_TAKE)))

    def receive(
        self, replica: int, sender: int, payload: bytes, sent_at: float, now: float
    ) -> None:
        try:
            records = decode_prefix(payload)
        except WireError:  # never from this lab's writer; counted like the runtime's reader
            self.bad_batches += 1
            return
        share = self.shares[replica]
        for record in records:
            share.deliver(record)


class InflightFeed:
    """Each replica's in-flight counts per endpoint, summed by the others into
    ``Endpoint.peers`` (see the module)."""

    name = "inflight"

    def __init__(self, datastores: Sequence[Datastore], interval_s: float, lease_s: float) -> None:
        self.datastores = datastores
        self.interval_s = interval_s
        self.lease_s = lease_s
        n = len(datastores)
        self._latest: list[dict[int, tuple[float, bytes]]] = [{} for _ in range(n)]
        """Per receiver: each sender's last snapshot and when it was sent (bounded by the
        number of replicas)."""

    def publish(self, replica: int, now: float) -> Sequence[bytes]:
        # The live sync also reads on its own tick: a peer whose snapshots stopped
        # arriving stops counting once its lease runs out.
        self._apply(replica, now)
        snapshot = encode_load(
            (e.name, e.inflight.requests, e.inflight.prompt_tokens, e.inflight.decode_tokens)
            for e in self.datastores[replica].all_endpoints()
        )
        return (snapshot,)

    def receive(
        self, replica: int, sender: int, payload: bytes, sent_at: float, now: float
    ) -> None:
        latest = self._latest[replica]
        held = latest.get(sender)
        if held is not None and held[0] > sent_at:
            return  # an older snapshot overtaken by a newer one (never with a fixed delay)
        latest[sender] = (sent_at, payload)
        self._apply(replica, now)

    def _apply(self, replica: int, now: float) -> None:
        latest = self._latest[replica]
        totals: dict[str, list[int]] = {}
        for sender in list(latest):
            sent_at, blob = latest[sender]
            if now - sent_at > self.lease_s:
                del latest[sender]  # its lease ran out
                continue
            try:
                decode_load(blob, totals)
            except WireError:
                del latest[sender]
        for e in self.datastores[replica].all_endpoints():
            p = e.peers
            t = totals.get(e.name)
            if t is None:
                p.requests = p.prompt_tokens = p.decode_tokens = 0
            else:
                p.requests, p.prompt_tokens, p.decode_tokens = t


def shared_feeds(
    settings: ReplicaSettings,
    shares: Sequence[PrefixShare],
    datastores: Sequence[Datastore],
    directors: Sequence[Director],
    pump: Pump,
) -> list[SharedFeed]:
    """What the replicas of a ``shared`` run exchange (none for ``independent``); the
    backlog feed sets each director's ``peer_yield`` and calls ``pump`` after a reading.
    The seam for more shared state: append its feed here."""
    if not settings.sharing:
        return []
    feeds: list[SharedFeed] = [
        PrefixFeed(shares, settings.prefix_flush_s),
        InflightFeed(datastores, settings.inflight_sync_s, settings.lease_s),
    ]
    backlog = backlog_feed(
        directors, settings.backlog_sync_s, settings.lease_s, settings.max_yield_s, pump
    )
    if backlog is not None:
        feeds.append(backlog)
    return feeds


__all__ = [
    "DEFAULT_MODEL_SYNC_S",
    "DEFAULT_SHARE_DELAY_S",
    "MAX_GATEWAY_REPLICAS",
    "REPLICA_SPREADS",
    "REPLICA_STATES",
    "Delivery",
    "InflightFeed",
    "PrefixFeed",
    "ReplicaSettings",
    "ReplicaSpread",
    "ReplicaState",
    "ShareChannel",
    "SharedFeed",
    "Spreader",
    "shared_feeds",
]
