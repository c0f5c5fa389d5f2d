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

Network time between gateway and engines is taken as zero.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from sluicegate.api.loader import Config, build_config
from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.bench.connections import ClientConnections, Connection, ConnectionPool
from sluicegate.bench.des_kvevents import DEFAULT_DELAY_S, KVEventDelivery
from sluicegate.bench.oracle import OraclePredictor
from sluicegate.bench.workloads import RequestSpec, Timed, Workload
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import EngineMetrics, Hardware, ServedModels
from sluicegate.datalayer.kvevents.service import KV_EVENTS_SERVICE
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import POOL_ANNOTATION, build_flow_control
from sluicegate.framework import (
    PREDICTION_OUTCOME,
    PREDICTOR_SERVICE,
    LLMRequest,
    PluginContext,
    QueueItem,
)
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.scheduling.config import build_scheduler
from sluicegate.sim.api import ApiError, parse_generate
from sluicegate.sim.engine import Engine, Sequence, StepResult, new_sequence
from sluicegate.sim.profiles import EngineProfile
from sluicegate.tokens import block_hashes

POOL = "sim-pool"
PRECISE_PRODUCER = "precise-prefix-cache-producer"
"""The plugin type that reads the ``kv-events`` service: runs configuring it get KV
events unless :attr:`ClusterSpec.kv_events` says otherwise."""


class TrainedPredictor(LatencyPredictor, Protocol):
    """A latency predictor the simulation trains on its virtual clock (the
    :class:`~sluicegate.latency.inprocess.InProcessPredictor` API the run loop uses)."""

    def maybe_retrain(self, now: float | None = None) -> bool: ...


PredictorFactory = Callable[[ManualClock, PredictorSettings], TrainedPredictor]
"""Builds the ``model`` predictor of a run from its clock and settings."""


@dataclass(slots=True, eq=False)
class RequestRecord:
    """What happened to one request. Times are simulated seconds from the start."""

    spec: RequestSpec
    arrival: float
    endpoint: int = -1
    first_token: float = -1.0
    finish: float = -1.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    status: int = 0
    """200 completed; the gateway's status when it answered itself (429, 503, ...)."""
    reason: str = ""
    prompt_bytes: bytes = b""
    reply: str = ""
    servable_tokens: int = -1
    """Prompt tokens the best-placed engine held in its prefix cache when the request was
    dispatched (what an oracle knowing every cache could have reused), −1 if never
    dispatched."""
    fell_back: bool = False
    """Scheduled on the heuristic fallback although predictions were wanted (models warming
    up, or no usable prediction)."""

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.finish >= 0

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.finish - self.first_token) / (self.output_tokens - 1)


@dataclass(slots=True)
class ClusterSpec:
    """The simulated pool and the gateway in front of it."""

    profile: EngineProfile
    replicas: int
    picker: EndpointPickerConfig
    profiles: tuple[EngineProfile, ...] = ()
    """One per replica for a pool mixing hardware (empty: every replica runs
    ``profile``); each endpoint carries its profile's class and price as its Hardware."""
    model: str = "model"
    adapters: tuple[str, ...] = ()
    extra_docs: list[dict[str, Any]] = field(default_factory=list)
    """More configuration documents (InferenceModels, InferenceObjectives...)."""
    scrape_interval_s: float = 0.05
    staleness_s: float = 1.0
    seed: int = 0
    flow_control: bool = False
    """Queue requests in the gateway while the pool is saturated (the pool annotation)."""
    predictor: Literal["none", "model", "oracle"] = "none"
    """The ``latency-predictor`` service: none, online-trained models, or the oracle."""
    predictor_settings: PredictorSettings = field(default_factory=PredictorSettings)
    """Training schedule of the ``model`` predictor (intervals in simulated seconds)."""
    predictor_factory: PredictorFactory | None = None
    """Makes the ``model`` predictor (None: a :class:`HardwareAwarePredictor`, which is
    one :class:`~sluicegate.latency.inprocess.InProcessPredictor` on a pool of one class);
    the accuracy benchmark passes one that also records what was predicted at dispatch."""
    kv_events: bool | None = None
    """Deliver the engines' KV-cache events to a precise index (``kv-events`` service);
    None: when the picker configures a ``precise-prefix-cache-producer``."""
    kv_event_delay_s: float = DEFAULT_DELAY_S
    """Seconds from the end of the engine step that produced a batch of KV events to
    its application to the index (see :mod:`sluicegate.bench.des_kvevents`)."""
    connections: ClientConnections | None = None
    """The client's connections to a per-connection balancer (the lab-only ``kube-service``
    baseline): every request goes to its connection's backend, drawn uniformly at random
    per new connection, through a one-address subset hint. None: the gateway routes each
    request."""


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    engines: list[Engine]
    end_time: float
    endpoint_names: list[str]
    kv_events: bool = False
    """The engines' KV events fed a precise index."""
    connections: ConnectionPool | None = None
    """The client's connections, when the run modelled them."""


def replica_profiles(spec: ClusterSpec) -> list[EngineProfile]:
    """Each replica's engine profile."""
    if spec.profiles and len(spec.profiles) != spec.replicas:
        raise ValueError(f"{len(spec.profiles)} profiles for {spec.replicas} replicas")
    return list(spec.profiles) or [spec.profile] * spec.replicas


def _hardware(profile: EngineProfile) -> Hardware:
    return Hardware(profile.accelerator, profile.cost_per_hour)


def _pool_config(spec: ClusterSpec) -> Config:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {
                "name": POOL,
                "annotations": {POOL_ANNOTATION: "true"} if spec.flow_control else {},
            },
            "spec": {
                "targetPorts": [{"number": 8000}],
                "endpoints": [
                    {
                        "address": f"10.0.0.{i + 1}:8000",
                        "name": f"sim-{i}",
                        **({"accelerator": p.accelerator} if p.accelerator else {}),
                        **({"costPerHour": p.cost_per_hour} if p.cost_per_hour else {}),
                    }
                    for i, p in enumerate(replica_profiles(spec))
                ],
            },
        },
        *spec.extra_docs,
    ]
    config = build_config(docs, "<simulation>")
    config.picker = spec.picker
    return config


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
        self.engines = [Engine(p) for p in profiles]
        config = _pool_config(spec)
        self.datastore = Datastore()
        self.datastore.set_endpoints(
            POOL,
            [
                EndpointSpec(f"sim-{i}", f"10.0.0.{i + 1}", 8000, hardware=_hardware(p))
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
        if spec.connections is not None:
            # Its own stream, so that the policy's draws do not shift the backends'.
            rng = random.Random(f"connections-{spec.seed}")
            backends = spec.replicas if spec.connections.pinned else 1  # 1: the gateway
            self.client = ConnectionPool(spec.connections, backends, rng)
        self._on_connection: dict[RequestRecord, Connection] = {}
        self._waiting_clients: deque[tuple[RequestSpec, float]] = deque()
        """Requests (and when they were sent) waiting for a connection, oldest first."""
        self.on_complete: list[Callable[[RequestRecord, Dispatch], None]] = []
        """Hooks called when a request completes (e.g. latency-model training)."""

    # ------------------------------------------------------------------ predictors

    def _services(self, spec: ClusterSpec) -> dict[str, object]:
        services: dict[str, object] = {}
        if _wants_kv_events(spec):
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
        body = raw
        if request.target_model != request.model:
            payload = orjson.loads(raw)
            payload["model"] = request.target_model
            body = orjson.dumps(payload)
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
        if self.client is None:
            self._send(spec, now, None)
            return
        connection = self.client.acquire(now)
        if connection is None:
            self._waiting_clients.append((spec, now))
        else:
            self._send(spec, now, connection)

    def _hang_up(self, connection: Connection, now: float) -> None:
        """``connection``'s response is complete: it serves the longest-waiting request,
        or goes idle (closes, without keep-alive)."""
        assert self.client is not None
        if not self._waiting_clients:
            self.client.release(connection, now)
            return
        spec, sent = self._waiting_clients.popleft()
        if self.client.settings.keep_alive:
            self.client.handover(connection)
        else:
            self.client.release(connection, now)
            fresh = self.client.acquire(now)
            assert fresh is not None  # one was just closed
            connection = fresh
        # An event, not a call: a refused request would otherwise recurse through here.
        self._push(now, self._SEND, (spec, sent, connection))

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
        record.servable_tokens = self._servable_tokens(seq)
        self._inflight[request_id] = (dispatch, record)
        self.engines[index].add(seq)
        if not self._stepping[index]:
            self._stepping[index] = True
            self._push(now, self._STEP, index)

    def _servable_tokens(self, seq: Sequence) -> int:
        """The longest cached prefix of ``seq`` on any engine now, in tokens; counted as the
        engines count a hit (whole blocks, never the prompt's last token)."""
        size = self.spec.profile.block_size
        hashes = block_hashes(seq.prompt, size, seq.hash_seed)
        limit = (seq.prompt_tokens - 1) // size
        best = 0
        for engine in self.engines:
            if engine.profile.block_size == size:
                best = max(best, len(engine.pool.longest_cached_prefix(hashes, limit)))
        return best * size

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
        params = parse_generate(body, chat)
        engine = self.engines[index]
        lora = target if target != self.spec.model else None
        limit = min(engine.profile.max_model_len, engine.profile.kv_capacity_tokens)
        seq = new_sequence(
            request_id,
            params.prompt,
            arrival=now,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            max_model_len=limit,
            model=self.spec.model,
            lora=lora,
            cache_salt=params.cache_salt,
            seed=self.spec.seed,
        )
        if seq.prompt_tokens + seq.max_output_tokens > limit:
            raise ApiError(400, "request exceeds the model's context length")
        return seq

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
        engine = self.engines[index]
        endpoint = self.endpoints[index]
        lora = bool(self.spec.adapters)
        p = engine.profile
        endpoint.metrics = EngineMetrics(
            scraped_at=now,
            waiting=len(engine.waiting),
            running=len(engine.running),
            kv_usage=engine.pool.usage,
            running_loras=frozenset(engine.running_loras()) if lora else frozenset(),
            waiting_loras=frozenset(engine.waiting_loras()) if lora else frozenset(),
            max_loras=p.max_loras if lora else 0,
            block_size=p.block_size,
            num_gpu_blocks=p.num_gpu_blocks,
            prefix_cache_queries=engine.counters.prefix_cache_queries,
            prefix_cache_hits=engine.counters.prefix_cache_hits,
        )
        endpoint.inflight.scraped()


def _wants_kv_events(spec: ClusterSpec) -> bool:
    if spec.kv_events is not None:
        return spec.kv_events
    return any(p.type == PRECISE_PRODUCER for p in spec.picker.plugins)


__all__ = ["ClusterSimulation", "ClusterSpec", "RequestRecord", "RunResult", "Timed"]
