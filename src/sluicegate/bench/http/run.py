"""Running HTTP mode: one (policy, level) on fresh processes, and a whole plan.

:func:`run_level_http` starts the pool (:mod:`~sluicegate.bench.http.pool`) and the router
under test — ``sluicegate serve`` with a generated configuration, or ``vllm-router`` for
the peer policies — replays the workload against it
(:mod:`~sluicegate.bench.http.client`), reads the engines' counters and the CPU each
process used, and stops every process whatever happens. :func:`run_plan_http` does so for
every (level, flow control, policy) of a plan, at one time scale
(:func:`~sluicegate.bench.http.plan.pick_time_scale`), and returns the results document
of ``sluicegate bench run --mode http``: DES mode's shape with ``"mode": "http"``, the
time scale and why, the gateway settings and notes on skipped policies and doubtful runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
import yaml

from sluicegate.bench.gateway.routers import start_vllm_router
from sluicegate.bench.http.client import replay
from sluicegate.bench.http.plan import (
    ROUTER_POLICIES,
    gateway_documents,
    pick_time_scale,
    plan_policies,
    sim_profile_args,
)
from sluicegate.bench.http.pool import ProcessGroups, engine_counters, start_sim, start_sluicegate
from sluicegate.bench.http.results import HttpRunResult, http_entry
from sluicegate.bench.processes import cpu_seconds
from sluicegate.bench.runner import RunPlan, results_document
from sluicegate.bench.scenario_spec import Scenario

Progress = Callable[[str], None]


def run_level_http(
    scenario: Scenario,
    policy: str,
    level: float,
    duration_s: float,
    seed: int,
    time_scale: float,
    workdir: Path,
    flow_control: bool = False,
) -> HttpRunResult:
    """One run of ``policy`` at load ``level`` on freshly started processes (stopped
    before returning, whatever happens). ``workdir`` receives the config and the logs.
    ``flow_control`` (sluicegate only) queues requests in the gateway while saturated."""
    sim_profile_args(scenario.profile)  # refuse early what the simulator cannot run
    if flow_control and policy in ROUTER_POLICIES:
        raise ValueError(f"{policy} has no flow control")
    procs = ProcessGroups(workdir)
    try:
        urls, ports = start_sim(procs, scenario, time_scale, seed)
        if policy in ROUTER_POLICIES:
            router = "vllm-router"
            base = start_vllm_router(procs, "vllm-router", urls, ROUTER_POLICIES[policy])
        else:
            router = "sluicegate"
            config = workdir / f"gateway-{policy}-{level:g}{'-fc' if flow_control else ''}.yaml"
            docs = gateway_documents(urls, scenario, time_scale, flow_control)
            config.write_text(yaml.safe_dump_all(docs, sort_keys=False))
            base = start_sluicegate(procs, config, policy, seed, scenario.replicas)
        workload = scenario.workload(level, duration_s, seed)
        horizon = duration_s * (1.0 + scenario.drain_factor)
        pids = {"sim": procs.procs["sim"].pid}
        pids["router"] = procs.procs["vllm-router" if router == "vllm-router" else "gateway"].pid
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        result = uvloop.run(replay(workload, base, time_scale, horizon, ports))
        cpu = {
            name: (cpu_seconds(pid) - cpu0[name]) / max(result.wall_s, 1e-9)
            for name, pid in pids.items()
        }
        cpu["load_average"] = os.getloadavg()[0]
        procs.check("sim")
        counters = engine_counters(urls)
    finally:
        procs.stop_all()
    return HttpRunResult(
        records=result.records,
        end_time=result.end_time,
        endpoint_names=[f"sim-{i}" for i in range(scenario.replicas)],
        counters=counters,
        time_scale=time_scale,
        router=router,
        wall_s=result.wall_s,
        cpu=cpu,
    )


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """Settings of an HTTP-mode plan."""

    time_scale: float | None = None
    """Wall seconds per simulated second; None: :func:`pick_time_scale` picks it."""
    workdir: Path | None = None
    """Where configs and process logs go (default: a temporary folder, removed after)."""


def run_plan_http(
    plan: RunPlan, options: HttpOptions | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Run every (policy, level) of ``plan`` on real processes; results as
    :func:`~sluicegate.bench.runner.run_plan`'s with ``"mode": "http"``, the time scale,
    the gateway settings and ``notes`` on skipped policies.

    Raises :class:`UnsupportedScenarioError` for a scenario the simulator cannot run.
    """
    options = options or HttpOptions()
    scenario = plan.scenario
    sim_profile_args(scenario.profile)
    pick = pick_time_scale(plan, options.time_scale)
    scale = pick.time_scale
    policies, notes = plan_policies(plan.policies, scenario)
    with contextlib.ExitStack() as stack:
        if options.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-http-")))
        else:
            workdir = options.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        runs = []
        for level in plan.levels:
            for flow_control in plan.flow_control:
                for policy in policies:
                    if flow_control and policy in ROUTER_POLICIES:
                        continue  # noted below
                    label = f"{policy}{' + flow control' if flow_control else ''}"
                    if progress is not None:
                        progress(f"{label} @ {level:g} {scenario.load_unit} (http)")
                    started = time.perf_counter()
                    result = run_level_http(
                        scenario,
                        policy,
                        level,
                        plan.duration_s,
                        plan.seed,
                        scale,
                        workdir,
                        flow_control,
                    )
                    entry = http_entry(
                        scenario, policy, level, result, time.perf_counter() - started
                    )
                    entry["flow_control"] = flow_control
                    runs.append(entry)
                    notes += [f"{label} @ {level:g}: {w}" for w in entry["warnings"]]
        if any(plan.flow_control) and any(p in ROUTER_POLICIES for p in policies):
            notes.append("vllm-router policies: run with flow control off only (it has none)")
    doc = results_document(plan, runs, "http")
    doc["time_scale"] = scale
    doc["time_scale_pick"] = pick.as_dict()
    doc["gateway"] = gateway_documents([], scenario, scale)[-1]["spec"]
    doc["notes"] = notes
    return doc
