"""The most requests/s a router sustains on one core, against a mock pool.

The router under test alone on core ``GATEWAY_CPU``; on core ``OTHER_CPU``, ``wrk`` (one
thread, ``Settings.connections`` connections, rotating ``BODY_VARIANTS`` bodies whose
~1 KB prompts share ``PREFIXES`` prefixes, so cache-aware policies match real prefixes)
and the nginx mock of :mod:`sluicegate.bench.gateway.mock` (JSON answers, and with
``Settings.streaming_throughput`` SSE ones). Every router of
:data:`~sluicegate.bench.gateway.routers.ROUTERS` — sluicegate presets, vllm-router
policies, and wrk straight to one mock replica (the ceiling) — is restarted for every
run, warmed up, then measured, with the share of its core it used. With
``Settings.profile_s``, py-spy then samples each saturated gateway preset
(:mod:`sluicegate.bench.gateway.profile`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from sluicegate.bench.gateway.mock import start_mock
from sluicegate.bench.gateway.profile import ProfileSummary, profile_gateway
from sluicegate.bench.gateway.routers import ROUTERS, start_router, vllm_router_binary
from sluicegate.bench.gateway.settings import (
    BODY_VARIANTS,
    GATEWAY_POLICIES,
    OTHER_CPU,
    PREFIXES,
    Settings,
    completion_body,
    prompts,
)
from sluicegate.bench.loadgen import WrkResult, wrk, wrk_rotating_script
from sluicegate.bench.processes import Processes, cpu_seconds


@dataclass(frozen=True, slots=True)
class ThroughputRun:
    """One router in one answer mode, saturated by wrk."""

    router: str
    """``direct``, ``sluicegate <preset>`` or ``vllm-router <policy>``."""
    mode: str
    """``json`` (non-streaming answers) or ``sse`` (streamed)."""
    result: WrkResult
    router_cpu: float | None
    """Share of its core the router process used."""


@dataclass(slots=True)
class ThroughputResults:
    runs: list[ThroughputRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why something was not measured."""
    profiles: dict[str, ProfileSummary] = field(default_factory=dict)
    """py-spy summaries of the gateway, by ``<preset> <mode>``."""


def measure_throughput(settings: Settings, workdir: Path, console: Console) -> ThroughputResults:
    """Requests/s of every router (see :data:`ROUTERS`) in each answer mode, every repeat;
    then, with py-spy, where the gateway spends its core."""
    out = ThroughputResults()
    if shutil.which("wrk") is None:
        out.notes.append("wrk is not installed (`apt-get install wrk`): nothing measured.")
        return out
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        out.notes.append("nginx is not installed (`scripts/bench-setup`): nothing measured.")
        return out
    routers = list(ROUTERS)
    if vllm_router_binary() is None:
        out.notes.append(
            "vllm-router is not installed (`scripts/bench-setup` puts it in .venv-bench/): "
            "its rows are missing."
        )
        routers = [r for r in routers if r[0] != "vllm-router"]
    procs = Processes(workdir)
    bodies = prompts(BODY_VARIANTS, PREFIXES, seed=3)
    modes = ("json", "sse") if settings.streaming_throughput else ("json",)
    try:
        pool = start_mock(procs, workdir)
        for mode in modes:
            stream = mode == "sse"
            urls = pool.sse_urls if stream else pool.json_urls
            script = wrk_rotating_script(
                [completion_body(p, stream) for p in bodies], "/v1/completions"
            )
            for repeat in range(settings.repeats):
                for kind, policy, label in routers:
                    console.print(
                        f"throughput: {label}, {mode}, run {repeat + 1}/{settings.repeats}"
                    )
                    run = _throughput_run(
                        procs, workdir, settings, kind, policy, label, mode, urls, script
                    )
                    if run is None:
                        out.notes.append(f"{label} ({mode}) failed to start; see the log.")
                    else:
                        out.runs.append(run)
                    procs.check("nginx")
            if settings.profile_s > 0:
                for preset in GATEWAY_POLICIES:
                    console.print(f"profile: sluicegate {preset}, {mode}")
                    summary = profile_gateway(procs, workdir, settings, preset, urls, script)
                    if summary is not None:
                        out.profiles[f"{preset} {mode}"] = summary
    finally:
        procs.stop_all()
    return out


def _throughput_run(
    procs: Processes,
    workdir: Path,
    settings: Settings,
    kind: str,
    policy: str,
    label: str,
    mode: str,
    urls: Sequence[str],
    script: str,
) -> ThroughputRun | None:
    name = f"{kind}-{policy}"
    try:
        url = start_router(procs, workdir, kind, policy, urls)
    except RuntimeError as exc:
        (workdir / f"{name}-failure.txt").write_text(str(exc))
        procs.stop(name)
        return None
    try:
        pid = procs.procs[name].pid if kind != "direct" else None
        wrk(url, script, settings.connections, settings.throughput_warmup_s, OTHER_CPU)
        cpu0 = cpu_seconds(pid) if pid else 0.0
        result = wrk(url, script, settings.connections, settings.throughput_s, OTHER_CPU)
        share = (cpu_seconds(pid) - cpu0) / result.seconds if pid else None
        return ThroughputRun(label, mode, result, share)
    finally:
        if kind != "direct":
            procs.stop(name)
