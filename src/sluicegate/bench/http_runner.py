"""HTTP mode of the benchmark lab: a scenario replayed against real processes.

For every (policy, load level) a fresh pool is started, on 127.0.0.1 only, on ports found
free at start:

- ``sluicegate sim``: one process running the scenario's N replicas on consecutive ports,
  with the scenario's engine profile (a built-in profile by name; a scenario's modified
  copy only when ``--num-gpu-blocks-override`` / ``--max-loras`` express the change, see
  :func:`sim_profile_args`), its model as ``--served-model-name``, ``--lora`` for each of
  its adapters, the run's seed, and ``--time-scale S``;
- in front of it ``sluicegate serve --config <generated YAML> --policy <policy>`` (pool
  ``sim-pool`` listing the replicas, the scenario's ``extra_docs`` and a ``GatewayConfig``,
  see :func:`gateway_documents`), or, for the policies of :data:`ROUTER_POLICIES`,
  ``vllm-router`` from ``.venv-bench/`` (``scripts/bench-setup``) over the same replicas;
- the workload is replayed by an asyncio load generator in this process (uvloop, aiohttp,
  one connection per request in flight) that streams every answer.

**Time scaling.** ``S`` is wall seconds per simulated second (0.25 = four times faster than
real time), the simulator's own ``--time-scale``. A request due at simulated time ``t`` is
sent at wall time ``t0 + t·S``; every instant the client observes (send, each streamed
token, end of stream) is converted back to simulated seconds as ``(wall − t0) / S``. So
all numbers in the results are simulated seconds, comparable with DES mode. What does not
scale (the gateway's processing, loopback networking, the client's parsing, Python's
scheduling noise: 1-3 ms of wall time per request) appears multiplied by ``1/S``; so does
the simulator's own step lateness (its driver carries each engine step's timer lateness,
up to ~1 ms of wall time, into the engine's clock). The smaller ``S``, the faster the run
and the larger those biases. Unless ``--time-scale`` says otherwise, :func:`pick_time_scale`
picks the smallest ``S`` ≥ 1 at which the plan's output token rate (from a DES run) stays
within what this machine streams faithfully; heavy scenarios run slower than real time.

**Gateway settings.** The discrete-event mode scrapes every 50 ms of simulated time and
treats metrics older than 1 s as stale (:class:`~sluicegate.bench.des.ClusterSpec`). The
generated ``GatewayConfig`` keeps those in simulated time: ``scrapeIntervalMs`` = 50·S
(but at least :data:`MIN_SCRAPE_INTERVAL_MS`, to bound the scraping CPU; below S = 0.2
the gateway's view is staler than the DES's) and ``metricsStalenessMs`` = 1000·S. SLO
headers (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) are multiplied by S on the wire, since the
gateway compares them with wall-clock latencies; SLO attainment is computed from the
converted latencies against the unscaled SLOs. Plugins and flow control with time
constants of their own (TTLs, decay, request TTL) still run on wall time. Flow control is
turned on as in DES mode (the pool's queueing annotation); vllm-router has none, so its
policies run with flow control off only.

Every process runs in its own process group with a deadline and is ended in ``finally``
(SIGTERM to the group, SIGKILL after a grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from sluicegate.bench.des import POOL, ClusterSpec, RequestRecord
from sluicegate.bench.gateway.routers import start_vllm_router, vllm_router_binary
from sluicegate.bench.gateway.settings import GATEWAY_CPU
from sluicegate.bench.metrics import latency_summary, summarize
from sluicegate.bench.processes import (
    Processes,
    cpu_seconds,
    free_port_block,
    http_get,
    wait_ready,
)
from sluicegate.bench.runner import RunPlan, entry_from_records, results_document, run_level
from sluicegate.bench.scenarios import Scenario, available_policies
from sluicegate.bench.workloads import RequestSpec, Workload
from sluicegate.flowcontrol.config import POOL_ANNOTATION
from sluicegate.sim.profiles import PROFILES, EngineProfile
from sluicegate.sim.text import PromptError, render_chat, render_prompt

Progress = Callable[[str], None]

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

SIM_CPU_WARNING = 0.8
"""Share of a core above which the simulator process is reported as CPU-bound."""

MIN_SCRAPE_INTERVAL_MS = 10.0
"""Floor of the gateway's scrape interval, in wall milliseconds. Scrapes are not free: the
simulator renders ``/metrics`` in 2.5-4 ms of CPU per replica, so a 4-replica pool
scraped every 50 ms costs it a third of a core (vllm-router does not scrape)."""

STARTUP_TIMEOUT_S = 30.0
"""Wall seconds each process gets to become ready."""

GRACE_S = 10.0
"""Wall seconds a run may last beyond its horizon (× S) before it is cut."""

_SLO_HEADERS = frozenset(
    {"x-slo-ttft-ms", "x-slo-tpot-ms", "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"}
)


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


# --------------------------------------------------------------------------- planning


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
    ``max_loras`` (``--max-loras``). Anything else raises
    :class:`UnsupportedScenarioError`: the simulator looks profiles up by name.
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
    raise UnsupportedScenarioError(
        f"engine profile {profile.name!r} is not a built-in profile, nor one with only its "
        "KV-cache size or LoRA slots changed; `sluicegate sim` cannot run it, so this "
        "scenario has no HTTP mode (use --mode des)"
    )


def _rewrites_models(scenario: Scenario) -> bool:
    """True when the scenario's InferenceModels map public names to other targets."""
    return any(doc.get("kind") == "InferenceModel" for doc in scenario.extra_docs)


def plan_policies(policies: Sequence[str], scenario: Scenario) -> tuple[list[str], list[str]]:
    """The policies of ``policies`` HTTP mode can run for ``scenario``, and a note saying
    why each other one is skipped."""
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
        elif policy in presets:
            runnable.append(policy)
        else:
            notes.append(f"{policy}: skipped, not available in this build")
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
            },
        },
    ]


# --------------------------------------------------------------------------- records


@dataclass(slots=True, eq=False)
class HttpRequestRecord(RequestRecord):
    """A :class:`~sluicegate.bench.des.RequestRecord` measured by the HTTP client.

    ``arrival`` is when the request was actually sent, ``first_token`` when the first
    streamed token arrived, ``finish`` when the stream ended; all in simulated seconds.
    """

    token_times: list[float] = field(default_factory=list)
    """Arrival of each streamed token (SSE event carrying generated text), simulated s."""
    lag: float = 0.0
    """How late the request was sent versus its schedule, simulated seconds."""

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies, simulated seconds: gaps between consecutive tokens."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


@dataclass(slots=True)
class EngineCounters:
    """Totals over the pool's engines, read from their ``/metrics`` at the end of a run."""

    prefix_queries: int = 0
    """Prompt tokens looked up in the prefix cache."""
    prefix_hits: int = 0
    """Prompt tokens found there."""
    preemptions: int = 0
    ttft_sum_s: float = 0.0
    """Sum of the engines' own time-to-first-token observations, simulated seconds."""
    ttft_count: int = 0
    tpot_sum_s: float = 0.0
    """Sum of the engines' own per-request time per output token, simulated seconds."""
    tpot_count: int = 0

    def engine_view(self) -> dict[str, float | None]:
        """Mean TTFT and TPOT on the engines' own clocks (simulated s): what the client
        measures, less transport and the router."""
        return {
            "ttft_mean_s": self.ttft_sum_s / self.ttft_count if self.ttft_count else None,
            "tpot_mean_s": self.tpot_sum_s / self.tpot_count if self.tpot_count else None,
        }


@dataclass(slots=True)
class HttpRunResult:
    """One HTTP run. Times in simulated seconds unless named ``wall``."""

    records: list[HttpRequestRecord]
    end_time: float
    endpoint_names: list[str]
    counters: EngineCounters
    time_scale: float
    router: str
    """``sluicegate`` or ``vllm-router``."""
    wall_s: float = 0.0
    """Wall seconds of the replay (processes' start and stop excluded)."""
    cpu: dict[str, float] = field(default_factory=dict)
    """Shares of one core used during the replay by ``sim`` and ``router`` (the
    processes), and ``load_average``: the machine's 1-minute load average at the end."""

    def warnings(self) -> list[str]:
        """Why this run's latencies may not be faithful."""
        out = []
        if self.cpu.get("sim", 0.0) > SIM_CPU_WARNING:
            out.append(
                f"the simulator used {self.cpu['sim']:.0%} of a core: its engines ran late, "
                "latencies are inflated"
            )
        cores = os.cpu_count() or 1
        if self.cpu.get("load_average", 0.0) > cores:
            out.append(
                f"load average {self.cpu['load_average']:.1f} on {cores} cores: the machine "
                "was busy, latencies are inflated"
            )
        return out


# --------------------------------------------------------------------------- processes


class ProcessGroups(Processes):
    """:class:`~sluicegate.bench.processes.Processes` whose :meth:`stop` ends the
    whole process group each one leads (every child started in its own session)."""

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout_s)
        _signal_group(proc.pid, signal.SIGKILL)  # anything the leader left behind


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _sluicegate(*args: str) -> list[str]:
    return [sys.executable, "-m", "sluicegate", "--log-level", "warning", *args]


def start_sim(
    procs: Processes, scenario: Scenario, time_scale: float, seed: int
) -> tuple[list[str], dict[int, int]]:
    """The scenario's pool as one ``sluicegate sim`` process; returns the replicas' URLs
    and replica index by port, once every replica answers ``/health``."""
    n = scenario.replicas
    base = free_port_block(n)
    cmd = _sluicegate(
        "sim",
        "--replicas",
        str(n),
        "--port",
        str(base),
        *sim_profile_args(scenario.profile),
        "--served-model-name",
        scenario.model,
        "--time-scale",
        repr(time_scale),
        "--seed",
        str(seed),
        *itertools.chain.from_iterable(("--lora", a) for a in scenario.adapters),
    )
    procs.start("sim", cmd)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(n)]
    for url in urls:
        wait_ready(procs, "sim", f"{url}/health", STARTUP_TIMEOUT_S)
    return urls, {base + i: i for i in range(n)}


def start_sluicegate(procs: Processes, config: Path, policy: str, seed: int, replicas: int) -> str:
    """``sluicegate serve`` on core ``GATEWAY_CPU`` (where ``start_vllm_router`` puts the
    peer); its base URL once ``/ready`` counts every replica. The simulator and the load
    generator are not pinned: on a shared machine a pinned simulator cannot dodge other
    load, which distorted its timing more than sharing cores with the router did."""
    port = free_port_block(1)
    cmd = _sluicegate("serve", "--config", str(config), "--policy", policy, "--port", str(port))
    procs.start("gateway", [*cmd, "--seed", str(seed)], GATEWAY_CPU)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        procs.check("gateway")
        status, body = http_get(f"{url}/ready", 1.0)
        if status == 200 and orjson.loads(body).get("ready_endpoints", 0) >= replicas:
            return url
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"gateway not ready with {replicas} endpoints after {STARTUP_TIMEOUT_S:.0f} "
                f"s:\n{procs.log('gateway')}"
            )
        time.sleep(0.05)


_COUNTER = re.compile(
    rb"^vllm:(prefix_cache_queries_total|prefix_cache_hits_total|num_preemptions_total"
    rb"|time_to_first_token_seconds_(?:sum|count)"
    rb"|request_time_per_output_token_seconds_(?:sum|count))(?:\{[^}]*\})? (\S+)$",
    re.MULTILINE,
)


def engine_counters(urls: Sequence[str]) -> EngineCounters:
    """Prefix-cache, preemption and latency totals over the replicas at ``urls`` (their
    ``/metrics``); a replica that does not answer counts zero."""
    out = EngineCounters()
    for url in urls:
        status, body = http_get(f"{url}/metrics", 5.0)
        if status != 200:
            continue
        for name, value in _COUNTER.findall(body):
            x = float(value)
            match name.decode():
                case "prefix_cache_queries_total":
                    out.prefix_queries += int(x)
                case "prefix_cache_hits_total":
                    out.prefix_hits += int(x)
                case "num_preemptions_total":
                    out.preemptions += int(x)
                case "time_to_first_token_seconds_sum":
                    out.ttft_sum_s += x
                case "time_to_first_token_seconds_count":
                    out.ttft_count += int(x)
                case "request_time_per_output_token_seconds_sum":
                    out.tpot_sum_s += x
                case _:
                    out.tpot_count += int(x)
    return out


# --------------------------------------------------------------------------- load generator


def wire_headers(spec: RequestSpec, time_scale: float) -> dict[str, str]:
    """The headers sent for ``spec``: its own, with SLOs (ms) scaled to wall time."""
    headers = {"Content-Type": "application/json"}
    for name, value in spec.all_headers().items():
        if name.lower() in _SLO_HEADERS:
            value = f"{float(value) * time_scale:g}"
        headers[name] = value
    return headers


def _prompt_bytes(spec: RequestSpec) -> bytes:
    """The prompt as the model server renders it (for the ideal prefix-hit rate)."""
    try:
        return render_chat(spec.messages) if spec.kind == "chat" else render_prompt(spec.prompt)
    except PromptError:
        return b""


def _error_reason(data: bytes) -> str:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or "")
    return ""


@dataclass(slots=True)
class Replay:
    """What :func:`replay` returns. Times in simulated seconds."""

    records: list[HttpRequestRecord]
    end_time: float
    cut: bool
    """True when the horizon (or the wall deadline) ended the run with work left."""
    wall_s: float


class _Client:
    """Sends one workload's requests and follows up on their answers."""

    def __init__(
        self,
        workload: Workload,
        base_url: str,
        time_scale: float,
        horizon_s: float,
        ports: dict[int, int],
    ) -> None:
        self.workload = workload
        self.base_url = base_url
        self.scale = time_scale
        self.horizon_s = horizon_s
        self.ports = ports
        self.loop = asyncio.get_running_loop()
        self.t0 = 0.0
        self.heap: list[tuple[float, int, RequestSpec]] = []
        self.order = itertools.count()
        self.wake = asyncio.Event()
        self.records: list[HttpRequestRecord] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.dropped = False

    def now(self) -> float:
        """Simulated seconds since the start (from ``time.perf_counter``: uvloop's
        ``loop.time()`` only advances in whole milliseconds)."""
        return (time.perf_counter() - self.t0) / self.scale

    def push(self, t: float, spec: RequestSpec) -> None:
        if t > self.horizon_s:
            self.dropped = True  # as in DES mode: nothing happens after the horizon
            return
        heapq.heappush(self.heap, (t, next(self.order), spec))
        self.wake.set()

    async def run(self, deadline_s: float) -> Replay:
        """Replay until everything is answered or ``deadline_s`` wall seconds pass."""
        loop = self.loop
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            clock = time.perf_counter
            self.t0 = clock() + 0.05
            for t, spec in self.workload.initial():
                self.push(t, spec)
            deadline = self.t0 + deadline_s
            while True:
                now = clock()
                while self.heap and self.t0 + self.heap[0][0] * self.scale <= now:
                    t, _, spec = heapq.heappop(self.heap)
                    record = HttpRequestRecord(spec, t)
                    self.records.append(record)
                    task = loop.create_task(self._send(session, record))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                if (not self.heap and not self.tasks) or now >= deadline:
                    break
                due = self.t0 + self.heap[0][0] * self.scale if self.heap else deadline
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), max(0.0, min(due, deadline) - now))
            cut = self.dropped or bool(self.heap) or bool(self.tasks)
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        last = max((r.finish for r in self.records if r.finish >= 0), default=0.0)
        return Replay(self.records, self.horizon_s if cut else last, cut, 0.0)

    def _ended(self, record: HttpRequestRecord, reply: str | None) -> None:
        """Hand the workload the request's outcome (as DES mode does when it ends)."""
        at = record.finish if reply is not None else self.now()
        for t, spec in self.workload.follow_up(record.spec, at, reply):
            self.push(t, spec)

    async def _send(self, session: aiohttp.ClientSession, record: HttpRequestRecord) -> None:
        spec = record.spec
        path = "/v1/chat/completions" if spec.kind == "chat" else "/v1/completions"
        body = orjson.dumps(spec.body())
        headers = wire_headers(spec, self.scale)
        scheduled = record.arrival
        record.arrival = self.now()
        record.lag = record.arrival - scheduled
        try:
            async with session.post(self.base_url + path, data=body, headers=headers) as resp:
                port = resp.headers.get("x-inference-port", "")
                record.endpoint = self.ports.get(int(port), -1) if port.isdigit() else -1
                if resp.status != 200:
                    record.reason = _error_reason(await resp.read())
                    record.status = resp.status
                elif spec.stream:
                    await self._read_stream(resp, record)
                else:
                    self._read_whole(await resp.read(), record)
        except (aiohttp.ClientError, OSError) as exc:
            record.status, record.reason = 502, f"client: {type(exc).__name__}"
        if record.completed:
            record.prompt_bytes = _prompt_bytes(spec)
            self._ended(record, record.reply)
        else:
            self._ended(record, None)
        self.wake.set()  # the main loop checks whether everything is done

    async def _read_stream(self, resp: aiohttp.ClientResponse, record: HttpRequestRecord) -> None:
        chat = record.spec.kind == "chat"
        parts: list[str] = []
        pending = b""
        done = False
        error: str | None = None
        error_status = 502
        usage: dict[str, Any] | None = None
        times = record.token_times
        async for chunk in resp.content.iter_any():
            now = self.now()
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data:"):
                    continue
                data = event[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    payload = orjson.loads(data)
                except orjson.JSONDecodeError:
                    error = "bad-event"
                    continue
                if "error" in payload:
                    err = payload["error"]
                    error = str(err.get("code", "error")) if isinstance(err, dict) else "error"
                    if isinstance(err, dict) and isinstance(err.get("code"), int):
                        error_status = err["code"]
                    continue
                choices = payload.get("choices")
                if choices:
                    choice = choices[0]
                    if chat:
                        delta = choice.get("delta") or {}
                        if "role" not in delta:
                            times.append(now)
                            parts.append(delta.get("content") or "")
                    else:
                        times.append(now)
                        parts.append(choice.get("text") or "")
                if payload.get("usage"):
                    usage = payload["usage"]
        record.finish = self.now()
        if times:
            record.first_token = times[0]
        if usage is not None:
            record.output_tokens = int(usage.get("completion_tokens", len(times)))
            record.prompt_tokens = int(usage.get("prompt_tokens", 0))
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = int(details.get("cached_tokens") or 0)
        else:
            record.output_tokens = len(times)
        if chat:
            record.reply = "".join(parts)
        if error is not None:
            record.status, record.reason = error_status, error
        elif not done or not times:
            record.status, record.reason = 502, "stream-truncated"
        else:
            record.status = 200

    def _read_whole(self, data: bytes, record: HttpRequestRecord) -> None:
        """A non-streamed answer: first token = finish = when it arrived."""
        record.finish = record.first_token = self.now()
        payload = orjson.loads(data)
        usage = payload.get("usage") or {}
        record.output_tokens = int(usage.get("completion_tokens", 0))
        record.prompt_tokens = int(usage.get("prompt_tokens", 0))
        record.cached_tokens = int(
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        )
        if record.spec.kind == "chat":
            choices = payload.get("choices") or [{}]
            record.reply = str((choices[0].get("message") or {}).get("content") or "")
        record.status = 200


async def replay(
    workload: Workload,
    base_url: str,
    time_scale: float,
    horizon_s: float,
    ports: dict[int, int],
    grace_s: float = GRACE_S,
) -> Replay:
    """Send ``workload``'s requests to ``base_url`` at their arrival times × ``time_scale``
    (wall s per simulated s) and follow up as they end, until all are answered or the
    simulated ``horizon_s`` passes (then + ``grace_s`` wall seconds at most). ``ports``
    maps a replica's port (its ``x-inference-port`` answer header) to its index."""
    client = _Client(workload, base_url, time_scale, horizon_s, ports)
    started = time.perf_counter()
    result = await client.run(horizon_s * time_scale + grace_s)
    result.wall_s = time.perf_counter() - started
    return result


def _run_async(coro: Any) -> Replay:
    try:
        import uvloop

        result: Replay = uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency
        result = asyncio.run(coro)
    return result


# --------------------------------------------------------------------------- runs


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
        result = _run_async(replay(workload, base, time_scale, horizon, ports))
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


def http_entry(
    scenario: Scenario, policy: str, level: float, result: HttpRunResult, wall_s: float
) -> dict[str, Any]:
    """The ``runs[]`` entry of one HTTP run: DES mode's, plus ``metrics.itl_s`` (inter-token
    latency over completed requests, simulated s), how late requests were sent
    (``send_lag_s``), the engines' own mean TTFT/TPOT (``engine_view``), CPU use
    (``cpu``) and what makes the run's latencies doubtful (``warnings``), the time scale
    and the router."""
    c = result.counters
    entry = entry_from_records(
        scenario,
        policy,
        level,
        result.records,
        result.endpoint_names,
        simulated_s=result.end_time,
        wall_s=wall_s,
        prefix_queries=c.prefix_queries,
        prefix_hits=c.prefix_hits,
        preemptions=c.preemptions,
    )
    done = [r for r in result.records if r.completed]
    entry["metrics"]["itl_s"] = latency_summary([g for r in done for g in r.itl])
    lags = [r.lag for r in result.records]
    entry["send_lag_s"] = {"mean": sum(lags) / len(lags), "max": max(lags)} if lags else None
    entry["engine_view"] = c.engine_view()
    entry["cpu"] = result.cpu
    entry["warnings"] = result.warnings()
    entry["time_scale"] = result.time_scale
    entry["router"] = result.router
    return entry


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


__all__ = [
    "ROUTER_POLICIES",
    "HttpOptions",
    "HttpRequestRecord",
    "HttpRunResult",
    "UnsupportedScenarioError",
    "gateway_documents",
    "http_entry",
    "pick_time_scale",
    "plan_policies",
    "replay",
    "run_level_http",
    "run_plan_http",
    "sim_profile_args",
]
