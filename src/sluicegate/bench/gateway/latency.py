"""Added latency: streaming completions straight to a simulated pool, and through the gateway.

A ``sluicegate sim`` pool (``SIM_REPLICAS`` replicas of profile ``SIM_PROFILE`` in
``SIM_PROCESSES`` process, time scale ``SIM_TIME_SCALE``, prefix caching off so that a
replica's speed does not depend on where requests go) and an open-loop Poisson load
generator (:func:`~sluicegate.bench.loadgen.open_loop`, in this process) share core
``OTHER_CPU``; ``sluicegate serve`` runs alone on ``GATEWAY_CPU``. Streaming completions of
one shape (~1 KB prompts, unique from their first byte, so no prefix index has seen them)
go to each of :data:`~sluicegate.bench.gateway.settings.LATENCY_TARGETS`: straight to the
replicas (round-robin), straight to them while an idle gateway scrapes them (the baseline:
replicas pay for being scraped either way), or through the gateway with each preset — at
every rate, in interleaved rounds with the same arrival times and prompts for every
target. Per request: TTFT and end-to-end time from the send. The gateway's own
``OVERHEAD_METRIC`` histogram is read from ``/metrics`` before and after each run, and the
CPU the gateway, the pool and the generator used, and the listen-queue drops, beside it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from sluicegate.bench.gateway.routers import start_gateway, write_pool_config
from sluicegate.bench.gateway.settings import (
    DIRECT_SCRAPED,
    GATEWAY_CPU,
    LATENCY_TARGETS,
    OTHER_CPU,
    OVERHEAD_METRIC,
    SIM_PROCESSES,
    SIM_PROFILE,
    SIM_REPLICAS,
    SIM_TIME_SCALE,
    Settings,
    completion_body,
    prompts,
)
from sluicegate.bench.loadgen import Histogram, LoadResult, open_loop, read_histogram
from sluicegate.bench.processes import (
    Processes,
    cpu_seconds,
    free_port_block,
    http_get,
    listen_overflows,
    wait_ready,
)


@dataclass(frozen=True, slots=True)
class LatencyRun:
    """One target at one rate: the client's view, plus the gateway's own histogram."""

    target: str
    """``direct`` or a gateway preset."""
    rate: int
    load: LoadResult
    overhead: Histogram | None
    gateway_cpu: float | None
    """Share of its core the gateway process used."""
    sim_cpu: float
    """Share of a core the simulated pool's process used."""
    listen_overflows: int
    """Connections dropped by full listen queues on the machine during the run."""


def start_sims(procs: Processes, base: int, processes: int) -> dict[str, int]:
    """``SIM_REPLICAS`` simulated replicas on ports ``base``… in ``processes`` processes
    (1, or one per replica), all on core ``OTHER_CPU``; process name → pid."""
    per = SIM_REPLICAS // processes
    pids = {}
    for i in range(processes):
        name = f"sim-{i}"
        cmd = [
            sys.executable,
            "-m",
            "sluicegate",
            "--log-level",
            "warning",
            "sim",
            "--replicas",
            str(per),
            "--port",
            str(base + i * per),
            "--profile",
            SIM_PROFILE,
            "--time-scale",
            str(SIM_TIME_SCALE),
            "--no-prefix-caching",
            "--seed",
            str(i),
        ]
        pids[name] = procs.start(name, cmd, OTHER_CPU)
    for i in range(SIM_REPLICAS):
        wait_ready(procs, f"sim-{i // per}", f"http://127.0.0.1:{base + i}/health")
    return pids


def measure_latency(settings: Settings, workdir: Path, console: Console) -> list[LatencyRun]:
    """Direct versus through-gateway streaming latency, every rate, every repeat."""
    procs = Processes(workdir)
    runs: list[LatencyRun] = []
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        base = free_port_block(SIM_REPLICAS)
        replicas = [f"http://127.0.0.1:{base + i}" for i in range(SIM_REPLICAS)]
        sims = start_sims(procs, base, SIM_PROCESSES)
        if affinity is not None and (os.cpu_count() or 1) > GATEWAY_CPU:
            os.sched_setaffinity(0, {OTHER_CPU})  # the generator shares the sim's core
        config = workdir / "pool.yaml"
        write_pool_config(config, replicas)
        for repeat in range(settings.latency_repeats):
            for target in LATENCY_TARGETS:
                console.print(f"latency: {target}, round {repeat + 1}/{settings.latency_repeats}")
                runs += _latency_target(procs, settings, target, repeat, replicas, config, sims)
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        procs.stop_all()
    return runs


def _latency_target(
    procs: Processes,
    settings: Settings,
    target: str,
    repeat: int,
    replicas: Sequence[str],
    config: Path,
    sims: dict[str, int],
) -> list[LatencyRun]:
    """Every rate against one target; the gateway (if any) is started and stopped here."""
    name = f"gateway-{target}"
    gateway_pid: int | None = None
    urls = [f"{u}/v1/completions" for u in replicas]
    if target != "direct":
        gateway = start_gateway(
            procs, name, config, "default" if target == DIRECT_SCRAPED else target
        )
        if target != DIRECT_SCRAPED:
            gateway_pid = procs.procs[name].pid
            urls = [f"{gateway}/v1/completions"]
    runs = []
    try:
        for rate in settings.rates:
            for sim in sims:
                procs.check(sim)
            seed = 1000 * repeat + rate  # the same arrivals and prompts for every target
            _run_load(urls, rate, settings.latency_warmup_s, seed + 7)
            before = _overhead(urls[0]) if gateway_pid else None
            cpu0 = cpu_seconds(gateway_pid) if gateway_pid else 0.0
            sim0 = sum(cpu_seconds(pid) for pid in sims.values())
            overflows = listen_overflows()
            load = _run_load(urls, rate, settings.latency_s, seed)
            overflows = listen_overflows() - overflows
            sim_cpu = (sum(cpu_seconds(pid) for pid in sims.values()) - sim0) / load.wall_s
            share = (cpu_seconds(gateway_pid) - cpu0) / load.wall_s if gateway_pid else None
            after = _overhead(urls[0]) if gateway_pid else None
            overhead = after.minus(before) if after and before else None
            runs.append(LatencyRun(target, rate, load, overhead, share, sim_cpu, overflows))
            for sim in sims:
                procs.check(sim)
    finally:
        procs.stop(name)
    return runs


def _run_load(urls: Sequence[str], rate: int, seconds: float, seed: int) -> LoadResult:
    """One :func:`open_loop` run in a fresh event loop (uvloop when available), with
    prompts no earlier run sent (so no prefix index has seen them)."""
    count = int(rate * seconds * 1.2) + 100
    bodies = [completion_body(p, stream=True) for p in prompts(count, 0, seed)]
    coro = open_loop(urls, bodies, rate, seconds, seed)
    try:
        import uvloop

        result: LoadResult = uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency
        result = asyncio.run(coro)
    return result


def _overhead(url: str) -> Histogram:
    base = url.rsplit("/v1/", 1)[0]
    status, body = http_get(f"{base}/metrics", 5.0)
    if status != 200:
        raise RuntimeError(f"{base}/metrics answered {status}")
    return read_histogram(body.decode(), OVERHEAD_METRIC)
