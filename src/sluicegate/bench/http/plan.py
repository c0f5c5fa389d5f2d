"""What an HTTP-mode plan runs, and with which settings.

- :func:`plan_policies` — the policies HTTP mode can run for a scenario (a note for each
  one skipped): the sluicegate presets of this build, and the peer policies of
  :data:`ROUTER_POLICIES` when ``vllm-router`` is installed and the scenario does not need
  model renaming (InferenceModels), which it cannot do;
- :func:`sim_profile_args` — the ``sluicegate sim`` options reproducing the scenario's
  engine profile (a built-in one by name, any other as a profile file);
- :func:`pick_time_scale` — wall seconds per simulated second: just slow enough that the
  plan's output token rate stays within what this machine streams faithfully;
- :func:`gateway_documents` — the configuration ``sluicegate serve`` gets.

**Gateway settings.** The discrete-event mode scrapes every 50 ms of simulated time and
treats metrics older than 1 s as stale (:class:`~sluicegate.bench.des_spec.ClusterSpec`). The
generated ``GatewayConfig`` keeps those in simulated time: ``scrapeIntervalMs`` = 50·S
(but at least :data:`MIN_SCRAPE_INTERVAL_MS`, to bound the scraping CPU; below S = 0.2
the gateway's view is staler than the DES's) and ``metricsStalenessMs`` = 1000·S. SLO
headers (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) are multiplied by S on the wire, since the
gateway compares them with wall-clock latencies; SLO attainment is computed from the
converted latencies against the unscaled SLOs. Plugins and flow control with time
constants of their own (TTLs, decay, request TTL) still run on wall time. Flow control is
turned on as in DES mode (the pool's queueing annotation); vllm-router has none, so its
policies run with flow control off only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from sluicegate.bench.des_spec import POOL, ClusterSpec
from sluicegate.bench.gateway.routers import vllm_router_binary
from sluicegate.bench.metrics import summarize
from sluicegate.bench.policies import UnknownPolicyError, available_policies, is_lab_only
from sluicegate.bench.runner import RunPlan, run_level
from sluicegate.bench.scenario_spec import Scenario
from sluicegate.flowcontrol.config import POOL_ANNOTATION
from sluicegate.sim.profile_file import materialise
from sluicegate.sim.profiles import PROFILES, EngineProfile

ROUTER_POLICIES: dict[str, str] = {
    "vllm-router-round-robin": "round_robin",
    "vllm-router-cache-aware": "cache_aware",
}
"""Peer policies: these names run the pool behind ``vllm-router --policy <value>``."""

TOKENS_PER_WALL_S_PER_CORE = 500.0
"""Streamed output tokens per wall second, per core, that the whole chain (simulator,
router, load generator) carries without slowing the simulated engines down noticeably.
Measured on a 2-core machine: at ~1,600 tokens/s the engines' own TPOT was 8-45 % above
the DES's (more behind sluicegate, whose scrapes and relaying share the cores)."""

MIN_AUTO_TIME_SCALE = 1.0
"""Lowest time scale picked automatically. Faster-than-real-time runs distort latencies
(per-step timer lateness of the simulator and per-request overheads grow as 1/S), so they
are opt-in via ``--time-scale``."""

AUTO_ESTIMATE_MAX_S = 10.0
"""Simulated seconds of arrivals the DES estimate of the token rate runs for, at most."""

MIN_SCRAPE_INTERVAL_MS = 10.0
"""Floor of the gateway's scrape interval, in wall milliseconds. Scrapes are not free: the
simulator renders ``/metrics`` in 2.5-4 ms of CPU per replica, so a 4-replica pool
scraped every 50 ms costs it a third of a core (vllm-router does not scrape)."""


class UnsupportedScenarioError(ValueError):
    """The scenario cannot be reproduced with ``sluicegate sim`` processes."""


def _des_default(name: str) -> float:
    """A default of :class:`ClusterSpec` (what DES mode runs with)."""
    for f in fields(ClusterSpec):
        if f.name == name:
            return float(f.default)  # type: ignore[arg-type]
    raise KeyError(name)


DES_SCRAPE_INTERVAL_S = _des_default("scrape_interval_s")
"""Scrape interval of the discrete-event mode, simulated seconds."""
DES_STALENESS_S = _des_default("staleness_s")
"""Metrics staleness limit of the discrete-event mode, simulated seconds."""


def check_time_scale(value: float) -> float:
    """``value`` if it is a usable time scale (positive); raises ValueError otherwise."""
    if not value > 0:
        raise ValueError("the time scale must be positive")
    return value


@dataclass(frozen=True, slots=True)
class TimeScalePick:
    """The time scale a plan runs at, and why (rates in output tokens per second)."""

    time_scale: float
    """Wall seconds per simulated second."""
    simulated_tokens_per_s: float | None
    """Peak output rate of the plan in DES mode (None: ``--time-scale`` was given)."""
    budget_tokens_per_wall_s: float

    def as_dict(self) -> dict[str, float | None]:
        return {
            "time_scale": self.time_scale,
            "simulated_tokens_per_s": self.simulated_tokens_per_s,
            "budget_tokens_per_wall_s": self.budget_tokens_per_wall_s,
        }


def pick_time_scale(plan: RunPlan, override: float | None = None) -> TimeScalePick:
    """The time scale for ``plan``: ``override`` if given; otherwise just slow enough that
    the plan's output token rate — estimated by a DES run of its highest load level (its
    first preset policy, at most :data:`AUTO_ESTIMATE_MAX_S` of arrivals) — stays within
    :data:`TOKENS_PER_WALL_S_PER_CORE` × cores of wall time, and never below
    :data:`MIN_AUTO_TIME_SCALE`. Rounded up to a multiple of 0.25."""
    budget = TOKENS_PER_WALL_S_PER_CORE * (os.cpu_count() or 1)
    if override is not None:
        return TimeScalePick(check_time_scale(override), None, budget)
    presets = [p for p in plan.policies if p not in ROUTER_POLICIES] or ["round-robin"]
    duration = min(plan.duration_s, AUTO_ESTIMATE_MAX_S)
    result = run_level(plan.scenario, presets[0], max(plan.levels), duration, plan.seed)
    rate = summarize(result.records)["output_tokens_per_s"]
    scale = max(MIN_AUTO_TIME_SCALE, math.ceil(4.0 * rate / budget) / 4.0)
    return TimeScalePick(scale, rate, budget)


def sim_profile_args(profile: EngineProfile) -> list[str]:
    """``sluicegate sim`` options that reproduce ``profile``.

    A built-in profile is passed by name; a modified copy of one is accepted when it differs
    only in name, description, ``num_gpu_blocks`` (``--num-gpu-blocks-override``) and
    ``max_loras`` (``--max-loras``). Any other profile is written to a profile file
    (:func:`~sluicegate.sim.profile_file.materialise`) passed as ``--profile-file``.
    """
    bases = [PROFILES[profile.name]] if profile.name in PROFILES else []
    bases += [p for p in PROFILES.values() if p.name != profile.name]
    for base in bases:
        same = replace(
            base,
            name=profile.name,
            description=profile.description,
            num_gpu_blocks=profile.num_gpu_blocks,
            max_loras=profile.max_loras,
        )
        if same != profile:
            continue
        args = ["--profile", base.name]
        if profile.num_gpu_blocks != base.num_gpu_blocks:
            args += ["--num-gpu-blocks-override", str(profile.num_gpu_blocks)]
        if profile.max_loras != base.max_loras:
            args += ["--max-loras", str(profile.max_loras)]
        return args
    # Any other profile (a calibrated one, a scenario's own): a profile file of it.
    return ["--profile-file", str(materialise(profile))]


def _rewrites_models(scenario: Scenario) -> bool:
    """True when the scenario's InferenceModels map public names to other targets."""
    return any(doc.get("kind") == "InferenceModel" for doc in scenario.extra_docs)


def plan_policies(policies: Sequence[str], scenario: Scenario) -> tuple[list[str], list[str]]:
    """The policies of ``policies`` HTTP mode can run for ``scenario``, and a note saying
    why each other one is skipped; an unknown name is an :class:`UnknownPolicyError`."""
    runnable: list[str] = []
    notes: list[str] = []
    presets = set(available_policies())
    for policy in policies:
        if policy in ROUTER_POLICIES:
            if vllm_router_binary() is None:
                notes.append(
                    f"{policy}: skipped, vllm-router is not installed "
                    "(`scripts/bench-setup` puts it in .venv-bench/)"
                )
            elif _rewrites_models(scenario):
                notes.append(
                    f"{policy}: skipped, the scenario's InferenceModels rename models "
                    "(public name → target), which vllm-router does not do"
                )
            else:
                runnable.append(policy)
        elif is_lab_only(policy):  # not a gateway: the lab's client connections model it
            raise UnknownPolicyError(f"{policy}: a lab-only baseline, --mode des only")
        elif policy.partition(":")[0] in presets:
            runnable.append(policy)
        else:  # a typo must not shrink the comparison unnoticed
            raise UnknownPolicyError(
                f"unknown policy {policy!r}; known: "
                f"{', '.join(sorted({*presets, *ROUTER_POLICIES}))}"
            )
    return runnable, notes


def gateway_documents(
    urls: Sequence[str], scenario: Scenario, time_scale: float, flow_control: bool = False
) -> list[dict[str, Any]]:
    """The configuration ``sluicegate serve`` gets: pool ``sim-pool`` of ``urls`` (named
    ``sim-0``... as in DES mode; annotated for queueing with ``flow_control``, as DES mode
    does), the scenario's extra documents, and a GatewayConfig whose scrape interval and
    staleness limit equal DES mode's in simulated time."""
    scrape_ms = max(MIN_SCRAPE_INTERVAL_MS, DES_SCRAPE_INTERVAL_S * 1000.0 * time_scale)
    return [
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {
                "name": POOL,
                "annotations": {POOL_ANNOTATION: "true"} if flow_control else {},
            },
            "spec": {
                "targetPorts": [{"number": 8000}],
                "endpoints": [
                    {"address": u.removeprefix("http://"), "name": f"sim-{i}"}
                    for i, u in enumerate(urls)
                ],
            },
        },
        *scenario.extra_docs,
        {
            "apiVersion": "sluicegate.dev/v1alpha1",
            "kind": "GatewayConfig",
            "metadata": {"name": "bench-http"},
            "spec": {
                "scrapeIntervalMs": scrape_ms,
                "metricsStalenessMs": DES_STALENESS_S * 1000.0 * time_scale,
                # The lab's load generator sends objective headers, as trusted clients do.
                "trustControlHeaders": True,
                # No prediction header is sent: predictions as in DES mode, whatever the
                # setting's default.
                "latencyPredictor": {"predictionBasedSchedulingDefault": True},
            },
        },
    ]
