"""The discrete-event cluster simulation: the real director on a virtual clock.

N simulated engines (``sim/engine.py``) and the gateway's own request path — parsing,
model routing, candidate selection, the scheduling plugins, in-flight accounting — run on
one :class:`~sluicegate.clock.ManualClock`. Nothing is modelled that the shipped code
does: every routing decision is made by :class:`~sluicegate.requestcontrol.director.Director`.

Events, in time order (ties in insertion order, so a run is deterministic for a seed):

- **arrival**: the client's request (on its connection, when the run models the client's
  connections to a per-connection balancer: :mod:`~sluicegate.bench.connections`; a request
  finding every connection busy at the pool's limit is sent when one frees up) is
  serialised as the HTTP body it would send, parsed and routed by the director, then the
  chosen engine receives it exactly as the simulated HTTP server would turn that body into
  a sequence;
- **engine step**: an engine delivers the previous iteration's tokens (first token →
  the gateway marks its first byte; finish → the request completes, the workload may send a
  follow-up) and starts the next iteration, which ends ``duration`` later;
- **scrape**: every ``scrape_interval_s`` each endpoint's metrics snapshot is refreshed
  from its engine (phases staggered), so the gateway sees the pool exactly as stale as it
  would live; between scrapes it relies on its own in-flight counts.

With several gateway replicas (``ClusterSpec.gateways``) each arrival goes to one of them
(:class:`~sluicegate.bench.des_sharing.Spreader`), each replica is a whole director stack
(:mod:`~sluicegate.bench.des_gateway`), every scrape reaches every replica, and two more
events carry what shared replicas exchange: a replica's **share tick** (one per feed and
replica, every feed period) and a message's **delivery** to another replica
(:mod:`~sluicegate.bench.des_sharing`).

Network time between gateway and engines is taken as zero. What a run is given and returns
is in :mod:`~sluicegate.bench.des_spec`; the translations between request bodies, engine
sequences and scrapes in :mod:`~sluicegate.bench.des_requests`.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

import orjson

from sluicegate.bench.connections import ClientSender, Connection, ConnectionPool
from sluicegate.bench.des_gateway import GatewayGroup, GatewayReplica, Queued
from sluicegate.bench.des_kvevents import KVEventDelivery
from sluicegate.bench.des_requests import (
    engine_metrics,
    engine_sequence,
    servable_tokens,
)
from sluicegate.bench.des_services import ReplicaServices
from sluicegate.bench.des_sharing import Delivery, LatencyModels
from sluicegate.bench.des_spec import (
    POOL,
    ClusterSpec,
    RequestRecord,
    RunResult,
    TrainedPredictor,
    replica_profiles,
    wants_kv_events,
)
from sluicegate.bench.workloads import RequestSpec, Workload
from sluicegate.clock import ManualClock
from sluicegate.errors import GatewayError
from sluicegate.framework import (
    PREDICTION_OUTCOME,
    QueueItem,
)
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.sim.api import ApiError
from sluicegate.sim.engine import Engine, Sequence, StepResult
from sluicegate.sim.prompt_tokens import load_shared


class ClusterSimulation:
    """One run: a workload against a simulated pool behind the director."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.clock = ManualClock()
        profiles = replica_profiles(spec)
        tokens = load_shared(p.tokenizer for p in profiles)  # one load per tokenizer
        self.engines = [
            Engine(p, prompt_tokens=tokens[p.tokenizer] if p.tokenizer else None) for p in profiles
        ]
        names = [f"sim-{i}" for i in range(len(profiles))]
        n = spec.gateways.gateways
        self.kv_events: KVEventDelivery | None = None
        """The engines' KV events and the precise indexes they feed (when on)."""
        if wants_kv_events(spec):
            self.kv_events = KVEventDelivery(
                POOL, names, self.engines, self.clock, spec.kv_event_delay_s, gateways=n
            )
        self._next_step_at = [0.0] * spec.replicas
        self._bodies: dict[str, tuple[bytes, bool]] = {}
        """Bodies of requests the directors are deciding about (for the oracle)."""
        self._stepping = [False] * spec.replicas
        self._index = {name: i for i, name in enumerate(names)}
        services = ReplicaServices(
            spec,
            self.clock,
            self.engines,
            self.kv_events,
            lambda i: self._next_step_at[i] if self._stepping[i] else self.clock.now(),
            self._bodies,
            self._engine_sequence,
        )
        self.group = GatewayGroup(
            spec,
            self.clock,
            names,
            services,
            self._schedule_delivery,
            lambda g, now: self._release(self.gateways[g], now),
        )
        self.predictors = services.predictors
        """The online-trained latency models (``predictor="model"``), one per replica."""
        self.training = services.training
        """Shared replicas' training service (their models), else None."""
        self.gateways = self.group.replicas
        first = self.gateways[0]
        self.datastore = first.datastore
        self.endpoints = first.endpoints
        self.director = first.director
        """The first replica's (the only one's, unless the run has several)."""
        self.predictor: TrainedPredictor | None = self.predictors[0] if self.predictors else None
        self._events: list[tuple[float, int, int, Any]] = []
        self._order = itertools.count()
        self._work_events = 0
        """Arrival and step events waiting in the queue."""
        self._pending: list[StepResult | None] = [None] * spec.replicas
        self._inflight: dict[str, tuple[Dispatch, RequestRecord, int]] = {}
        """Requests on an engine: their dispatch, record and gateway replica."""
        self._ids = itertools.count()
        self.records: list[RequestRecord] = []
        self.client: ConnectionPool | None = None
        """The client's connections (``spec.connections``); None: per-request routing."""
        self._sender: ClientSender[RequestSpec] | None = None
        if spec.connections is not None:
            # Its own stream, so that the policy's draws do not shift the backends'; a
            # routing draw like the gateways' (the baseline's balancer), so the decision seed.
            rng = random.Random(f"connections-{spec.draws_seed}")
            backends = spec.replicas if spec.connections.pinned else 1  # 1: the gateway
            self.client = ConnectionPool(spec.connections, backends, rng)
            self._sender = ClientSender(self.client)
        self._on_connection: dict[RequestRecord, Connection] = {}
        self.on_complete: list[Callable[[RequestRecord, Dispatch], None]] = []
        """Hooks called when a request completes (e.g. latency-model training)."""

    # ------------------------------------------------------------------ events

    _ARRIVAL, _STEP, _SCRAPE, _EXPIRE, _KV_EVENTS, _SEND, _SHARE_TICK, _SHARE = range(8)
    _IDLE_KINDS = frozenset({_SCRAPE, _KV_EVENTS, _SHARE_TICK, _SHARE})
    """Events that start no further work of their own."""

    def _push(self, t: float, kind: int, payload: Any) -> None:
        if kind not in self._IDLE_KINDS:
            self._work_events += 1
        heapq.heappush(self._events, (t, next(self._order), kind, payload))

    def _schedule_delivery(self, t: float, delivery: Delivery) -> None:
        self._push(t, self._SHARE, delivery)

    def run(self, workload: Workload, horizon_s: float) -> RunResult:
        """Simulate until every request is done or the clock reaches ``horizon_s``."""
        self._workload = workload
        for t, spec in workload.initial():
            self._push(t, self._ARRIVAL, spec)
        interval = self.spec.scrape_interval_s
        for i in range(self.spec.replicas):
            self._scrape(i, 0.0)
            self._push(interval * (i + 1) / self.spec.replicas, self._SCRAPE, i)
        for t, tick in self.group.first_ticks():
            self._push(t, self._SHARE_TICK, tick)
        events = self._events
        cut = False
        while events:
            t, _, kind, payload = heapq.heappop(events)
            if t > horizon_s:
                cut = True  # the simulated span is the whole horizon
                break
            if kind not in self._IDLE_KINDS:
                self._work_events -= 1
            self.clock.set(t)
            self._handle(kind, payload, t)
        end = horizon_s if cut else self.clock.now()
        if self.kv_events is not None:
            self.kv_events.close()
        if self.client is not None:
            self.client.close_all()
        return RunResult(
            self.records,
            self.engines,
            end,
            [e.name for e in self.endpoints],
            kv_events=self.kv_events is not None,
            connections=self.client,
            sharing=self._sharing_counters(),
            latency_models=self._latency_models(),
        )

    def _latency_models(self) -> LatencyModels:
        if self.training is not None:
            return "shared"
        return "own" if self.predictors else "none"

    def _sharing_counters(self) -> dict[str, int] | None:
        """What shared replicas exchanged: the channel's, and the training service's."""
        counters = self.group.counters()
        if self.training is not None:
            counters = {**(counters or {}), **self.training.counters()}
        return counters

    def _handle(self, kind: int, payload: Any, t: float) -> None:
        if kind == self._STEP:
            self._step(payload, t)
        elif kind == self._ARRIVAL:
            self._arrive(payload, t)
        elif kind == self._KV_EVENTS:
            assert self.kv_events is not None
            self.kv_events.deliver(*payload)
        elif kind == self._SEND:
            self._send(*payload)
        elif kind == self._SCRAPE:
            self._scrape(payload, t)
            if payload == 0:
                for predictor in self.predictors:
                    predictor.maybe_retrain(t)  # training takes no simulated time
            for gateway in self.gateways:
                self._release(gateway, t)  # fresh metrics may show room for waiting requests
            if self._busy():
                self._push(t + self.spec.scrape_interval_s, self._SCRAPE, payload)
        elif kind == self._SHARE_TICK:
            f, g = payload
            period = self.group.tick(f, g, t)
            if self._busy():
                self._push(t + period, self._SHARE_TICK, payload)
        elif kind == self._SHARE:
            self.group.deliver(payload, t)
        else:
            gateway = self.gateways[payload]
            gateway.expiry_at = None
            gateway.director.expire(t)
            self._arm_expiry(gateway)

    def _busy(self) -> bool:
        """Scrapes and share ticks continue while anything can still happen."""
        return bool(self._inflight) or self._work_events > 0 or self.group.queued()

    # ------------------------------------------------------------------ handlers

    def _arrive(self, spec: RequestSpec, now: float) -> None:
        if self._sender is None:
            self._send(spec, now, None)
            return
        connection = self._sender.arrive(spec, now)
        if connection is not None:
            self._send(spec, now, connection)

    def _hang_up(self, connection: Connection, now: float) -> None:
        """``connection``'s response is complete: it serves the longest-waiting request,
        or goes idle (closes, without keep-alive)."""
        assert self._sender is not None
        waiting = self._sender.hang_up(connection, now)
        if waiting is not None:
            # An event, not a call: a refused request would otherwise recurse through here.
            self._push(now, self._SEND, waiting)

    def _send(self, spec: RequestSpec, now: float, connection: Connection | None) -> None:
        """The request the client sent at ``now`` (on ``connection``) reaches the gateway
        (the clock may be later: it waited for the connection)."""
        record = RequestRecord(spec, now)
        self.records.append(record)
        raw = orjson.dumps(spec.body())
        headers = spec.all_headers()
        request_id = f"req-{next(self._ids)}"
        self._bodies[request_id] = (raw, spec.kind == "chat")
        g = self.group.spreader.pick(spec.session)
        gateway = self.gateways[g]
        if connection is not None:  # before parsing: a refusal must hang it up too
            self._on_connection[record] = connection
        try:
            parsed = parse_request(spec.kind, raw, headers)
            subset = None
            if connection is not None and self.client is not None and self.client.settings.pinned:
                subset = (gateway.endpoints[connection.backend].address,)
            admitted = gateway.director.admit(parsed, request_id, headers, subset)
            result = gateway.director.submit(admitted, Queued(self, g, record, raw))
        except GatewayError as exc:
            self._bodies.pop(request_id, None)
            self._refused(record, exc, self.clock.now())
            return
        if isinstance(result, QueueItem):
            gateway.queued += 1
            self._arm_expiry(gateway)
        else:
            self._start(g, record, raw, result, self.clock.now())

    def _refused(self, record: RequestRecord, error: GatewayError, now: float) -> None:
        record.status, record.reason = error.status, error.reason
        self._follow(record, now, None)

    def left_queue(self, gateway: int, record: RequestRecord, raw: bytes, d: Dispatch) -> None:
        """A request waiting in ``gateway``'s flow control was dispatched (its ticket)."""
        self.gateways[gateway].queued -= 1
        self._start(gateway, record, raw, d, self.clock.now())

    def refused_from_queue(
        self, gateway: int, record: RequestRecord, request_id: str, error: GatewayError
    ) -> None:
        """A request waiting in ``gateway``'s flow control was refused (its ticket)."""
        self._bodies.pop(request_id, None)
        self.gateways[gateway].queued -= 1
        self._refused(record, error, self.clock.now())

    def _release(self, gateway: GatewayReplica, now: float) -> None:
        if gateway.queued:
            gateway.director.pump(now)
            self._arm_expiry(gateway)

    def _arm_expiry(self, gateway: GatewayReplica) -> None:
        deadline = gateway.director.next_deadline()
        if deadline is not None and (gateway.expiry_at is None or deadline < gateway.expiry_at):
            gateway.expiry_at = deadline
            self._push(deadline, self._EXPIRE, gateway.number)

    def _start(
        self, g: int, record: RequestRecord, raw: bytes, dispatch: Dispatch, now: float
    ) -> None:
        """Hand a scheduled request to its engine."""
        spec = record.spec
        request_id = dispatch.request.request_id
        self._bodies.pop(request_id, None)
        index = self._index[dispatch.endpoint.name]
        try:
            seq = self._sequence(dispatch, raw, request_id, now, index, spec.kind == "chat")
        except ApiError as exc:
            dispatch.finish(now, ok=False)
            record.status, record.reason = exc.status, "engine-rejected"
            self._follow(record, now, None)
            return
        record.endpoint = index
        outcome = dispatch.state.get(PREDICTION_OUTCOME)
        record.fell_back = outcome is not None and outcome.fallback
        record.prompt_tokens = seq.prompt_tokens
        record.prompt_bytes = seq.prompt
        record.servable_tokens = servable_tokens(seq, self.engines, self.spec.profile.block_size)
        self._inflight[request_id] = (dispatch, record, g)
        self.engines[index].add(seq)
        if not self._stepping[index]:
            self._stepping[index] = True
            self._push(now, self._STEP, index)

    def _sequence(
        self, dispatch: Dispatch, raw: bytes, request_id: str, now: float, index: int, chat: bool
    ) -> Sequence:
        """The sequence the model server would create from the (rewritten) body."""
        body = dispatch.body if dispatch.body is not None else raw
        return self._engine_sequence(
            body, chat, dispatch.request.target_model, request_id, now, index
        )

    def _engine_sequence(
        self, body: bytes, chat: bool, target: str, request_id: str, now: float, index: int
    ) -> Sequence:
        engine = self.engines[index]
        return engine_sequence(
            body, chat, target, request_id, now, engine, self.spec.model, self.spec.seed
        )

    def _step(self, index: int, now: float) -> None:
        engine = self.engines[index]
        previous = self._pending[index]
        if previous is not None:
            self._pending[index] = None
            # The replicas relaying these tokens (before _deliver forgets finished ones).
            relays = {e[2] for q in previous.emitted if (e := self._inflight.get(q.request_id))}
            self._deliver(previous, now)
            for g in relays:
                # Each relays its tokens as stream chunks, each marking the endpoint's
                # token time (Dispatch.mark_token); one call stands for all of them, as
                # they arrive at the same instant.
                self.gateways[g].endpoints[index].inflight.token(now)
        if not engine.has_work():
            self._stepping[index] = False
            return
        result = engine.step(now)
        if self.kv_events is not None:
            # vLLM publishes a step's events once its results are out: at the step's end
            published = now + result.duration
            payload = self.kv_events.take(index, published)
            if payload is not None:
                self._push(published + self.kv_events.delay_s, self._KV_EVENTS, (index, payload))
        if result.idle:
            self._stepping[index] = False  # woken again by the next arrival
            return
        self._pending[index] = result
        self._next_step_at[index] = now + result.duration
        self._push(now + result.duration, self._STEP, index)

    def _deliver(self, result: StepResult, now: float) -> None:
        inflight = self._inflight
        for seq in result.emitted:
            if seq.num_output == 1:
                entry = inflight.get(seq.request_id)
                if entry is not None:
                    entry[1].first_token = now
                    entry[0].mark_first_byte(now)
        finished: set[int] = set()
        for seq in result.finished:
            entry = inflight.pop(seq.request_id, None)
            if entry is None:
                continue
            dispatch, record, g = entry
            record.finish = now
            record.status = 200
            record.output_tokens = seq.num_output
            record.cached_tokens = max(0, seq.num_cached_prompt_tokens)
            if record.first_token < 0:
                record.first_token = seq.first_token_time
            dispatch.finish(now, seq.num_output)
            for hook in self.on_complete:
                hook(record, dispatch)
            finished.add(g)
            self._follow(record, now, self._reply(record, seq))
        for g in sorted(finished):
            # their places may be someone else's now (each replica sees its own finish)
            self._release(self.gateways[g], now)

    def _follow(self, record: RequestRecord, now: float, reply: str | None) -> None:
        connection = self._on_connection.pop(record, None)
        if connection is not None:
            self._hang_up(connection, now)
        for t, spec in self._workload.follow_up(record.spec, now, reply):
            self._push(t, self._ARRIVAL, spec)

    def _reply(self, record: RequestRecord, seq: Sequence) -> str:
        if record.spec.kind != "chat" and record.spec.session < 0:
            return ""  # only conversations send the reply back
        record.reply = seq.output_text()
        return record.reply

    def _scrape(self, index: int, now: float) -> None:
        """Engine ``index``'s metrics, as every replica scrapes them (one snapshot)."""
        metrics = engine_metrics(self.engines[index], now, bool(self.spec.adapters))
        for gateway in self.gateways:
            endpoint = gateway.endpoints[index]
            endpoint.metrics = metrics
            endpoint.inflight.scraped()


__all__ = ["ClusterSimulation"]
