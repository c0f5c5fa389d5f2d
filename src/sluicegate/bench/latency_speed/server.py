"""Predictor speed over HTTP: one prediction-server process, and the gateway's client.

- :func:`measure_server` — ``sluicegate predictor predict-server`` pinned to core
  ``SERVER_CPU``, loaded from the trained model files, driven by ``wrk`` (one thread,
  ``WRK_CONNECTIONS`` connections, on core ``BENCH_CPU``) with ``POST /predict/bulk/strict``
  bodies of 10 or 100 rows. Throughput per server core = requests answered / CPU-seconds
  the server used (from ``/proc``), so wrk or other work competing for the cores does not
  count against the server; achieved requests/s and the server's merged booster calls
  (``/status``) are kept beside it.
- :func:`client_against_server` / :func:`measure_client` — ``RemotePredictor`` in this
  process (core ``BENCH_CPU``) with ``CALLERS`` concurrent callers, each asking for 10
  endpoints in a closed loop against a fresh server: calls/s, HTTP requests/s (what
  coalescing merged) and the per-call latency.

The servers are started with a training-server URL where nothing listens and a long sync
interval, so they keep the models they were given for the whole run.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from rich.console import Console

from sluicegate.bench.latency_speed.synthetic import request_rows
from sluicegate.bench.loadgen import parse_wrk, wrk_rotating_script
from sluicegate.bench.processes import (
    Processes,
    cpu_seconds,
    free_port_block,
    http_get,
    pin_this_thread,
    wait_ready,
)
from sluicegate.bench.sim_speed import run_wrk
from sluicegate.latency.wire import row_to_json

SERVER_CPU = 1
"""The core of the prediction server (and of this process for the in-process runs)."""
BENCH_CPU = 0
"""The core of wrk and of the RemotePredictor run."""
WRK_CONNECTIONS = 16
CALLERS = 32
ENDPOINTS = (10, 100)
READY_TIMEOUT_S = 60.0


def start_predict_server(procs: Processes, name: str, model_dir: Path) -> tuple[int, str]:
    """A ``predict-server`` on ``SERVER_CPU`` serving the models in ``model_dir``, once
    ready; its pid and base URL."""
    port = free_port_block(2)
    dead = port + 1  # nothing listens there: the server keeps the models it was given
    pid = procs.start(
        name,
        [
            *(sys.executable, "-m", "sluicegate", "--log-level", "error"),
            *("predictor", "predict-server", "--port", str(port)),
            *("--training-server", f"http://127.0.0.1:{dead}", "--sync-interval", "3600"),
            *("--model-dir", str(model_dir)),
        ],
        SERVER_CPU,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(procs, name, f"{url}/readyz", READY_TIMEOUT_S)
    return pid, url


@dataclass(frozen=True, slots=True)
class ServerRun:
    """One wrk run against the server: answered requests, its CPU, wrk's latencies."""

    endpoints: int
    requests: int
    seconds: float
    server_cpu_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    booster_calls: int
    """Merged prediction calls the server made (``/status``), for requests per call."""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def rps_per_core(self) -> float:
        return self.requests / self.server_cpu_s if self.server_cpu_s > 0 else 0.0


def measure_server(
    model_dir: Path, workdir: Path, seconds: float, console: Console
) -> list[ServerRun]:
    """Throughput of one pinned ``predict-server`` process under wrk, per endpoint count."""
    procs = Processes(workdir)
    runs = []
    try:
        pid, url = start_predict_server(procs, "predict-server", model_dir)

        def booster_calls() -> int:
            status, body = http_get(f"{url}/status")
            return int(orjson.loads(body)["booster_calls"]) if status == 200 else 0

        for endpoints in ENDPOINTS:
            bodies = [
                orjson.dumps({"requests": [row_to_json(r) for r in rows]})
                for rows in request_rows(64, endpoints, seed=100 + endpoints)
            ]
            script = wrk_rotating_script(bodies, "/predict/bulk/strict")
            console.print(f"latency: predict-server, {endpoints} endpoints per request ...")
            run_wrk(url, script, WRK_CONNECTIONS, 2, BENCH_CPU)  # warm up
            cpu_before = cpu_seconds(pid)
            calls_before = booster_calls()
            done, elapsed, out = run_wrk(url, script, WRK_CONNECTIONS, seconds, BENCH_CPU)
            cpu_used = cpu_seconds(pid) - cpu_before
            calls = booster_calls() - calls_before
            procs.check("predict-server")
            latency = parse_wrk(out)
            runs.append(
                ServerRun(
                    endpoints,
                    done,
                    elapsed,
                    cpu_used,
                    latency.p50 * 1000.0,
                    latency.p99 * 1000.0,
                    calls,
                )
            )
        return runs
    finally:
        procs.stop_all()


@dataclass(frozen=True, slots=True)
class ClientRun:
    """A closed-loop RemotePredictor run: calls, the HTTP requests they became, latency."""

    calls: int
    http_requests: int
    seconds: float
    failed: int
    wall_ms: list[float]


async def measure_client(
    url: str, seconds: float, callers: int = CALLERS, endpoints: int = 10
) -> ClientRun:
    """Closed loop: ``callers`` tasks each calling ``predict_async`` back to back."""
    from sluicegate.latency.client import RemotePredictor, RemoteSettings

    client = RemotePredictor(RemoteSettings((url,), timeout_s=1.0))
    await client.start()
    row_sets = request_rows(64, endpoints, seed=7)
    wall: list[float] = []
    failed = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def caller(k: int) -> None:
        nonlocal failed
        i = k
        while loop.time() < deadline:
            started = time.perf_counter_ns()
            out = await client.predict_async(row_sets[i % len(row_sets)])
            wall.append((time.perf_counter_ns() - started) / 1e6)
            failed += out is None
            i += 1

    try:
        await asyncio.gather(*(caller(k) for k in range(min(callers, 4))))  # warm up
        wall.clear()
        failed = 0
        requests_before = client.http_requests
        started = loop.time()
        deadline = started + seconds
        await asyncio.gather(*(caller(k) for k in range(callers)))
        elapsed = loop.time() - started
        return ClientRun(len(wall), client.http_requests - requests_before, elapsed, failed, wall)
    finally:
        await client.close()


def client_against_server(workdir: Path, seconds: float, console: Console) -> ClientRun:
    """RemotePredictor (this process, core ``BENCH_CPU``) against a pinned server serving
    the models in ``workdir / "models"``."""
    import uvloop

    procs = Processes(workdir)
    try:
        _, url = start_predict_server(procs, "predict-server-client", workdir / "models")
        console.print(f"latency: RemotePredictor, {CALLERS} concurrent callers ...")
        with pin_this_thread(BENCH_CPU):
            return uvloop.run(measure_client(url, seconds))
    finally:
        procs.stop_all()
