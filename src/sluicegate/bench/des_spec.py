"""What a discrete-event run is given and gives back (:mod:`sluicegate.bench.des`).

The simulated pool and the gateway in front of it (:class:`ClusterSpec`), the gateway
configuration built from it, what happened to each request (:class:`RequestRecord`, times
in simulated seconds) and to the run (:class:`RunResult`), and the protocol a latency
predictor trained on the virtual clock implements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sluicegate.api.loader import Config, build_config
from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.bench.connections import ClientConnections, ConnectionPool
from sluicegate.bench.des_kvevents import DEFAULT_DELAY_S
from sluicegate.bench.des_sharing import LatencyModels, ReplicaSettings
from sluicegate.bench.workloads import RequestSpec
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Hardware
from sluicegate.flowcontrol.config import POOL_ANNOTATION
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.sim.engine import Engine
from sluicegate.sim.profiles import EngineProfile

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
    decision_seed: int | None = None
    """Seed of the routing's own draws: the gateways' plugins (ties between equal scores,
    random picks; replica *g* adds *g* × ``SEED_STRIDE``) and the ``kube-service``
    baseline's choice of backend per connection; None: :attr:`seed`. Another decision seed
    routes the same arrivals, engines and sharing channel with other draws: the run-to-run
    noise of a scenario, apart from any change of policy."""
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
    gateways: ReplicaSettings = field(default_factory=ReplicaSettings)
    """The gateway replicas in front of the pool, how arrivals reach them and what they
    share (one replica by default; :mod:`sluicegate.bench.des_sharing`)."""

    @property
    def draws_seed(self) -> int:
        """The seed the routing's own draws start from: :attr:`decision_seed`, else
        :attr:`seed`."""
        return self.seed if self.decision_seed is None else self.decision_seed


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
    sharing: dict[str, int] | None = None
    """What shared gateway replicas exchanged (messages, copies delivered and lost,
    bytes, prefix records applied); None when they shared nothing."""
    latency_models: LatencyModels = "none"
    """Where the run's online-trained latency models came from (none: the policy has
    none)."""


def replica_profiles(spec: ClusterSpec) -> list[EngineProfile]:
    """Each replica's engine profile."""
    if spec.profiles and len(spec.profiles) != spec.replicas:
        raise ValueError(f"{len(spec.profiles)} profiles for {spec.replicas} replicas")
    return list(spec.profiles) or [spec.profile] * spec.replicas


def hardware(profile: EngineProfile) -> Hardware:
    """The endpoint hardware a replica of ``profile`` declares (class and price per hour)."""
    return Hardware(profile.accelerator, profile.cost_per_hour)


def pool_config(spec: ClusterSpec) -> Config:
    """The gateway configuration of a run: its InferencePool (one endpoint per replica,
    the flow-control annotation when asked), ``spec.extra_docs`` and ``spec.picker``."""
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


def wants_kv_events(spec: ClusterSpec) -> bool:
    """Whether a run delivers KV events: as ``spec.kv_events`` says, else when the picker
    configures a ``precise-prefix-cache-producer``."""
    if spec.kv_events is not None:
        return spec.kv_events
    return any(p.type == PRECISE_PRODUCER for p in spec.picker.plugins)


__all__ = [
    "POOL",
    "PRECISE_PRODUCER",
    "ClusterSpec",
    "PredictorFactory",
    "RequestRecord",
    "RunResult",
    "TrainedPredictor",
    "hardware",
    "pool_config",
    "replica_profiles",
    "wants_kv_events",
]
