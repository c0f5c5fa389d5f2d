"""KV-cache events in the discrete-event lab: each engine's block stores and removals
reach the director's precise index after a delay, on the virtual clock.

The live path is: vLLM logs what its KV cache did during a step, publishes the batch once
the step's results are out (``vllm/v1/engine/core.py`` takes the scheduler's events after
``update_from_output``), ZeroMQ carries it, and the gateway's subscriber decodes and
applies it (:mod:`sluicegate.datalayer.kvevents.subscriber`). Here the engines log the
same events (:class:`~sluicegate.sim.kvevents.KVEventLog`, the simulator's own), a batch
is *published* at the end of the step that produced it and *applied* ``delay_s`` later:
encoded as the simulator's publisher encodes it (:func:`~sluicegate.sim.kvevents.encode_payload`,
vLLM 0.32's array layout) and read back by the gateway's decoder
(:func:`~sluicegate.datalayer.kvevents.wire.decode_batch`), so the lab exercises the same
bytes as the sockets would carry, without sockets. Delivery keeps publication order per
engine (a fixed delay cannot reorder), so every view stays *synced*: the lab measures what
precise routing gains and what event lag costs, not loss recovery (the subscriber's
tests cover that).

``delay_s`` (``--kv-event-delay-ms``, default :data:`DEFAULT_DELAY_S`) stands for the
server's publisher thread, the network and the gateway's event loop together.
"""

from __future__ import annotations

from typing import Final

import msgspec

from sluicegate.clock import Clock
from sluicegate.datalayer.kvevents.index import PreciseIndex
from sluicegate.datalayer.kvevents.service import KVEventsService
from sluicegate.datalayer.kvevents.subscriber import EndpointStream, KVEventSubscribers, View
from sluicegate.datalayer.kvevents.wire import decode_batch
from sluicegate.sim.engine import Engine
from sluicegate.sim.kvevents import KVEventLog, encode_payload

DEFAULT_DELAY_S: Final = 0.005
"""5 ms: a step's events reach the index this long after the step ends. vLLM hands the
batch to a publisher thread through a queue and sends it on a ZeroMQ PUB socket
(``vllm/distributed/kv_events.py``); on one data-centre network hop plus the gateway's
decoding that is a few milliseconds (the subscriber's own decode-and-apply measures
about 20 µs per 16-block store, ``datalayer/kvevents/index.py``)."""

CAPACITY_MARGIN: Final = 0.10
"""Index entries per endpoint beyond its ``num_gpu_blocks``: the runtime's default
``capacityMarginPercent`` (10 %)."""


class KVEventDelivery:
    """The engines' event logs and the indexes they feed, for one simulation run.

    :meth:`take` collects what engine *i* logged in the step just started (the simulation
    schedules its delivery); :meth:`deliver` applies one batch to every gateway replica's
    index (``gateways`` of them: with several replicas each subscribes to every engine, as
    live). ``views[g].service`` is what replica *g*'s ``precise-prefix-cache-producer``
    reads (the host's ``kv-events`` service).
    """

    def __init__(
        self,
        pool: str,
        names: list[str],
        engines: list[Engine],
        clock: Clock,
        delay_s: float,
        gateways: int = 1,
    ) -> None:
        if delay_s < 0:
            raise ValueError(f"KV-event delay must be ≥ 0 s, got {delay_s}")
        if gateways < 1:
            raise ValueError(f"KV events need at least one gateway, got {gateways}")
        self.delay_s = delay_s
        self.clock = clock
        self.names = names
        self.views = [_View(pool, names, engines, clock) for _ in range(gateways)]
        """One index per gateway replica: every replica subscribes to every engine."""
        self._logs: list[KVEventLog] = []
        for engine in engines:
            log = KVEventLog()
            engine.log_kv_events(log)
            self._logs.append(log)
        self._encoder = msgspec.msgpack.Encoder()
        self.seq = [0] * len(engines)
        """Batches published per engine."""

    @property
    def index(self) -> PreciseIndex:
        """The first gateway replica's index."""
        return self.views[0].index

    @property
    def service(self) -> KVEventsService:
        """What the first gateway replica's precise producer reads."""
        return self.views[0].service

    def take(self, engine: int, published_at: float) -> bytes | None:
        """Engine ``engine``'s events since the last call, as the payload it would publish
        at ``published_at`` (simulated s); None when its cache did not change."""
        events = self._logs[engine].take()
        if not events:
            return None
        self.seq[engine] += 1
        return encode_payload(events, published_at, self._encoder)

    def deliver(self, engine: int, payload: bytes) -> None:
        """Apply one published batch of engine ``engine`` to every replica's index (each
        decodes it, as each subscriber would)."""
        name = self.names[engine]
        for view in self.views:
            stream = view.subscribers.streams[name]
            for event in decode_batch(payload).events:
                view.index.apply(name, event)
            stream.counters.decoded += 1
            stream.last_batch_at = self.clock.now()

    def close(self) -> None:
        """Release the subscribers' (socket-less) ZeroMQ contexts."""
        for view in self.views:
            view.subscribers.context.term()


class _View:
    """One gateway replica's subscription: its precise index and the ``kv-events`` service
    its ``precise-prefix-cache-producer`` reads."""

    __slots__ = ("index", "service", "subscribers")

    def __init__(self, pool: str, names: list[str], engines: list[Engine], clock: Clock) -> None:
        self.index = PreciseIndex(max(_capacity(e) for e in engines))
        for name, engine in zip(names, engines, strict=True):
            self.index.set_capacity(name, _capacity(engine))
        # The subscribers' class holds the index and the views the producer reads; no
        # socket is ever opened on it (sync() is never called), its views are set here.
        self.subscribers = KVEventSubscribers(self.index, clock=clock)
        for name in names:
            self.subscribers.streams[name] = EndpointStream(view=View.SYNCED)
        self.service = KVEventsService(pools={pool: self.subscribers})


def _capacity(engine: Engine) -> int:
    """Index entries for one engine: its blocks plus the margin (as the runtime sets)."""
    return int(engine.profile.num_gpu_blocks * (1 + CAPACITY_MARGIN)) + 1


__all__ = ["CAPACITY_MARGIN", "DEFAULT_DELAY_S", "KVEventDelivery"]
