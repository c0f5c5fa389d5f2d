"""The benchmark scenarios: published experiments, reproduced on the simulator.

Each scenario fixes a pool (engine profile × replicas, or replicas by profile for a mixed
pool), a workload, the load levels it
sweeps, how long each level runs, and the policies it compares by default. A ``quick``
variant of each runs in well under a minute (CI smoke tests).

Policies are scheduling configurations by name: the shipped presets (``round-robin``,
``random``, ``least-request``, ``default``, ``gie-v0.3``...) plus those added by later layers
(``predicted-latency``, ``predicted-latency-oracle``) and the lab-only baselines that are
not a gateway at all: ``kube-service``, a Kubernetes Service in front of the pool, which
balances the client's *connections* (:mod:`~sluicegate.bench.connections`; discrete-event
runs only).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.bench import sharegpt
from sluicegate.bench.cache_pressure import TenantChats
from sluicegate.bench.connections import ClientConnections
from sluicegate.bench.workloads import (
    ClosedLoop,
    OpenLoop,
    PriorityClass,
    RequestSpec,
    Sessions,
    Workload,
    length_mix,
    random_text,
    shared_prefix,
    sharegpt_first_turn,
    with_classes,
    with_slos,
)
from sluicegate.builtins import default_registry
from sluicegate.scheduling.config import load_preset, preset_names
from sluicegate.sim.profiles import EngineProfile, get_profile


class UnknownPolicyError(ValueError):
    pass


PredictorKind = Literal["none", "model", "oracle"]

# Policies beyond the presets: a preset run with a latency predictor service.
_PREDICTOR_POLICIES: dict[str, tuple[str, PredictorKind]] = {
    "predicted-latency-oracle": ("predicted-latency", "oracle"),
    "predicted-latency-precise": ("predicted-latency-precise", "model"),
}


# Lab-only baselines: no gateway decides; each request goes to the backend its client
# connection was given (through a one-address subset hint, so any picker does: ``random``).
# Their parameters, as overrides of the pseudo-plugin ``client``: ``maxConnections`` (0: no
# limit), ``idleTimeoutS``, ``keepAlive`` — e.g.
# ``kube-service:client.keepAlive=true&client.maxConnections=1000``. The same overrides on a
# gateway policy put that client in front of the gateway (its connections end there and the
# gateway routes each request), so that both arms of a comparison have one client.
_CONNECTION_BASELINES: dict[str, tuple[str, ClientConnections]] = {
    "kube-service": ("random", ClientConnections()),
}
_CLIENT = "client"
_CLIENT_PARAMETERS = {
    "maxConnections": "max_connections",
    "idleTimeoutS": "idle_timeout_s",
    "keepAlive": "keep_alive",
}


def client_connections(name: str) -> ClientConnections | None:
    """The client connections policy ``name`` runs with: a lab-only per-connection
    baseline's (pinned to backends), those its ``client.*`` overrides set on a gateway
    policy (to the gateway, which routes each request: the same client in front of both
    arms), or None (one connection per request to the gateway, never waiting)."""
    base, _, overrides = name.partition(":")
    items = _client_overrides(overrides, name)
    if base in _CONNECTION_BASELINES:
        settings = _CONNECTION_BASELINES[base][1]
    elif items:
        settings = ClientConnections(pinned=False)
    else:
        return None
    values: dict[str, Any] = {}  # YAML values, type-checked by ClientConnections
    for item in items:
        target, _, raw = item.partition("=")
        param = target.partition(".")[2]
        if param not in _CLIENT_PARAMETERS:
            raise UnknownPolicyError(
                f"policy {name!r}: {_CLIENT} has no parameter {param!r}; "
                f"parameters: {', '.join(_CLIENT_PARAMETERS)}"
            )
        values[_CLIENT_PARAMETERS[param]] = yaml.safe_load(raw)
    try:
        return replace(settings, **values)
    except (TypeError, ValueError) as exc:
        raise UnknownPolicyError(f"policy {name!r}: {exc}") from None


def _client_overrides(overrides: str, name: str) -> list[str]:
    items = [item for item in overrides.split("&") if item] if overrides else []
    return [item for item in items if item.partition(".")[0] == _CLIENT]


def is_lab_only(name: str) -> bool:
    """Whether the discrete-event lab alone runs ``name``: a baseline that is no gateway,
    or a policy with a modelled client (``client.*`` overrides)."""
    base, _, overrides = name.partition(":")
    return base in _CONNECTION_BASELINES or bool(_client_overrides(overrides, name))


def policy_config(name: str) -> tuple[EndpointPickerConfig, PredictorKind]:
    """The scheduling configuration a policy name stands for, and the latency predictor
    it runs with (``model``: trained online on the run's own traffic).

    A name may carry parameter overrides after the policy, ``POLICY:PLUGIN.PARAM=VALUE``
    (several joined by ``&``), where ``PLUGIN`` is a plugin's name or type (a type sets
    every plugin of it) and ``VALUE`` is YAML — e.g.
    ``predicted-latency:latency-scorer.headroomSelectionStrategy=least`` — so that two arms
    of a measurement differ in one setting and nothing else."""
    base, _, overrides = name.partition(":")
    if base in _CONNECTION_BASELINES:
        preset = _CONNECTION_BASELINES[base][0]
        config = load_preset(preset)
        predictor: PredictorKind = "none"
    elif base in _PREDICTOR_POLICIES:
        preset, predictor = _PREDICTOR_POLICIES[base]
        config = load_preset(preset)
    elif base in preset_names():
        config = load_preset(base)
        # Any preset that asks for predictions runs with the online-trained models.
        predictor = (
            "model"
            if any(p.type == "predicted-latency-producer" for p in config.plugins)
            else "none"
        )
    else:
        raise UnknownPolicyError(
            f"policy {base!r} is not available; available: {', '.join(available_policies())}"
        )
    client_connections(name)  # any client.* overrides, checked now
    rest = [i for i in overrides.split("&") if i and i.partition(".")[0] != _CLIENT]
    if rest:
        config = _with_overrides(config, "&".join(rest), name)
    return config, predictor


def _with_overrides(
    config: EndpointPickerConfig, overrides: str, name: str
) -> EndpointPickerConfig:
    """``config`` with the ``PLUGIN.PARAM=VALUE&...`` overrides of policy ``name``."""
    plugins = [spec.model_copy(deep=True) for spec in config.plugins]
    for item in overrides.split("&"):
        target, eq, raw = item.partition("=")
        plugin, dot, param = target.partition(".")
        if not eq or not dot or not plugin or not param:
            raise UnknownPolicyError(
                f"policy {name!r}: override {item!r} is not PLUGIN.PARAM=VALUE"
            )
        matched = [p for p in plugins if plugin in (p.name, p.type)]
        if not matched:
            known = ", ".join(sorted({p.ref for p in plugins}))
            raise UnknownPolicyError(
                f"policy {name!r}: no plugin named or typed {plugin!r}; plugins: {known}"
            )
        value = yaml.safe_load(raw)
        for spec in matched:
            spec.parameters[param] = value
            _check_parameters(spec.type, spec.ref, spec.parameters, name)
    return config.model_copy(update={"plugins": plugins})


def _check_parameters(type_name: str, ref: str, parameters: dict[str, Any], name: str) -> None:
    """Refuse an override the plugin's parameter model rejects (an unknown parameter, a
    value of the wrong type) now, not when the run reaches this policy."""
    registry = default_registry()
    try:
        registry.resolve(type_name).Parameters.model_validate(parameters)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'parameters'}: {err['msg']}"
            for err in exc.errors()
        )
        raise UnknownPolicyError(f"policy {name!r}: plugin {ref!r}: {problems}") from None


def check_policies(names: Sequence[str], extra: Collection[str] = ()) -> tuple[str, ...]:
    """``names`` unchanged if every one is a policy this build runs (with well-formed
    overrides) or one of ``extra`` (host-specific names, e.g. HTTP mode's peer routers);
    otherwise :class:`UnknownPolicyError` naming the bad one and the known ones. An empty
    or repeated name is refused too: a comparison must run what was asked, all of it."""
    if not names:
        raise UnknownPolicyError("no policy given")
    seen: set[str] = set()
    known = sorted({*available_policies(), *extra})
    for name in names:
        if not name:
            raise UnknownPolicyError("an empty policy name (a stray comma in --policies?)")
        if name in seen:
            raise UnknownPolicyError(f"policy {name!r} is given twice")
        seen.add(name)
        if name in extra:
            continue
        if not is_available(name):
            raise UnknownPolicyError(
                f"unknown policy {name.partition(':')[0]!r}; known: {', '.join(known)}"
            )
        policy_config(name)  # a malformed override fails now, before any run
    return tuple(names)


def is_available(name: str) -> bool:
    """Whether ``name`` (with any overrides) is a policy this build can run."""
    return name.partition(":")[0] in available_policies()


def available_policies() -> list[str]:
    return sorted({*preset_names(), *_PREDICTOR_POLICIES, *_CONNECTION_BASELINES})


WorkloadFactory = Callable[[float, float, int], Workload]
"""(load level, duration in s, seed) → workload. The load level is req/s, sessions/s or a
concurrency, as the scenario's ``load_unit`` says."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    profile: EngineProfile
    replicas: int
    model: str
    workload: WorkloadFactory
    levels: tuple[float, ...]
    duration_s: float
    policies: tuple[str, ...]
    load_unit: str = "req/s"
    goals: tuple[str, ...] = ()
    published: str = ""
    extra_docs: tuple[dict[str, Any], ...] = ()
    adapters: tuple[str, ...] = ()
    flow_control: tuple[bool, ...] = (False,)
    """Flow control settings compared by default (off, on, or both)."""
    dataset: str | None = None
    """``"sharegpt"`` when the workload replays ShareGPT: results say how much of the
    packaged file was recovered."""
    drain_factor: float = 4.0
    """The run continues after the last arrival for up to this many durations."""
    quick: dict[str, Any] = field(default_factory=dict)
    """Overrides for ``--quick``: replicas, levels, duration_s."""
    mix: tuple[tuple[EngineProfile, int], ...] = ()
    """A pool mixing hardware: replicas by profile, in endpoint order (``profile`` is then
    the first, ``replicas`` their sum); empty: ``replicas`` × ``profile``."""

    def __post_init__(self) -> None:
        if self.mix and sum(n for _, n in self.mix) != self.replicas:
            raise ValueError(f"scenario {self.name}: replicas must be the sum of mix's counts")

    def quick_variant(self) -> Scenario:
        return replace(self, **self.quick, quick={})

    def replica_profiles(self) -> tuple[EngineProfile, ...]:
        """Each replica's profile for a mixed pool (empty: all run ``profile``)."""
        return tuple(p for p, n in self.mix for _ in range(n))

    def mix_description(self) -> list[dict[str, Any]]:
        """The mix as results record it: profile, replicas, class and price of each."""
        return [
            {
                "profile": p.name,
                "replicas": n,
                "accelerator": p.accelerator,
                "cost_per_hour": p.cost_per_hour,
            }
            for p, n in self.mix
        ]


def _sharegpt_sweep() -> Scenario:
    model = "meta-llama/Llama-2-7b-hf"

    def workload(qps: float, duration: float, seed: int) -> Workload:
        return OpenLoop(qps, duration, sharegpt_first_turn(model), seed)

    return Scenario(
        name="sharegpt-sweep",
        description="GIE's launch experiment: 10 × Llama-2-7B on H100, ShareGPT, 100→1000 QPS",
        profile=get_profile("llama2-7b-h100"),
        replicas=10,
        model=model,
        workload=workload,
        levels=(100, 200, 300, 400, 500, 600, 700, 800, 900, 1000),
        duration_s=120.0,
        policies=("round-robin", "default", "predicted-latency", "gie-v0.3"),
        dataset="sharegpt",
        # The published run's traffic was Critical (GIE v0.3.0's sample InferenceModel for
        # the base model, config/manifests/inferencemodel.yaml at tag v0.3.0): the
        # ``gie-v0.3`` tree sends only Critical requests down its low-latency branch.
        # Priority 100 changes nothing for the other policies (flow control off: only
        # a negative priority is ever shed).
        extra_docs=(
            {
                "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
                "kind": "InferenceModel",
                "metadata": {"name": "base-model"},
                "spec": {
                    "modelName": model,
                    "criticality": "Critical",
                    "poolRef": {"name": "sim-pool"},
                },
            },
        ),
        goals=(
            "from 400 QPS up, p90 TPOT and p90 E2E of `default` ≤ 0.7 × `round-robin`'s at "
            "equal or higher throughput",
            "`predicted-latency` at least as good as `default`",
            "`gie-v0.3` ≤ 0.8 × `round-robin`'s p90 TPOT (and NTPOT) from 500 QPS and ≤ 0.9 × "
            "its p90 E2E from 400 QPS, at ≥ 0.98 × its throughput",
        ),
        published="Gateway API Inference Extension launch blog (2025-06-05): comparable "
        "throughput; much lower p90 per-output-token latency at ≥ 500 QPS and lower p90 "
        "end-to-end latency beyond 400–500 QPS (figures only).",
        quick={"replicas": 3, "levels": (60.0, 120.0), "duration_s": 10.0},
    )


# The published per-pod KV size of the prefix-cache experiment (Qwen-32B, 2 × H100):
# 307,328 tokens = 19,208 blocks of 16 (llm-d blog "KV-Cache Wins You Can See", 2025-09-24,
# https://llm-d.ai/blog/kvcache-wins-you-can-see).
_PREFIX_KV_BLOCKS = 307_328 // 16


def _shared_prefix() -> Scenario:
    model = "meta-llama/Llama-3.1-8B"
    profile = replace(
        get_profile("llama3.1-8b-h100"),
        num_gpu_blocks=_PREFIX_KV_BLOCKS,
        name="llama3.1-8b-h100-307k",
    )

    def workload(qps: float, duration: float, seed: int) -> Workload:
        return OpenLoop(qps, duration, shared_prefix(model, 150, 5, 6000, 1200, 1000, seed), seed)

    return Scenario(
        name="shared-prefix",
        description="150 groups × 5 prompts, 6,000-token shared prefix, 1,200-token "
        "question, 1,000-token output, on 8 replicas",
        profile=profile,
        replicas=8,
        model=model,
        workload=workload,
        levels=(3, 10, 20, 40, 60),
        duration_s=60.0,
        policies=("random", "round-robin", "default", "precise-prefix"),
        goals=(
            "approximate prefix routing (`default`) ≥ 1.9 × `random` output tokens/s",
            "precise prefix routing (`precise-prefix`) ≥ 1.9 × `random` (published 1.97×)",
        ),
        published='llm-d "KV-Cache Wins You Can See" (2025-09-24), 8 × 2 H100, Qwen-32B: '
        "output 8,730 / 6,944 / 4,429 tok/s for precise / approximate / random routing.",
        drain_factor=3.0,
        quick={"replicas": 4, "levels": (4.0,), "duration_s": 10.0},
    )


def _shared_prefix_qwen32b() -> Scenario:
    """``shared-prefix`` on the published pool: Qwen-32B on 2 × H100 per replica."""
    base = _shared_prefix()
    return replace(
        base,
        name="shared-prefix-qwen32b",
        description="150 groups × 5 prompts, 6,000-token shared prefix, 1,200-token "
        "question, 1,000-token output, on 8 replicas of Qwen2.5-32B on 2 × H100 (TP 2)",
        profile=get_profile("qwen2.5-32b-2xh100-tp2"),
        model="Qwen/Qwen2.5-32B",
        workload=lambda qps, duration, seed: OpenLoop(
            qps, duration, shared_prefix("Qwen/Qwen2.5-32B", 150, 5, 6000, 1200, 1000, seed), seed
        ),
        # the published pool peaks near 8.7 req/s of 1,000-token answers (8,730 tok/s)
        levels=(5, 10, 15),
        policies=("random", "default", "precise-prefix"),
        quick={"replicas": 2, "levels": (1.0,), "duration_s": 10.0},
    )


def _multi_turn_chat() -> Scenario:
    model = "meta-llama/Meta-Llama-3-8B"

    def workload(rate: float, duration: float, seed: int) -> Workload:
        return Sessions(
            sharegpt.multi_turn(),
            rate,
            duration,
            model,
            think_s=2.0,
            max_output_tokens=1024,
            seed=seed,
        )

    return Scenario(
        name="multi-turn-chat",
        description="ShareGPT conversations replayed turn by turn with the generated "
        "replies in the history, 4 × Llama-3-8B on H100",
        profile=get_profile("llama3-8b-h100"),
        replicas=4,
        model=model,
        workload=workload,
        levels=(2, 4, 8),
        duration_s=120.0,
        load_unit="sessions/s",
        dataset="sharegpt",
        policies=("round-robin", "least-request", "default"),
        goals=(
            "prefix-cache hit rate ≥ 90 % of one infinitely large server's",
            "busiest replica's work ≤ 1.3 × the least busy one's",
        ),
        quick={"levels": (2.0,), "duration_s": 10.0},
    )


# Objectives of the mixed-priority scenarios: llm-d-benchmark's priority-mix values
# (critical 100, normal 0, batch −10;
# https://github.com/llm-d/llm-d-benchmark/blob/8bc9f1dd/workload/profiles/priority-mix/priority_mix.yaml.in).
OBJECTIVES: tuple[dict[str, Any], ...] = tuple(
    {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name},
        "spec": {"priority": priority, "poolRef": {"name": "sim-pool"}},
    }
    for name, priority in (("critical", 100), ("standard", 0), ("batch", -10))
)


def _slo_mixed() -> Scenario:
    model = "meta-llama/Meta-Llama-3-8B"
    classes = (
        PriorityClass("Standard", 0.7, objective="standard"),
        PriorityClass("Sheddable", 0.3, objective="batch"),
    )

    def workload(qps: float, duration: float, seed: int) -> Workload:
        make = length_mix(model, long_share=0.2, long_tokens=(2000, 6000))
        return OpenLoop(qps, duration, with_slos(with_classes(make, classes), 500, 50), seed)

    return Scenario(
        name="slo-mixed",
        description="short chat and long documents with TTFT/TPOT SLOs (500/50 ms), 30 % "
        "sheddable, near saturation, 4 × Llama-3-8B on H100",
        profile=get_profile("llama3-8b-h100"),
        replicas=4,
        model=model,
        workload=workload,
        # This mix saturates the pool between 85 and 100 req/s (measured on this
        # scenario): the SLOs start to bind just below it and shedding matters above it.
        levels=(70, 85, 100),
        duration_s=120.0,
        policies=("default", "predicted-latency", "predicted-latency-oracle"),
        extra_docs=OBJECTIVES,
        goals=("SLO attainment of `predicted-latency` ≥ 20 points above `default`",),
        quick={"levels": (40.0,), "duration_s": 10.0},
    )


def _priority_overload() -> Scenario:
    base, adapter = "meta-llama/Meta-Llama-3-8B", "food-review-lora"
    docs = [
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceModel",
            "metadata": {"name": name},
            "spec": {
                "modelName": public,
                "criticality": crit,
                "poolRef": {"name": "sim-pool"},
                "targetModels": [{"name": target}],
            },
        }
        for name, public, crit, target in (
            ("critical-chat", "critical-chat", "Critical", base),
            ("food-review", "food-review", "Standard", adapter),
            ("batch-summaries", "batch-summaries", "Sheddable", base),
        )
    ]
    classes = (
        PriorityClass("Critical", 60, model="critical-chat"),
        PriorityClass("Standard", 60, model="food-review"),
        PriorityClass("Sheddable", 20, model="batch-summaries"),
    )

    def workload(concurrency: float, duration: float, seed: int) -> Workload:
        import random as _random

        shared = {
            c.name: random_text(_random.Random(seed + i), 1000) for i, c in enumerate(classes)
        }

        def make(i: int, rng: _random.Random) -> RequestSpec:
            return RequestSpec(
                "completions",
                base,
                rng.randint(500, 3000),
                prompt=f"{i}: " + random_text(rng, 3000),
            )

        classed = with_classes(make, classes)

        def with_prefix(i: int, rng: _random.Random) -> RequestSpec:
            spec = classed(i, rng)
            spec.prompt = shared[spec.klass] + "\n" + spec.prompt
            return spec

        return ClosedLoop(int(concurrency), duration, with_prefix, seed=seed)

    return Scenario(
        name="priority-overload",
        description="two models on one pool at full load — Critical base model and "
        "Standard LoRA adapter, 60 streams each, plus 20 Sheddable streams; ~4,000-token "
        "prompts with a 1,000-token shared prefix, outputs up to 3,000 tokens; 5 × "
        "Llama-3-8B on A100 40GB",
        profile=get_profile("llama3-8b-a100-40gb"),
        replicas=5,
        model=base,
        workload=workload,
        levels=(140,),
        # A stream's request lasts about a minute (up to 3,000 output tokens): ten minutes
        # of arrivals make the throughput comparison a steady-state one, not a warm-up's.
        duration_s=600.0,
        load_unit="concurrent streams",
        policies=("priority-isolation",),
        flow_control=(False, True),
        extra_docs=tuple(docs),
        adapters=(adapter,),
        goals=(
            "with flow control on: Critical mean TTFT ≤ 30 % of Standard's",
            "Critical failures zero; total throughput within 5 % of flow control off",
        ),
        published="A public flow-control guide: Critical mean TTFT 50 % lower than "
        "Standard, 96 % fewer failed requests.",
        drain_factor=1.0,
        quick={"levels": (28.0,), "duration_s": 20.0, "replicas": 2, "drain_factor": 3.0},
    )


def _cache_pressure() -> Scenario:
    model = "meta-llama/Meta-Llama-3-8B"
    profile = get_profile("llama3-8b-a100-40gb")

    def workload(rate: float, duration: float, seed: int) -> Workload:
        return TenantChats(rate, duration, model, seed)

    return Scenario(
        name="cache-pressure",
        description="300 tenants' 2,000–5,000-token system prompts, Zipf (s = 1) popular, "
        "in 2–5-turn chats; the system prompts alone are ~2 × the fleet's KV cache; "
        "4 × Llama-3-8B on A100 40GB",
        profile=profile,
        replicas=4,
        model=model,
        workload=workload,
        # measured on this scenario: light load, near saturation (TTFT p90 under 0.5 s),
        # and beyond it (queues of seconds)
        levels=(4.0, 8.0, 10.0),
        duration_s=120.0,
        load_unit="sessions/s",
        policies=("random", "default", "precise-prefix", "precise-prefix-speculative"),
        goals=(
            "`precise-prefix` TTFT p90 ≤ 0.6 × `default`'s and output tokens/s ≥ 1.2 ×",
            "`precise-prefix` prompt tokens served from cache ≥ 95 % of the servable",
        ),
        drain_factor=2.0,
        quick={"replicas": 2, "levels": (2.0,), "duration_s": 10.0},
    )


def _heterogeneous_pool() -> Scenario:
    model = "meta-llama/Meta-Llama-3-8B"
    base = _slo_mixed()
    h100, a100 = get_profile("llama3-8b-h100"), get_profile("llama3-8b-a100")
    return replace(
        base,
        name="heterogeneous-pool",
        description="slo-mixed (short chat and long documents, TTFT/TPOT SLOs 500/50 ms, "
        "30 % sheddable) on a mixed pool: 2 × Llama-3-8B on H100 + 4 on A100",
        profile=h100,
        replicas=6,
        mix=((h100, 2), (a100, 4)),
        model=model,
        # Measured on this scenario (seed 0, 30 s): at 30 req/s every policy meets nearly
        # all SLOs (room to choose cheap hardware); `default`'s attainment falls below
        # 95 % between 60 and 80 req/s (the SLOs bind); at 100 req/s the mix is saturated
        # (`default` sheds).
        levels=(30, 60, 80, 100),
        duration_s=30.0,
        policies=(
            "round-robin",
            "default",
            "predicted-latency",
            "predicted-latency-pool",
            "cost-aware",
        ),
        goals=(
            "hardware-aware `predicted-latency` ≥ 20 points SLO attainment above `default` "
            "and ≥ 10 above `predicted-latency-pool` where SLOs bind",
            "`cost-aware` within 3 points of `predicted-latency` attainment at ≥ 15 % lower "
            "cost per 1M output tokens",
        ),
        quick={
            "levels": (20.0,),
            "duration_s": 10.0,
            "replicas": 3,
            "mix": ((h100, 1), (a100, 2)),
        },
    )


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "sharegpt-sweep": _sharegpt_sweep,
    "shared-prefix": _shared_prefix,
    "shared-prefix-qwen32b": _shared_prefix_qwen32b,
    "multi-turn-chat": _multi_turn_chat,
    "slo-mixed": _slo_mixed,
    "priority-overload": _priority_overload,
    "cache-pressure": _cache_pressure,
    "heterogeneous-pool": _heterogeneous_pool,
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]()
    except KeyError:
        known = ", ".join(SCENARIOS)
        raise ValueError(f"unknown scenario {name!r}; known: {known}") from None
