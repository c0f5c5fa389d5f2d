"""``sluicegate bench micro gateway``: run the gateway benchmark and write its report.

:func:`report` runs the latency measurement (:mod:`sluicegate.bench.gateway.latency`),
then the throughput one with its profiles (:mod:`sluicegate.bench.gateway.throughput`),
at ``$SLUICEGATE_BENCH_NICE`` in a temporary work folder, and :func:`render` turns them
into Markdown: a header saying how to reproduce the run (command, machine, measured
commit, load average before and after, cores), then the sections of
:mod:`sluicegate.bench.gateway.sections`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from sluicegate.bench.gateway.latency import LatencyRun, measure_latency
from sluicegate.bench.gateway.sections import (
    render_goals,
    render_latency,
    render_profiles,
    render_throughput,
)
from sluicegate.bench.gateway.settings import ROOT, Settings
from sluicegate.bench.gateway.summary import latency_rows
from sluicegate.bench.gateway.throughput import ThroughputResults, measure_throughput
from sluicegate.bench.processes import bench_nice, niceness


def _load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def source_version() -> str:
    """The measured code: git commit, and whether ``src/`` had uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} + uncommitted changes in src/" if dirty else commit


def report(quick: bool, console: Console, machine: str) -> str:
    """Run both measurements (and the profile) and render the Markdown report."""
    settings = Settings.quick() if quick else Settings()
    load_before = _load_average()
    version = source_version()
    started = time.monotonic()
    nice = bench_nice()
    with (
        niceness(nice),
        tempfile.TemporaryDirectory(prefix="sluicegate-gw-bench-") as tmp,
    ):
        workdir = Path(tmp)
        latency = measure_latency(settings, workdir, console)
        throughput = measure_throughput(settings, workdir, console)
    minutes = (time.monotonic() - started) / 60
    return render(
        settings,
        quick,
        f"{machine}; sluicegate {version}"
        + (
            f"; every benchmark process at niceness {nice} (`SLUICEGATE_BENCH_NICE`)"
            if nice
            else ""
        ),
        load_before,
        _load_average(),
        minutes,
        latency,
        throughput,
        nice,
    )


def render(
    settings: Settings,
    quick: bool,
    machine: str,
    load_before: str,
    load_after: str,
    minutes: float,
    latency: Sequence[LatencyRun],
    throughput: ThroughputResults,
    nice: int = 0,
) -> str:
    """The Markdown of ``sluicegate bench micro gateway``."""
    rows = latency_rows(latency)
    lines = [
        "# Gateway overhead",
        "",
        "What the gateway costs a request, and how many requests one core of it routes, "
        "next to `vllm-router` (a Rust router; `scripts/bench-setup` installs it) on "
        "the same pool and load.",
        "",
        "Goals (issue): added latency p50 ≤ 1 ms and p99 ≤ 5 ms at 200 and 500 requests/s "
        "streaming; the default profile (prefix-aware) sustains at least the requests/s of "
        "`vllm-router --policy cache_aware`, and the round-robin profile at least half of "
        "`vllm-router --policy round_robin`, on one core.",
        "",
        "```",
        "scripts/bench-setup    # nginx, and vllm-router + py-spy in .venv-bench/",
        f"{f'SLUICEGATE_BENCH_NICE={nice} ' if nice else ''}"
        f"sluicegate bench micro gateway{' --quick' if quick else ''} "
        "--out docs/benchmarks/gateway.md",
        "```",
        "",
        f"Machine: {machine}. Load average (1/5/15 min) {load_before} before, {load_after} "
        f"after; {minutes:.1f} minutes. "
        + (
            "Quick mode: runs of a few seconds, once each — a smoke test, not a result."
            if quick
            else f"Latency: {settings.latency_repeats} rounds, every target once per round, "
            f"medians shown. Requests/s: {settings.repeats} runs of each router, interleaved, "
            "the best shown (a maximum is sought, and other work can only lower a rate)."
        ),
        "",
        "Cores: the router under test runs alone on core 1 (`taskset -c 1`); everything "
        "else (simulator or nginx mock, load generator, wrk, py-spy) shares core 0."
        + (
            f" Every benchmark process, and its scheduler autogroup, ran at niceness {nice} "
            "(`SLUICEGATE_BENCH_NICE`), ahead of other work on the shared machine: without "
            "it, other sessions' processes time-sliced with ours and latencies swung by "
            "hundreds of ms."
            if nice
            else ""
        ),
        "",
    ]
    lines += render_latency(settings, rows, latency)
    lines += render_throughput(settings, throughput)
    lines += render_profiles(throughput)
    lines += render_goals(rows, latency, throughput)
    return "\n".join(lines) + "\n"
