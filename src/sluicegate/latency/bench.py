"""How fast the latency predictor answers (``sluicegate bench micro latency``).

Models of production size (200 trees of depth ≤ 6, p90 objective) are trained on
synthetic samples shaped like a busy pool (:func:`synthetic_samples`), then:

- **in-process** — :meth:`InProcessPredictor.predict` for 10 and 100 candidate endpoints
  per call, one call at a time on one core (this process pinned to ``BENCH_CPU`` when it
  can be). Throughput is endpoint predictions per CPU-second of the calling thread
  (``time.thread_time``), so other load on the machine does not count against it; the
  per-call wall time (``time.perf_counter_ns``) gives the latency a request sees.
- **one prediction-server process** — ``sluicegate predictor predict-server`` pinned to
  core ``SERVER_CPU``, loaded from the trained model files, driven by ``wrk`` (one thread,
  ``WRK_CONNECTIONS`` connections, on the other core) with ``POST /predict/bulk/strict``
  bodies of 10 or 100 rows. Throughput per server core = requests answered / CPU-seconds
  the server used (from ``/proc``); achieved requests/s are shown beside it.
- **through RemotePredictor** — this process (other core) with ``CALLERS`` concurrent
  callers, each asking for 10 endpoints in a loop: calls/s, HTTP requests/s (what
  coalescing merged) and the per-call latency.

Nothing here asserts; the report says which goals are met.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from rich.console import Console

from sluicegate.clock import ManualClock
from sluicegate.latency.features import FeatureRow, Sample
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.model import ModelBundle, TrainConfig, TrainingData, train_bundle
from sluicegate.latency.store import SampleStore
from sluicegate.latency.wire import row_to_json

SERVER_CPU = 1
"""The core of the prediction server (and of this process for the in-process runs)."""
BENCH_CPU = 0
"""The core of wrk and of the RemotePredictor run."""
WRK_CONNECTIONS = 16
CALLERS = 32
ENDPOINTS = (10, 100)
GOAL_INPROCESS = 25_000
"""Endpoint predictions per second on one core, in-process."""
GOAL_SERVER = 3_000
"""Requests of 10 endpoints per second through one prediction-server process."""
GOAL_P99_MS = 1.0


# --------------------------------------------------------------------------- data


TTFT_SIGMA = 0.25
TPOT_SIGMA = 0.15


def oracle_p90_mape(sigma: float) -> float:
    """MAPE of a perfect p90 predictor under log-normal noise of ``sigma`` (what the
    trained models' held-out MAPE should be compared with)."""
    z = np.random.default_rng(0).normal(0.0, sigma, 1_000_000)
    return float(np.mean(np.abs(np.exp(1.2815516 * sigma - z) - 1.0)))


def synthetic_samples(n: int, seed: int = 0) -> list[Sample]:
    """Samples of a busy pool of 8B-class replicas (prefill ≈ 12k tokens/s): TTFT is
    queueing + own prefill + prefill in flight + decode interference + KV pressure, TPOT
    grows with the batch and with prefills sharing it; log-normal noise (σ 0.25 / 0.15)."""
    rng = np.random.default_rng(seed)
    running = rng.integers(0, 65, n)
    busy = running / 64.0
    waiting = np.where(rng.random(n) < busy**3, rng.geometric(0.25, n), 0)
    decode = (running * rng.uniform(200, 1500, n)).astype(np.int64)
    kv = np.clip(decode / 120_000 + rng.normal(0.05, 0.05, n), 0.0, 1.0)
    prompt = np.exp(rng.uniform(np.log(32), np.log(16_000), n)).astype(np.int64)
    prefix = np.where(rng.random(n) < 0.4, rng.uniform(0.8, 1.0, n), rng.uniform(0, 0.3, n))
    prefill = (rng.random(n) < busy) * rng.integers(0, 40_000, n)
    since = rng.integers(0, 4, n)
    output = rng.integers(16, 2049, n)
    samples = []
    for i in range(n):
        row = FeatureRow(
            kv_cache_percentage=float(kv[i]),
            input_token_length=int(prompt[i]),
            num_request_waiting=int(waiting[i]),
            num_request_running=int(running[i]),
            prefill_tokens_in_flight=int(prefill[i]),
            decode_tokens_in_flight=int(decode[i]),
            prefix_cache_score=float(prefix[i]),
            dispatched_since_scrape=int(since[i]),
            expected_output_tokens=int(output[i]),
        )
        ttft = (
            12.0
            + row.effective_input_tokens / 12.0
            + row.prefill_tokens_in_flight / 12.0
            + 45.0 * row.num_request_waiting
            + 0.25 * row.num_request_running
            + max(0.0, row.kv_cache_percentage - 0.9) * 3000.0
        ) * float(np.exp(rng.normal(0, TTFT_SIGMA)))
        tpot = (
            7.0
            + 0.12 * row.num_request_running
            + row.decode_tokens_in_flight / 20_000.0
            + row.prefill_tokens_in_flight / 4000.0
        ) * float(np.exp(rng.normal(0, TPOT_SIGMA)))
        samples.append(Sample(row, ttft, tpot))
    return samples


def production_bundle(samples: Sequence[Sample]) -> tuple[ModelBundle, int, float]:
    """The bundle (production parameters) trained on ``samples`` through the stratified
    window, the window's TTFT size, and the training wall time in seconds."""
    store = SampleStore()
    for s in samples:
        store.add(s)
    started = time.perf_counter()
    bundle = train_bundle(TrainingData.snapshot(store), TrainConfig(), 0.0, 1)
    elapsed = time.perf_counter() - started
    assert bundle is not None
    return bundle, store.ttft.train_count, elapsed


def ttft_mape_by_half(bundle: ModelBundle, n: int = 20_000) -> tuple[float, float]:
    """TTFT MAPE on fresh samples below and above their median TTFT."""
    from sluicegate.latency.features import feature_matrix

    fresh = synthetic_samples(n, seed=99)
    y = np.array([s.ttft_ms for s in fresh])
    predicted = bundle.predict(feature_matrix([s.row for s in fresh])).ttft_ms
    ape = np.abs(predicted - y) / y
    fast = y < np.median(y)
    return float(ape[fast].mean()), float(ape[~fast].mean())


# --------------------------------------------------------------------------- in-process


@dataclass(frozen=True, slots=True)
class InProcessRun:
    endpoints: int
    calls: int
    cpu_s: float
    wall_ms: list[float]
    cpu_ms: list[float]
    """CPU time of each call (excludes time the thread was preempted)."""

    @property
    def predictions_per_cpu_s(self) -> float:
        return self.calls * self.endpoints / self.cpu_s

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.wall_ms, q))

    def cpu_percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.cpu_ms, q))


def measure_in_process(
    predictor: InProcessPredictor, rows: Sequence[Sequence[FeatureRow]], calls: int
) -> InProcessRun:
    """``calls`` predictions, one at a time, cycling through the row sets."""
    for i in range(min(200, calls)):  # warm up
        predictor.predict(rows[i % len(rows)])
    wall: list[float] = []
    cpu_each: list[float] = []
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    cpu_started = time.thread_time()
    for i in range(calls):
        batch = rows[i % len(rows)]
        started_cpu = cpu_clock()
        started = clock()
        predictor.predict(batch)
        ended = clock()
        cpu_each.append((cpu_clock() - started_cpu) / 1e6)
        wall.append((ended - started) / 1e6)
    cpu = time.thread_time() - cpu_started
    return InProcessRun(len(rows[0]), calls, cpu, wall, cpu_each)


def measure_wrapper(bundle: ModelBundle, rows: Sequence[Sequence[FeatureRow]], calls: int) -> float:
    """Endpoint predictions per CPU-second with ``Booster.inplace_predict`` itself (no
    fast path), for comparison."""
    from sluicegate.latency.features import feature_matrix

    boosters = [bundle.ttft.booster, bundle.tpot.booster if bundle.tpot else bundle.ttft.booster]
    started = time.thread_time()
    for i in range(calls):
        x = feature_matrix(rows[i % len(rows)])
        for booster in boosters:
            booster.inplace_predict(x, validate_features=False)
    return calls * len(rows[0]) / (time.thread_time() - started)


def booster_call_us(bundle: ModelBundle, calls: int) -> dict[int, float]:
    """CPU µs of one TTFT booster call for 1, 10, 100 and 1,000 rows."""
    from sluicegate.latency.features import feature_matrix

    out = {}
    for n in (1, 10, 100, 1000):
        x = feature_matrix([s.row for s in synthetic_samples(n, seed=n)])
        k = max(20, calls // max(1, n // 10))
        for _ in range(20):
            bundle.ttft.predict(x)
        started = time.thread_time()
        for _ in range(k):
            bundle.ttft.predict(x)
        out[n] = (time.thread_time() - started) / k * 1e6
    return out


# --------------------------------------------------------------------------- server


@dataclass(frozen=True, slots=True)
class ServerRun:
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


def _wrk_latency_ms(out: str, label: str) -> float:
    import re

    match = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    if match is None:
        return float("nan")
    value = float(match.group(1))
    return (
        value / 1000.0
        if match.group(2) == "us"
        else value * (1000.0 if match.group(2) == "s" else 1.0)
    )


def measure_server(
    model_dir: Path, workdir: Path, seconds: float, console: Console
) -> list[ServerRun]:
    """Throughput of one pinned ``predict-server`` process under wrk, per endpoint count."""
    from sluicegate.bench.loadgen import wrk_rotating_script
    from sluicegate.bench.processes import (
        Processes,
        cpu_seconds,
        free_port_block,
        http_get,
        wait_ready,
    )

    def booster_calls() -> int:
        status, body = http_get(f"{url}/status")
        return int(orjson.loads(body)["booster_calls"]) if status == 200 else 0

    from sluicegate.bench.sim_speed import run_wrk

    port = free_port_block(2)
    dead = port + 1  # nothing listens there: the server keeps the models it was given
    procs = Processes(workdir)
    runs = []
    try:
        pid = procs.start(
            "predict-server",
            [
                sys.executable,
                "-m",
                "sluicegate",
                "--log-level",
                "error",
                "predictor",
                "predict-server",
                "--port",
                str(port),
                "--training-server",
                f"http://127.0.0.1:{dead}",
                "--sync-interval",
                "3600",
                "--model-dir",
                str(model_dir),
            ],
            SERVER_CPU,
        )
        url = f"http://127.0.0.1:{port}"
        wait_ready(procs, "predict-server", f"{url}/readyz", 60.0)
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
            runs.append(
                ServerRun(
                    endpoints,
                    done,
                    elapsed,
                    cpu_used,
                    _wrk_latency_ms(out, "50"),
                    _wrk_latency_ms(out, "99"),
                    calls,
                )
            )
        return runs
    finally:
        procs.stop_all()


@dataclass(frozen=True, slots=True)
class ClientRun:
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


# --------------------------------------------------------------------------- report


def request_rows(count: int, endpoints: int, seed: int) -> list[list[FeatureRow]]:
    """``count`` scheduling requests' candidate rows: one prompt, ``endpoints`` endpoints."""
    pool = [s.row for s in synthetic_samples(count * endpoints, seed)]
    out = []
    for i in range(count):
        base = pool[i * endpoints]
        out.append(
            [
                FeatureRow(
                    r.kv_cache_percentage,
                    base.input_token_length,
                    r.num_request_waiting,
                    r.num_request_running,
                    r.prefill_tokens_in_flight,
                    r.decode_tokens_in_flight,
                    r.prefix_cache_score,
                    r.dispatched_since_scrape,
                    base.expected_output_tokens,
                )
                for r in pool[i * endpoints : (i + 1) * endpoints]
            ]
        )
    return out


def _pin(cpu: int) -> str:
    if (os.cpu_count() or 1) <= cpu or not hasattr(os, "sched_setaffinity"):
        return "not pinned"
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {cpu})
        return f"pinned to core {cpu}"
    return "not pinned"


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def report(quick: bool, console: Console, machine: str) -> str:
    """Markdown of ``sluicegate bench micro latency`` (at ``$SLUICEGATE_BENCH_NICE``, as
    the gateway benchmark: on a shared machine, ``-10`` (root) runs this process, the
    servers and wrk ahead of other work)."""
    from sluicegate.bench.processes import bench_nice, niceness

    nice = bench_nice()
    with niceness(nice):
        return _report(quick, console, machine, nice)


def _report(quick: bool, console: Console, machine: str, nice: int) -> str:
    n_samples = 30_000 if quick else 150_000
    calls = {10: 2_000 if quick else 20_000, 100: 500 if quick else 5_000}
    server_s = 3 if quick else 10
    load_before = _load()
    console.print(f"latency: {n_samples:,} synthetic samples, training production models ...")
    bundle, window, train_s = production_bundle(synthetic_samples(n_samples, seed=1))
    predictor = InProcessPredictor(ManualClock(), bundle=bundle)
    original_affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pinning = _pin(SERVER_CPU)
    in_process: list[InProcessRun] = []
    wrapper: dict[int, float] = {}
    try:
        call_us = booster_call_us(bundle, 500 if quick else 3000)
        for endpoints in ENDPOINTS:
            console.print(f"latency: in-process, {endpoints} endpoints per call ...")
            rows = request_rows(200, endpoints, seed=endpoints)
            in_process.append(measure_in_process(predictor, rows, calls[endpoints]))
            wrapper[endpoints] = measure_wrapper(bundle, rows, calls[endpoints] // 4)
    finally:
        if original_affinity is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, original_affinity)
    with tempfile.TemporaryDirectory(prefix="sluicegate-latency-bench-") as tmp:
        workdir = Path(tmp)
        bundle.save(workdir / "models")
        server_runs = measure_server(workdir / "models", workdir, server_s, console)
        client_run = _client_against_server(workdir, server_s, console)
    return _markdown(
        machine + (f"; every benchmark process at niceness {nice}" if nice else ""),
        quick,
        nice,
        n_samples,
        window,
        train_s,
        bundle,
        pinning,
        in_process,
        wrapper,
        call_us,
        server_runs,
        client_run,
        load_before,
        _load(),
    )


def _client_against_server(workdir: Path, seconds: float, console: Console) -> ClientRun:
    """RemotePredictor (this process, core ``BENCH_CPU``) against a pinned server."""
    from sluicegate.bench.processes import Processes, free_port_block, wait_ready

    port = free_port_block(2)
    procs = Processes(workdir)
    try:
        procs.start(
            "predict-server-client",
            [
                sys.executable,
                "-m",
                "sluicegate",
                "--log-level",
                "error",
                "predictor",
                "predict-server",
                "--port",
                str(port),
                "--training-server",
                f"http://127.0.0.1:{port + 1}",
                "--sync-interval",
                "3600",
                "--model-dir",
                str(workdir / "models"),
            ],
            SERVER_CPU,
        )
        url = f"http://127.0.0.1:{port}"
        wait_ready(procs, "predict-server-client", f"{url}/readyz", 60.0)
        console.print(f"latency: RemotePredictor, {CALLERS} concurrent callers ...")
        original = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        _pin(BENCH_CPU)
        try:
            import uvloop

            return uvloop.run(measure_client(url, seconds))
        finally:
            if original is not None:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, original)
    finally:
        procs.stop_all()


def _markdown(
    machine: str,
    quick: bool,
    nice: int,
    n_samples: int,
    window: int,
    train_s: float,
    bundle: ModelBundle,
    pinning: str,
    in_process: list[InProcessRun],
    wrapper: dict[int, float],
    call_us: dict[int, float],
    server_runs: list[ServerRun],
    client: ClientRun,
    load_before: str,
    load_after: str,
) -> str:
    def yes(ok: bool) -> str:
        return "met" if ok else "**not met**"

    ip_rows = [
        f"| {r.endpoints} | {r.calls:,} | {r.predictions_per_cpu_s:,.0f} | "
        f"{r.predictions_per_cpu_s / r.endpoints:,.0f} | {wrapper[r.endpoints]:,.0f} | "
        f"{r.percentile_ms(50):.3f} | {r.percentile_ms(99):.3f} | "
        f"{r.cpu_percentile_ms(99):.3f} | {statistics.fmean(r.wall_ms):.3f} |"
        for r in in_process
    ]
    sv_rows = [
        f"| {r.endpoints} | {r.rps_per_core:,.0f} | {r.rps_per_core * r.endpoints:,.0f} | "
        f"{r.rps:,.0f} | {r.server_cpu_s / r.seconds:.0%} | "
        f"{r.requests / max(1, r.booster_calls):.1f} | {r.latency_p50_ms:.2f} | "
        f"{r.latency_p99_ms:.2f} |"
        for r in server_runs
    ]
    ip10 = next(r for r in in_process if r.endpoints == 10)
    sv10 = next(r for r in server_runs if r.endpoints == 10)
    latency_rows, notes = _latency_goals(in_process, call_us, load_after)
    c_p50 = float(np.percentile(client.wall_ms, 50)) if client.wall_ms else float("nan")
    c_p99 = float(np.percentile(client.wall_ms, 99)) if client.wall_ms else float("nan")
    ttft, tpot = bundle.ttft, bundle.tpot
    halves = ttft_mape_by_half(bundle)
    scores = (
        f"held-out TTFT MAPE {_pct(ttft.mape)}, p90 coverage {_pct(ttft.coverage)}; "
        f"TPOT MAPE {_pct(tpot.mape if tpot else None)}, "
        f"coverage {_pct(tpot.coverage if tpot else None)} (a perfect p90 predictor would "
        f"score MAPE {_pct(oracle_p90_mape(TTFT_SIGMA))} and "
        f"{_pct(oracle_p90_mape(TPOT_SIGMA))} on this noise: p90s overshoot most requests). "
        f"The TTFT error sits with the fastest requests: on fresh samples, MAPE "
        f"{_pct(halves[0])} below the median TTFT and {_pct(halves[1])} above it"
    )
    return "\n".join(
        [
            "# Latency predictor speed",
            "",
            "How fast TTFT/TPOT predictions are made for the scheduler: in the gateway's "
            "process (`InProcessPredictor`), through one prediction-server process "
            "(`sluicegate predictor predict-server`), and through the gateway's client "
            "(`RemotePredictor`). Models are production-sized: 200 trees of depth ≤ 6 per "
            "target, p90 objective (`reg:quantileerror`), trained on synthetic samples of a "
            "busy pool (`sluicegate.latency.bench.synthetic_samples`). One call predicts TTFT "
            "and TPOT for every candidate endpoint of one request (one booster call per "
            "target, one thread).",
            "",
            "```",
            (f"SLUICEGATE_BENCH_NICE={nice} " if nice else "")
            + "sluicegate bench micro latency --out docs/benchmarks/latency.md"
            + (" --quick" if quick else ""),
            "```",
            "",
            f"Machine: {machine}. Load average {load_before} before, {load_after} after "
            "(other work shared this machine; throughput is per CPU-second of the measured "
            "thread or server process, so it is not charged for that).",
            "",
            f"Models: {n_samples:,} samples → {window:,} in the stratified window (TTFT); "
            f"training both targets took {train_s:.1f} s on one thread; {scores}.",
            "",
            "## Goals",
            "",
            "| goal | measured | |",
            "|---|---|---|",
            f"| ≥ {GOAL_INPROCESS:,} endpoint predictions/s in-process on one core | "
            f"{ip10.predictions_per_cpu_s:,.0f} (10 endpoints per call) | "
            f"{yes(ip10.predictions_per_cpu_s >= GOAL_INPROCESS)} |",
            f"| ≥ {GOAL_SERVER:,} requests × 10 endpoints/s through one server process | "
            f"{sv10.rps_per_core:,.0f} per server core-second | "
            f"{yes(sv10.rps_per_core >= GOAL_SERVER)} |",
            *latency_rows,
            "",
            *notes,
            "## In-process",
            "",
            f"`InProcessPredictor.predict(rows)` called back to back ({pinning}). "
            "Predictions/s = endpoint predictions per CPU-second of the calling thread; "
            "`inplace_predict` = the same work through `Booster.inplace_predict` (the Python "
            "wrapper) instead of the direct call `sluicegate.latency.xgbfast` makes; "
            "latencies are wall time per call (what one scheduling decision waits); "
            "p99 CPU = the 99th percentile of each call's CPU time (without the time the "
            "thread was preempted).",
            "",
            "| endpoints per call | calls | predictions/s | calls/s | "
            "predictions/s via inplace_predict | p50 ms | p99 ms | p99 CPU ms | mean ms |",
            "|---|---|---|---|---|---|---|---|---|",
            *ip_rows,
            "",
            "One TTFT booster call alone (CPU µs): "
            + ", ".join(f"{n:,} rows {us:,.0f}" for n, us in call_us.items())
            + ". Most of a small call is a fixed cost, so predicting the candidates of one "
            "request together matters, and so does merging requests: the prediction server "
            "makes one call for all requests handled in one event-loop turn "
            "(`sluicegate.latency.batching.TurnBatcher`), and `RemotePredictor` coalesces "
            "concurrent calls within 1 ms into one HTTP request.",
            "",
            "## One prediction-server process",
            "",
            f"The server pinned to core {SERVER_CPU}; wrk (1 thread, {WRK_CONNECTIONS} "
            f"connections) on core {BENCH_CPU} posting `/predict/bulk/strict` bodies of 10 or "
            "100 rows. Per core = requests answered per CPU-second the server used; achieved "
            "= requests per wall second (lower when wrk or other work competes for the "
            "cores); requests per call = how many requests the server's `TurnBatcher` "
            "predicted in one booster call per target, on average; wrk latencies are those of "
            f"a saturated server with {WRK_CONNECTIONS} requests in flight (queueing "
            "included).",
            "",
            "| endpoints per request | requests/s per core | endpoint predictions/s per core "
            "| achieved requests/s | server CPU | requests per call | wrk p50 ms | wrk p99 ms |",
            "|---|---|---|---|---|---|---|---|",
            *sv_rows,
            "",
            "## Through RemotePredictor",
            "",
            f"`RemotePredictor.predict_async` (10 endpoints) from {CALLERS} concurrent callers "
            f"in one process on core {BENCH_CPU}, against one server on core {SERVER_CPU}: "
            "concurrent calls within 1 ms share an HTTP request. Closed loop at saturation: "
            "latencies include the wait for the batch in flight.",
            "",
            "| calls/s | HTTP requests/s | calls per request | failed | p50 ms | p99 ms |",
            "|---|---|---|---|---|---|",
            f"| {client.calls / client.seconds:,.0f} | "
            f"{client.http_requests / client.seconds:,.0f} | "
            f"{client.calls / max(1, client.http_requests):.1f} | {client.failed} | "
            f"{c_p50:.2f} | {c_p99:.2f} |",
            "",
        ]
    )


def _latency_goals(
    in_process: list[InProcessRun], call_us: dict[int, float], load: str
) -> tuple[list[str], list[str]]:
    """Goal rows for the in-process added latency, and notes on what missed it."""
    rows: list[str] = []
    notes: list[str] = []
    for r in in_process:
        wall, cpu = r.percentile_ms(99), r.cpu_percentile_ms(99)
        ok = wall <= GOAL_P99_MS
        rows.append(
            f"| in-process added latency p99 ≤ {GOAL_P99_MS:g} ms ({r.endpoints} endpoints) | "
            f"{wall:.3f} ms wall, {cpu:.3f} ms CPU (p50 {r.percentile_ms(50):.3f} ms) | "
            f"{'met' if ok else '**not met**'} |"
        )
        if ok:
            continue
        if cpu <= GOAL_P99_MS:
            notes.append(
                f"At {r.endpoints} endpoints the calls' own CPU time stays under "
                f"{GOAL_P99_MS:g} ms at p99 ({cpu:.3f} ms); the wall-clock tail is time the "
                "thread spent preempted by other processes on this shared 2-core machine "
                f"(load average {load} at the end)."
            )
        else:
            both = 2 * call_us.get(r.endpoints, float("nan")) / 1000
            notes.append(
                f"At {r.endpoints} endpoints the work itself is too long for the goal: the "
                f"two 200-tree ensembles over {r.endpoints} rows take ≈ {both:.2f} ms of "
                f"CPU on one thread (p50 {r.percentile_ms(50):.3f} ms), so the p99 lands "
                f"above {GOAL_P99_MS:g} ms; meeting it would take prediction on more than one "
                "thread, or smaller models."
            )
    if notes:
        notes.append("")
    return rows, notes


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
