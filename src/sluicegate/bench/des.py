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
from sluicegate.bench.des_kvevents import KVEventDelivery
from sluicegate.bench.des_requests import (
    engine_metrics,
    engine_sequence,
    retarget,
    servable_tokens,
)
from sluicegate.bench.des_spec import (
    POOL,
    ClusterSpec,
    RequestRecord,
    RunResult,
    TrainedPredictor,
    hardware,
    pool_config,
    replica_profiles,
    wants_kv_events,
)
from sluicegate.bench.oracle import OraclePredictor
from sluicegate.bench.workloads import RequestSpec, Workload
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import ServedModels
from sluicegate.datalayer.kvevents.service import KV_EVENTS_SERVICE
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import build_flow_control
from sluicegate.framework import (
    PREDICTION_OUTCOME,
    PREDICTOR_SERVICE,
    LLMRequest,
    PluginContext,
    QueueItem,
)
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.scheduling.config import build_scheduler
from sluicegate.sim.api import ApiError
from sluicegate.sim.engine import Engine, Sequence, StepResult
from sluicegate.sim.prompt_tokens import load_shared


class _Queued:
    """The ticket of a request waiting in the simulated gateway's flow control."""

    __slots__ = ("cluster", "raw", "record")

    def __init__(self, cluster: ClusterSimulation, record: RequestRecord, raw: bytes) -> None:
        self.cluster = cluster
        self.record = record
        self.raw = raw

    def dispatched(self, item: QueueItem, dispatch: Dispatch) -> None:
        self.cluster._left_queue(self.record, self.raw, dispatch)

    def rejected(self, item: QueueItem, error: GatewayError) -> None:
        self.cluster._refused_from_queue(self.record, item.request.request_id, error)


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
        self.predictor: TrainedPredictor | None = None
        """The online-trained latency models (``predictor="model"``)."""
        self.kv_events: KVEventDelivery | None = None
        """The engines' KV events and the precise index they feed (when on)."""
        self._next_step_at = [0.0] * spec.replicas
        self._bodies: dict[str, tuple[bytes, bool]] = {}
        """Bodies of requests the director is deciding about (for the oracle)."""
        context = PluginContext(self.clock, spec.seed, services=self._services(spec))
        registry = default_registry()
        built = build_scheduler(config.picker, context, registry)
        self.datastore.pools[POOL].annotations = dict(config.pools[POOL].metadata.annotations)
        self.director = Director(
            self.datastore,
            built,
            ModelTable(config),
            self.clock,
            spec.staleness_s,
            flow=build_flow_control(config.picker, built.plugins, context, registry),
            # The scenarios send no prediction header and measure prediction-based routing:
            # stated here, so that they keep doing so whatever the setting's default.
            prediction_default=True,
        )
        self._expiry_at: float | None = None
        self._queued = 0
        """Requests waiting in flow control."""
        self._index = {e.name: i for i, e in enumerate(self.endpoints)}
        self._events: list[tuple[float, int, int, Any]] = []
        self._order = itertools.count()
        self._work_events = 0
        """Arrival and step events waiting in the queue."""
        self._stepping = [False] * spec.replicas
        self._pending: list[StepResult | None] = [None] * spec.replicas
        self._inflight: dict[str, tuple[Dispatch, RequestRecord]] = {}
        self._ids = itertools.count()
        self.records: list[RequestRecord] = []
        self.client: ConnectionPool | None = None
        """The client's connections (``spec.connections``); None: per-request routing."""
        self._sender: ClientSender[RequestSpec] | None = None
        if spec.connections is not None:
            # Its own stream, so that the policy's draws do not shift the backends'.
            rng = random.Random(f"connections-{spec.seed}")
            backends = spec.replicas if spec.connections.pinned else 1  # 1: the gateway
            self.client = ConnectionPool(spec.connections, backends, rng)
            self._sender = ClientSender(self.client)
        self._on_connection: dict[RequestRecord, Connection] = {}
        self.on_complete: list[Callable[[RequestRecord, Dispatch], None]] = []
        """Hooks called when a request completes (e.g. latency-model training)."""

    # ------------------------------------------------------------------ predictors

    def _services(self, spec: ClusterSpec) -> dict[str, object]:
        services: dict[str, object] = {}
        if wants_kv_events(spec):
            self.kv_events = KVEventDelivery(
                POOL,
                [e.name for e in self.endpoints],
                self.engines,
                self.clock,
                spec.kv_event_delay_s,
            )
            services[KV_EVENTS_SERVICE] = self.kv_events.service
        return services | self._predictor_service(spec)

    def _predictor_service(self, spec: ClusterSpec) -> dict[str, object]:
        if spec.predictor == "model":
            # Trained on the run's own traffic, in virtual time (see _scrape handling).
            factory = spec.predictor_factory or HardwareAwarePredictor
            self.predictor = factory(self.clock, spec.predictor_settings)
            return {PREDICTOR_SERVICE: self.predictor}
        if spec.predictor == "oracle":
            oracle: LatencyPredictor = OraclePredictor(
                self._engine_of, self._oracle_sequence, self.clock.now
            )
            return {PREDICTOR_SERVICE: oracle}
        return {}

    def _engine_of(self, endpoint: str) -> tuple[Engine, float]:
        i = self._index[endpoint]
        now = self.clock.now()
        return self.engines[i], self._next_step_at[i] if self._stepping[i] else now

    def _oracle_sequence(self, request: LLMRequest, endpoint: str) -> Sequence:
        raw, chat = self._bodies[request.request_id]
        body = raw if request.target_model == request.model else retarget(raw, request.target_model)
        return self._engine_sequence(
            body,
            chat,
            request.target_model,
            "oracle-what-if",
            self.clock.now(),
            self._index[endpoint],
        )

    # ------------------------------------------------------------------ events

    _ARRIVAL, _STEP, _SCRAPE, _EXPIRE, _KV_EVENTS, _SEND = 0, 1, 2, 3, 4, 5

    def _push(self, t: float, kind: int, payload: Any) -> None:
        if kind not in (self._SCRAPE, self._KV_EVENTS):  # these start no further work
            self._work_events += 1
        heapq.heappush(self._events, (t, next(self._order), kind, payload))

    def run(self, workload: Workload, horizon_s: float) -> RunResult:
        """Simulate until every request is done or the clock reaches ``horizon_s``."""
        self._workload = workload
        for t, spec in workload.initial():
            self._push(t, self._ARRIVAL, spec)
        interval = self.spec.scrape_interval_s
        for i in range(self.spec.replicas):
            self._scrape(i, 0.0)
            self._push(interval * (i + 1) / self.spec.replicas, self._SCRAPE, i)
        events = self._events
        cut = False
        while events:
            t, _, kind, payload = heapq.heappop(events)
            if t > horizon_s:
                cut = True  # the simulated span is the whole horizon
                break
            if kind not in (self._SCRAPE, self._KV_EVENTS):
                self._work_events -= 1
            self.clock.set(t)
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
                if payload == 0 and self.predictor is not None:
                    self.predictor.maybe_retrain(t)  # training takes no simulated time
                self._release(t)  # fresh metrics may show room for waiting requests
                if self._busy():
                    self._push(t + interval, self._SCRAPE, payload)
            else:
                self._expiry_at = None
                self.director.expire(t)
                self._arm_expiry()
        end = horizon_s if cut else self.clock.now()
        if self.kv_events is not None:
            self.kv_events.close()
        if self.client is not None:
            self.client.close_all()
        names = [e.name for e in self.endpoints]
        return RunResult(
            self.records,
            self.engines,
            end,
            names,
            kv_events=self.kv_events is not None,
            connections=self.client,
        )

    def _busy(self) -> bool:
        """Scrapes continue while anything can still happen."""
        return bool(self._inflight) or self._work_events > 0 or self._queued > 0

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
        if connection is not None:  # before parsing: a refusal must hang it up too
            self._on_connection[record] = connection
        try:
            parsed = parse_request(spec.kind, raw, headers)
            subset = None
            if connection is not None and self.client is not None and self.client.settings.pinned:
                subset = (self.endpoints[connection.backend].address,)
            admitted = self.director.admit(parsed, request_id, headers, subset)
            result = self.director.submit(admitted, _Queued(self, record, raw))
        except GatewayError as exc:
            self._bodies.pop(request_id, None)
            self._refused(record, exc, self.clock.now())
            return
        if isinstance(result, QueueItem):
            self._queued += 1
            self._arm_expiry()
        else:
            self._start(record, raw, result, self.clock.now())

    def _refused(self, record: RequestRecord, error: GatewayError, now: float) -> None:
        record.status, record.reason = error.status, error.reason
        self._follow(record, now, None)

    def _left_queue(self, record: RequestRecord, raw: bytes, dispatch: Dispatch) -> None:
        self._queued -= 1
        self._start(record, raw, dispatch, self.clock.now())

    def _refused_from_queue(
        self, record: RequestRecord, request_id: str, error: GatewayError
    ) -> None:
        self._bodies.pop(request_id, None)
        self._queued -= 1
        self._refused(record, error, self.clock.now())

    def _release(self, now: float) -> None:
        if self._queued:
            self.director.pump(now)
            self._arm_expiry()

    def _arm_expiry(self) -> None:
        deadline = self.director.next_deadline()
        if deadline is not None and (self._expiry_at is None or deadline < self._expiry_at):
            self._expiry_at = deadline
            self._push(deadline, self._EXPIRE, None)

    def _start(self, record: RequestRecord, raw: bytes, dispatch: Dispatch, now: float) -> None:
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
        self._inflight[request_id] = (dispatch, record)
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
            self._deliver(previous, now)
            if previous.emitted:
                # The gateway relays these tokens as stream chunks, each marking the
                # endpoint's token time (Dispatch.mark_token); one call stands for all of
                # them, as they arrive at the same instant.
                self.endpoints[index].inflight.token(now)
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
        finished = False
        for seq in result.finished:
            entry = inflight.pop(seq.request_id, None)
            if entry is None:
                continue
            dispatch, record = entry
            record.finish = now
            record.status = 200
            record.output_tokens = seq.num_output
            record.cached_tokens = max(0, seq.num_cached_prompt_tokens)
            if record.first_token < 0:
                record.first_token = seq.first_token_time
            dispatch.finish(now, seq.num_output)
            for hook in self.on_complete:
                hook(record, dispatch)
            finished = True
            self._follow(record, now, self._reply(record, seq))
        if finished:
            self._release(now)  # their places may be someone else's now

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
        endpoint = self.endpoints[index]
        endpoint.metrics = engine_metrics(self.engines[index], now, bool(self.spec.adapters))
        endpoint.inflight.scraped()


__all__ = ["ClusterSimulation"]
