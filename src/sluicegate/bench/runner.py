"""Running a scenario: every policy at every load level, side by side, same seed.

Each (policy, level) run starts from empty engines and sends the identical request stream
(same seed), so differences come from routing alone. Results follow the shape
``{"scenario", "mode", "seed", "runs": [{"policy", "qps", "concurrency", "metrics"}]}``;
a discrete-event run also records its gateway replicas (``gateway_replicas``,
``replica_state``, ``replica_spread``, ``replica_share_delay_ms``, ``replica_share_loss``,
``replica_models``: ``shared`` when online-trained latency models come from one training
service, ``own`` when each replica trains its own, ``none`` when the policy has none;
``replica_model_sync_ms``, the training service's sync period (None without one), and
``replica_sharing``: what shared replicas exchanged, the training service's counts
included); a document run with ``--decision-seed`` records it as ``decision_seed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sluicegate.bench import sharegpt
from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_kvevents import DEFAULT_DELAY_S
from sluicegate.bench.des_sharing import ReplicaSettings
from sluicegate.bench.des_spec import ClusterSpec, RequestRecord, RunResult
from sluicegate.bench.metrics import (
    by_accelerator,
    by_class,
    cost_summary,
    ideal_prefix_hit_rate,
    imbalance,
    replica_loads,
    summarize,
)
from sluicegate.bench.policies import client_connections, policy_config
from sluicegate.bench.scenario_spec import Scenario

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RunPlan:
    scenario: Scenario
    policies: tuple[str, ...]
    levels: tuple[float, ...]
    duration_s: float
    seed: int = 0
    flow_control: tuple[bool, ...] = (False,)
    """Run each policy with flow control off, on, or both."""
    decision_seed: int | None = None
    """Seed of the gateways' own random draws (None: :attr:`seed`); see
    :attr:`~sluicegate.bench.des_spec.ClusterSpec.decision_seed`."""
    kv_event_delay_s: float = DEFAULT_DELAY_S
    """Lag of the precise index behind the engines' caches (runs with KV events)."""
    gateways: tuple[ReplicaSettings, ...] = (ReplicaSettings(),)
    """The gateway replicas of each run (``--mode des``): every policy runs with each."""

    @property
    def count(self) -> int:
        return len(self.policies) * len(self.levels) * len(self.flow_control) * len(self.gateways)


def cluster_spec(
    scenario: Scenario,
    policy: str,
    seed: int,
    flow_control: bool = False,
    kv_event_delay_s: float = DEFAULT_DELAY_S,
    gateways: ReplicaSettings | None = None,
    decision_seed: int | None = None,
) -> ClusterSpec:
    """The simulated cluster of ``scenario`` routed by ``policy``; ``seed`` seeds the
    cluster's own randomness (the workload takes its seed separately), ``decision_seed``
    the gateways' draws (None: ``seed``)."""
    picker, predictor = policy_config(policy)
    return ClusterSpec(
        profile=scenario.profile,
        replicas=scenario.replicas,
        profiles=scenario.replica_profiles(),
        picker=picker,
        predictor=predictor,
        model=scenario.model,
        adapters=scenario.adapters,
        extra_docs=list(scenario.extra_docs),
        seed=seed,
        flow_control=flow_control,
        kv_event_delay_s=kv_event_delay_s,
        connections=client_connections(policy),
        gateways=gateways or ReplicaSettings(),
        decision_seed=decision_seed,
    )


def run_level(
    scenario: Scenario,
    policy: str,
    level: float,
    duration_s: float,
    seed: int,
    flow_control: bool = False,
    kv_event_delay_s: float = DEFAULT_DELAY_S,
    gateways: ReplicaSettings | None = None,
    decision_seed: int | None = None,
) -> RunResult:
    """One simulated run of ``policy`` at load ``level``."""
    spec = cluster_spec(
        scenario, policy, seed, flow_control, kv_event_delay_s, gateways, decision_seed
    )
    sim = ClusterSimulation(spec)
    workload = scenario.workload(level, duration_s, seed)
    return sim.run(workload, horizon_s=duration_s * (1.0 + scenario.drain_factor))


def run_entry(
    scenario: Scenario, policy: str, level: float, result: RunResult, wall_s: float
) -> dict[str, Any]:
    """The ``runs[]`` entry for one run."""
    engines = result.engines
    entry = entry_from_records(
        scenario,
        policy,
        level,
        result.records,
        result.endpoint_names,
        simulated_s=result.end_time,
        wall_s=wall_s,
        prefix_queries=sum(e.counters.prefix_cache_queries for e in engines),
        prefix_hits=sum(e.counters.prefix_cache_hits for e in engines),
        preemptions=sum(e.counters.preemptions for e in engines),
        accelerators=[e.profile.accelerator or "unknown" for e in engines],
        costs=[e.profile.cost_per_hour for e in engines],
        busy_s=[e.counters.busy_s for e in engines],
    )
    entry["kv_events"] = result.kv_events
    pool = result.connections
    if pool is not None:
        carried = pool.carried
        closed = sum(carried.values())
        entry["metrics"]["connections"] = {
            "opened": pool.opened,
            "per_backend": list(pool.connections_per_backend),
            "mean_requests_per_connection": (
                sum(k * n for k, n in carried.items()) / closed if closed else 0.0
            ),
            "max_requests_per_connection": max(carried, default=0),
        }
    return entry


def entry_from_records(
    scenario: Scenario,
    policy: str,
    level: float,
    records: Sequence[RequestRecord],
    endpoint_names: Sequence[str],
    *,
    simulated_s: float,
    wall_s: float,
    prefix_queries: int,
    prefix_hits: int,
    preemptions: int,
    accelerators: Sequence[str] = (),
    costs: Sequence[float | None] = (),
    busy_s: Sequence[float] = (),
) -> dict[str, Any]:
    """The ``runs[]`` entry from per-request records and the engines' counters (prompt
    tokens queried / found in the prefix cache, preemptions), summed over the pool; any
    runner (discrete-event or HTTP) can produce these. Times in simulated seconds, except
    ``wall_s``. Per endpoint, when known: its hardware class, its cost (USD/hour) and its
    engine's busy time (s) — a mixed pool gets a breakdown by class, a priced one its
    cost per 1M output tokens (:func:`~sluicegate.bench.metrics.cost_summary`)."""
    metrics = summarize(records)
    metrics["by_class"] = by_class(records)
    if accelerators:
        metrics["by_accelerator"] = by_accelerator(
            records, accelerators, costs, busy_s, simulated_s
        )
    priced = [c for c in costs if c is not None]
    if busy_s and costs and len(priced) == len(costs):
        metrics.update(cost_summary(records, priced, busy_s, simulated_s))
    loads = replica_loads(records, scenario.replicas)
    metrics["engine_prefix_hit_rate"] = prefix_hits / prefix_queries if prefix_queries else 0.0
    metrics["preemptions"] = preemptions
    metrics["load_imbalance"] = imbalance(loads)
    measured = [r for r in records if r.completed and r.servable_tokens >= 0]
    if measured:
        # what the servers could have served: for each request, the longest prefix any
        # engine held at its dispatch (an oracle router's choice, ignoring load), or what
        # its engine served when that is more. A request waiting in its engine's queue is
        # served blocks another request computed meanwhile, so the prefix held at dispatch
        # alone is no upper bound (priority-overload without flow control, seed 0: 109 of
        # 1,717 requests served more, and served / servable read 106.8 %)
        servable = sum(max(r.servable_tokens, r.cached_tokens) for r in measured)
        prompt = sum(r.prompt_tokens for r in measured)
        cached = sum(r.cached_tokens for r in measured)
        metrics["servable_prefix_hit_rate"] = servable / prompt if prompt else 0.0
        metrics["prefix_hits_of_servable"] = cached / servable if servable else None
    if any(r.spec.kind == "chat" for r in records):
        metrics["ideal_prefix_hit_rate"] = ideal_prefix_hit_rate(
            (r.prompt_bytes, r.reply.encode())
            for r in sorted(records, key=lambda r: r.arrival)
            if r.completed
        )
    closed = scenario.load_unit == "concurrent streams"
    return {
        "policy": policy,
        "qps": level if scenario.load_unit == "req/s" else None,
        "concurrency": int(level) if closed else None,
        "load": level,
        "load_unit": scenario.load_unit,
        "metrics": metrics,
        "replicas": [
            {
                "endpoint": name,
                "requests": load.requests,
                "prefill_tokens": load.prefill_tokens,
                "output_tokens": load.output_tokens,
                **({"accelerator": accelerators[i]} if accelerators else {}),
            }
            for i, (name, load) in enumerate(zip(endpoint_names, loads, strict=True))
        ],
        "simulated_s": simulated_s,
        "wall_s": wall_s,
    }


def run_plan(plan: RunPlan, progress: Progress | None = None) -> dict[str, Any]:
    """Run every (policy, level) of ``plan`` in the discrete-event simulation."""
    runs = []
    combos = [
        (level, flow_control, gateways, policy)
        for level in plan.levels
        for flow_control in plan.flow_control
        for gateways in plan.gateways
        for policy in plan.policies
    ]
    for level, flow_control, gateways, policy in combos:
        label = f"{policy}{' + flow control' if flow_control else ''}"
        if gateways.gateways > 1:
            label += f" × {gateways.gateways} {gateways.state}"
        if progress is not None:
            progress(f"{label} @ {level:g} {plan.scenario.load_unit}")
        started = time.perf_counter()
        result = run_level(
            plan.scenario,
            policy,
            level,
            plan.duration_s,
            plan.seed,
            flow_control,
            plan.kv_event_delay_s,
            gateways,
            plan.decision_seed,
        )
        entry = run_entry(plan.scenario, policy, level, result, time.perf_counter() - started)
        entry["flow_control"] = flow_control
        entry.update(gateways.describe(result.latency_models))
        if result.sharing is not None:
            entry["replica_sharing"] = result.sharing
        runs.append(entry)
    return results_document(plan, runs, "des")


def results_document(plan: RunPlan, runs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The results of ``plan``: its ``runs`` entries and what they ran on (``mode``:
    ``des`` or ``http``)."""
    s = plan.scenario
    document: dict[str, Any] = {
        "scenario": s.name,
        "mode": mode,
        "seed": plan.seed,
        "description": s.description,
        "pool": {"profile": s.profile.name, "replicas": s.replicas, "model": s.model},
        **({"mix": s.mix_description()} if s.mix else {}),
        "duration_s": plan.duration_s,
        "load_unit": s.load_unit,
    }
    if mode == "des":
        document["kv_event_delay_s"] = plan.kv_event_delay_s
        if plan.decision_seed is not None:
            document["decision_seed"] = plan.decision_seed
    if s.dataset == "sharegpt":
        loaded = sharegpt.load()
        document["dataset"] = {
            "name": "sharegpt",
            "records_recovered": loaded.records_recovered,
            "conversations": len(loaded.conversations),
            "bytes_read": loaded.bytes_read,
        }
    document["runs"] = runs
    return document
