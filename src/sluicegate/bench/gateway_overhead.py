"""What the gateway costs: added latency against a simulated pool, and requests/s on a core.

Two measurements, in processes pinned with ``taskset`` so that the router under test has
a core of its own (core 1) and everything else shares the other (core 0):

- :func:`measure_latency` — a ``sluicegate sim`` pool (4 replicas of profile ``tiny`` in
  one process, time scale 1, prefix caching off so that a replica's speed does not depend
  on where requests go) and an open-loop Poisson load generator (this process, uvloop +
  aiohttp, at most ``CLIENT_CONNECTIONS`` connections) on core 0; ``sluicegate serve`` on
  core 1. Streaming completions of one shape (~1 KB prompts, unique from their first
  byte, ``max_tokens`` 16, ``ignore_eos``) go straight to the replicas (round-robin), or
  straight to them while an idle gateway scrapes them (the baseline: replicas pay for
  being scraped either way), or through the gateway with each preset, at 200 and
  500 requests/s, in interleaved rounds with the same arrival times and prompts. Per
  request: TTFT (first SSE ``data:`` chunk) and end-to-end time, in seconds from the send.
  The gateway's own ``sluicegate_gateway_overhead_seconds`` histogram is read from
  ``/metrics`` before and after each run.
- :func:`measure_throughput` — the most requests/s a router sustains on one core: the
  router on core 1; ``wrk`` (one thread, ``Settings.connections`` connections, rotating
  ``BODY_VARIANTS`` bodies whose ~1 KB prompts share ``PREFIXES`` prefixes) and an nginx
  mock of four vLLM replicas (a fixed completion JSON, or a fixed SSE stream; static
  ``/metrics``, ``/v1/models``, ``/health``) on core 0. Routers: sluicegate (default and
  round-robin presets), ``vllm-router`` (``cache_aware`` and ``round_robin``, from
  ``.venv-bench/``), and wrk straight to one mock replica (the ceiling). py-spy then samples
  the saturated gateway to show where its core goes.

``scripts/bench-setup`` installs nginx, wrk, vllm-router and py-spy. Every process is
started with a deadline and stopped in ``finally``; only 127.0.0.1 is used. On a shared
machine, ``SLUICEGATE_BENCH_NICE=-10`` (root) runs every benchmark process, and its
scheduler autogroup, ahead of other work. :func:`report` renders the Markdown of
``sluicegate bench micro gateway``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from rich.console import Console

from sluicegate.bench.sim_speed import run_wrk

ROOT = Path(__file__).resolve().parents[3]
"""The repository (for ``.venv-bench/``)."""

MODEL = "tiny-llama"
SIM_PROFILE = "tiny"
SIM_REPLICAS = 4
SIM_PROCESSES = 1
"""Processes the simulated replicas run in (1 or ``SIM_REPLICAS``)."""
SIM_TIME_SCALE = 1.0
"""Wall seconds per simulated second of the latency pool (tiny: ~2 ms steps)."""
MAX_TOKENS = 16
PROMPT_BYTES = 1024
PREFIXES = 8
PREFIX_BYTES = 768
BODY_VARIANTS = 256
GATEWAY_CPU = 1
"""The core the router under test gets; everything else runs on core 0."""
OTHER_CPU = 0
GATEWAY_POLICIES = ("default", "round-robin")
ROUTER_POLICIES = ("cache_aware", "round_robin")
OVERHEAD_METRIC = "sluicegate_gateway_overhead_seconds"
CLIENT_CONNECTIONS = 128
"""Connections the latency load generator keeps at most (requests beyond wait for one)."""
DIRECT_SCRAPED = "direct, scraped"
"""The latency baseline: straight to the replicas while an idle gateway scrapes them (as
the gateways under test do), so both sides see the same scrape load."""

_WORDS = (
    "river stone lantern orbit copper meadow signal harbor velvet ember quartz willow "
    "canyon pixel thunder marble falcon garden silver anchor prism cobalt tundra beacon "
    "saffron glacier nimbus orchard ripple summit tangle voyage"
).split()


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class Settings:
    """How long and how often; every duration in seconds."""

    rates: tuple[int, ...] = (200, 500)
    """Offered load of the latency runs, requests/s."""
    latency_s: float = 10.0
    latency_warmup_s: float = 2.0
    throughput_s: int = 10
    throughput_warmup_s: int = 2
    connections: int = 64
    """wrk connections for the throughput runs."""
    latency_repeats: int = 5
    """Rounds of the latency runs (every target once per round); tables show medians."""
    repeats: int = 3
    """Runs of every throughput measurement; tables show the best run."""
    streaming_throughput: bool = True
    """Also measure requests/s with streamed answers (SSE mock), not just JSON ones."""
    profile_s: int = 10
    """py-spy sampling of the gateway under wrk load (0 = no profile)."""

    @classmethod
    def quick(cls) -> Settings:
        """A smoke run well under a minute: short runs, once each, JSON throughput only."""
        return cls(
            latency_s=1.5,
            latency_warmup_s=0.5,
            throughput_s=2,
            throughput_warmup_s=1,
            latency_repeats=1,
            repeats=1,
            streaming_throughput=False,
            profile_s=0,
        )


# --------------------------------------------------------------------------- processes


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(start, stop - count)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def bench_nice() -> int:
    """Scheduling niceness for every benchmark process, from ``$SLUICEGATE_BENCH_NICE``
    (default 0; negative values — ahead of other work on a shared machine — need root)."""
    try:
        value = int(os.environ.get("SLUICEGATE_BENCH_NICE", "0"))
    except ValueError:
        return 0
    if value < 0 and os.geteuid() != 0:
        return 0
    return max(-20, min(19, value))


def _autogroup_nice(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int | str, value: int) -> None:
    """Give ``pid``'s scheduler autogroup (its session, where the kernel groups tasks by
    session) niceness ``value``; with autogroups on, a process's own niceness only ranks it
    within its session. Does nothing where there are no autogroups."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(value))


@contextlib.contextmanager
def niceness(value: int) -> Iterator[None]:
    """Run this thread and its session — and every process started meanwhile — at
    ``value`` (processes started by :class:`Processes` get their own session; it sets
    theirs)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    group_before = _autogroup_nice("self")
    if value:
        os.setpriority(os.PRIO_PROCESS, 0, value)
        set_autogroup_nice("self", value)
    try:
        yield
    finally:
        if value:
            os.setpriority(os.PRIO_PROCESS, 0, before)
            if group_before is not None:
                set_autogroup_nice("self", group_before)


def pinned(cmd: Sequence[str], cpu: int | None) -> list[str]:
    """``cmd`` run on core ``cpu`` (via taskset, if there is one and a core is given)."""
    if cpu is None or shutil.which("taskset") is None or (os.cpu_count() or 1) <= cpu:
        return list(cmd)
    return ["taskset", "-c", str(cpu), *cmd]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Processes:
    """Subprocesses started for a measurement; :meth:`stop_all` ends every one of them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: Sequence[str], cpu: int | None = None) -> int:
        """Start ``cmd`` (pinned to ``cpu``) in its own session, output to ``name``.log."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - kept by the child
        try:
            proc = subprocess.Popen(
                pinned(cmd, cpu),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self.procs[name] = proc
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        if nice < 0:  # its own session is its own autogroup: rank that too
            set_autogroup_nice(proc.pid, nice)
        return proc.pid

    def log(self, name: str) -> str:
        """The last lines ``name`` printed."""
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-30:])

    def check(self, name: str) -> None:
        """Raise if ``name`` has exited."""
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; only the process this object started."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def listen_overflows() -> int:
    """The machine's count of connections dropped because a listen queue was full (Linux
    ``TcpExt: ListenOverflows``; every process's, not only ours; 0 where unknown)."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table.get("ListenOverflows", 0))
    return 0


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET (status 0 when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, TimeoutError):
        return 0, b""


def wait_ready(procs: Processes, name: str, url: str, timeout_s: float = 30.0) -> None:
    """Poll ``url`` until it answers 200; raise if ``name`` dies or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check(name)
        if http_get(url, 1.0)[0] == 200:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} not ready at {url} after {timeout_s:.0f} s:\n{procs.log(name)}")


# --------------------------------------------------------------------------- requests


def prompts(count: int, shared_prefixes: int = PREFIXES, seed: int = 0) -> list[str]:
    """``count`` prompts of ~``PROMPT_BYTES`` bytes. With ``shared_prefixes`` > 0, each is
    one of that many shared ``PREFIX_BYTES``-byte prefixes followed by a suffix of its own;
    with 0, every prompt differs from its first bytes on (no prefix is shared)."""
    rng = random.Random(seed)

    def text(size: int) -> str:
        out: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(_WORDS)
            out.append(word)
            length += len(word) + 1
        return " ".join(out)[:size]

    if shared_prefixes <= 0:
        return [f"#{seed}.{i} " + text(PROMPT_BYTES - 12) for i in range(count)]
    heads = [f"[{p}] " + text(PREFIX_BYTES - 4) for p in range(shared_prefixes)]
    return [
        heads[i % shared_prefixes] + f" #{i} " + text(PROMPT_BYTES - PREFIX_BYTES - 8)
        for i in range(count)
    ]


def completion_body(prompt: str, stream: bool) -> bytes:
    """A ``/v1/completions`` body: ``MAX_TOKENS`` tokens, ignoring EOS."""
    return orjson.dumps(
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": stream,
        }
    )


# --------------------------------------------------------------------------- latency


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest-rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(slots=True)
class LoadResult:
    """One open-loop run. Times in seconds."""

    rate: float
    wall_s: float
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    """How late each request was sent versus its schedule."""
    errors: Counter[str] = field(default_factory=Counter)
    generator_cpu: float = 0.0
    """Share of a core this process (the generator) used during the run."""

    @property
    def sent(self) -> int:
        return len(self.lag)

    @property
    def achieved_rate(self) -> float:
        """Requests sent per second of the run."""
        return self.sent / self.wall_s if self.wall_s else 0.0


async def open_loop(
    urls: Sequence[str], bodies: Sequence[bytes], rate: float, seconds: float, seed: int
) -> LoadResult:
    """Send streaming completions at Poisson arrivals of ``rate``/s for ``seconds`` s,
    round-robin over ``urls``; wait for every answer (each at most 30 s)."""
    rng = random.Random(seed)
    result = LoadResult(rate, seconds)
    timeout = aiohttp.ClientTimeout(total=30.0)
    # A bounded pool: when a server stalls, an unbounded one opens a burst of connections
    # that overflows its listen backlog, and each dropped SYN costs a 1 s retransmit.
    connector = aiohttp.TCPConnector(limit=CLIENT_CONNECTIONS)
    headers = {"Content-Type": "application/json"}
    loop = asyncio.get_running_loop()
    clock = time.perf_counter

    async def one(i: int, due: float) -> None:
        sent = clock()
        result.lag.append(sent - due)
        try:
            async with session.post(
                urls[i % len(urls)], data=bodies[i % len(bodies)], headers=headers
            ) as resp:
                ttft: float | None = None
                async for chunk in resp.content.iter_any():
                    if ttft is None and b"data:" in chunk:
                        ttft = clock() - sent
                done = clock() - sent
                if resp.status != 200:
                    result.errors[f"HTTP {resp.status}"] += 1
                elif ttft is None:
                    result.errors["no data"] += 1
                else:
                    result.ttft.append(ttft)
                    result.e2e.append(done)
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.errors[type(exc).__name__] += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks: set[asyncio.Task[None]] = set()
        cpu0 = time.process_time()
        start = clock() + 0.01
        due = start
        end = start + seconds
        i = 0
        while due < end:
            now = clock()
            if due > now:
                await asyncio.sleep(due - now)
            while due <= clock() and due < end:
                task = loop.create_task(one(i, due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        result.wall_s = clock() - start
        result.generator_cpu = (time.process_time() - cpu0) / result.wall_s
    return result


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram's cumulative buckets (upper bound, count), sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier``."""
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.total - earlier.total,
            self.count - earlier.count,
        )

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def quantile(self, q: float) -> float:
        """Linear interpolation within the bucket holding the ``q``-quantile (as PromQL's
        ``histogram_quantile``); NaN without observations."""
        if not self.count:
            return float("nan")
        rank = q * self.count
        lower_le, lower_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if le == float("inf"):
                    return lower_le
                span = n - lower_n
                return lower_le + (le - lower_le) * ((rank - lower_n) / span if span else 0.0)
            lower_le, lower_n = le, n
        return lower_le


def read_histogram(text: str, name: str) -> Histogram:
    """The unlabelled histogram ``name`` summed over label sets, from exposition ``text``."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    bucket = re.compile(rf'^{re.escape(name)}_bucket\{{(?:.*,)?le="([^"]+)".*\}} (\S+)$')
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = bucket.match(line)
        if m:
            le = float(m.group(1))
            buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
        elif line.startswith(f"{name}_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count += float(line.rsplit(" ", 1)[1])
    return Histogram(tuple(sorted(buckets.items())), total, count)


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


def _gateway_config(path: Path, urls: Sequence[str]) -> None:
    doc = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "bench-pool"},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "endpoints": [{"address": u, "name": f"replica-{i}"} for i, u in enumerate(urls)],
        },
    }
    path.write_bytes(orjson.dumps(doc))  # JSON is YAML


def start_gateway(procs: Processes, name: str, config: Path, policy: str) -> str:
    """``sluicegate serve`` on core ``GATEWAY_CPU``; returns its base URL once ready."""
    port = free_port_block(1)
    cmd = [
        sys.executable,
        "-m",
        "sluicegate",
        "--log-level",
        "warning",
        "serve",
        "--config",
        str(config),
        "--policy",
        policy,
        "--port",
        str(port),
    ]
    procs.start(name, cmd, GATEWAY_CPU)
    url = f"http://127.0.0.1:{port}"
    wait_ready(procs, name, f"{url}/ready")
    return url


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
        _gateway_config(config, replicas)
        for repeat in range(settings.latency_repeats):
            for target in LATENCY_TARGETS:
                console.print(f"latency: {target}, round {repeat + 1}/{settings.latency_repeats}")
                runs += _latency_target(procs, settings, target, repeat, replicas, config, sims)
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        procs.stop_all()
    return runs


LATENCY_TARGETS = ("direct", DIRECT_SCRAPED, *GATEWAY_POLICIES)
"""Straight to the replicas; the same with an idle gateway scraping them; through the
gateway with each preset."""


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


# --------------------------------------------------------------------------- nginx mock

MOCK_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",gpu_memory_utilization="0.92",num_gpu_blocks="8192"} 1.0
"""
"""What a mock replica's ``/metrics`` says: an idle vLLM 0.32 server (the lines the gateway
reads, copied from a real scrape)."""


def _mock_completion() -> bytes:
    return orjson.dumps(
        {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": " the quick brown fox jumps over the lazy dog again and again",
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 256, "total_tokens": 272, "completion_tokens": 16},
        }
    )


def _mock_stream() -> bytes:
    words = "the quick brown fox jumps over the lazy dog and then it runs far away home".split()
    events = []
    for i, word in enumerate(words[:MAX_TOKENS]):
        chunk = {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": " " + word,
                    "logprobs": None,
                    "finish_reason": "length" if i == MAX_TOKENS - 1 else None,
                    "stop_reason": None,
                }
            ],
        }
        events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


def _nginx_string(data: bytes) -> str:
    """``data`` as a single-quoted nginx string (no variables: ``$`` is not allowed)."""
    text = data.decode()
    if "$" in text:
        raise ValueError("nginx strings cannot hold '$' here")
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def nginx_config(workdir: Path, json_ports: Sequence[int], sse_ports: Sequence[int]) -> str:
    """An nginx configuration of mock vLLM replicas on 127.0.0.1: ``json_ports`` answer
    completions with one JSON body, ``sse_ports`` with one SSE stream; all serve static
    ``/metrics``, ``/v1/models`` and ``/health``. One process, in the foreground."""
    models = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": MODEL,
                    "object": "model",
                    "created": 1_700_000_000,
                    "owned_by": "vllm",
                    "root": MODEL,
                    "parent": None,
                    "max_model_len": 4096,
                }
            ],
        }
    )
    common = f"""
        location = /metrics {{
            default_type "text/plain; version=0.0.4; charset=utf-8";
            return 200 {_nginx_string(MOCK_METRICS.encode())};
        }}
        location = /v1/models {{
            default_type application/json;
            return 200 {_nginx_string(models)};
        }}
        location = /health {{ return 200; }}
        location = /version {{
            default_type application/json;
            return 200 '{{"version": "0.32.0"}}';
        }}
        location / {{ return 404; }}
"""

    def server(port: int, body: bytes, content_type: str) -> str:
        return f"""
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        location = /v1/completions {{
            default_type {content_type};
            return 200 {_nginx_string(body)};
        }}
        {common}
    }}"""

    servers = [server(p, _mock_completion(), "application/json") for p in json_ports]
    servers += [server(p, _mock_stream(), "text/event-stream") for p in sse_ports]
    tmp = workdir / "nginx-tmp"
    tmp.mkdir(exist_ok=True)
    return f"""
daemon off;
master_process off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{
    worker_connections 8192;
    multi_accept on;
}}
http {{
    access_log off;
    server_tokens off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    client_max_body_size 16m;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    {"".join(servers)}
}}
"""


@dataclass(frozen=True, slots=True)
class MockPool:
    """Mock replicas: base URLs answering JSON, and ones answering SSE."""

    json_urls: tuple[str, ...]
    sse_urls: tuple[str, ...]


def start_mock(procs: Processes, workdir: Path) -> MockPool:
    """Start nginx (core ``OTHER_CPU``) with ``SIM_REPLICAS`` JSON and SSE replicas each."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise RuntimeError("nginx is not installed (scripts/bench-setup installs it)")
    base = free_port_block(2 * SIM_REPLICAS)
    json_ports = list(range(base, base + SIM_REPLICAS))
    sse_ports = list(range(base + SIM_REPLICAS, base + 2 * SIM_REPLICAS))
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_config(workdir, json_ports, sse_ports))
    cmd = [nginx, "-p", str(workdir), "-e", str(workdir / "nginx-error.log"), "-c", str(conf)]
    procs.start("nginx", cmd, OTHER_CPU)
    pool = MockPool(
        tuple(f"http://127.0.0.1:{p}" for p in json_ports),
        tuple(f"http://127.0.0.1:{p}" for p in sse_ports),
    )
    for url in (*pool.json_urls, *pool.sse_urls):
        wait_ready(procs, "nginx", f"{url}/health", 10.0)
    return pool


# --------------------------------------------------------------------------- throughput


def wrk_rotating_script(bodies: Sequence[bytes], path: str) -> str:
    """A wrk Lua script POSTing JSON ``bodies`` to ``path`` in turn (one per request)."""
    for body in bodies:
        if b"]==]" in body:
            raise ValueError("a body holds the Lua long-string terminator")
    items = ",\n".join(f"[==[{b.decode()}]==]" for b in bodies)
    return (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"local bodies = {{\n{items}\n}}\n"
        "local n = #bodies\nlocal i = 0\n"
        "request = function()\n"
        "  i = i + 1\n"
        f'  return wrk.format(nil, "{path}", nil, bodies[(i % n) + 1])\n'
        "end\n"
    )


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclass(frozen=True, slots=True)
class WrkResult:
    """What one wrk run reports. Latencies in seconds."""

    requests: int
    seconds: float
    p50: float
    p90: float
    p99: float
    non_2xx: int
    socket_errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def parse_wrk(out: str) -> WrkResult:
    """Read wrk's ``--latency`` output."""
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", out)
    if m is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    seconds = float(m.group(2)) * _UNITS[m.group(3)]
    dist = {
        int(q): float(v) * _UNITS[u]
        for q, v, u in re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
    }
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return WrkResult(
        int(m.group(1)),
        seconds,
        dist.get(50, float("nan")),
        dist.get(90, float("nan")),
        dist.get(99, float("nan")),
        int(errors.group(1)) if errors else 0,
        sum(int(g) for g in sock.groups()) if sock else 0,
    )


def wrk(url: str, script: str, connections: int, seconds: int) -> WrkResult:
    """:func:`~sluicegate.bench.sim_speed.run_wrk` on core ``OTHER_CPU``, keeping the
    numbers of a run with failed requests (its ``non_2xx`` tells)."""
    try:
        _, _, out = run_wrk(url, script, connections, seconds, OTHER_CPU)
    except RuntimeError as exc:
        text = str(exc)
        if "requests failed" not in text:
            raise
        out = text.split("\n", 1)[1]
    return parse_wrk(out)


def vllm_router_binary() -> str | None:
    """``vllm-router`` from $SLUICEGATE_VLLM_ROUTER, ``.venv-bench/`` or the PATH."""
    env = os.environ.get("SLUICEGATE_VLLM_ROUTER")
    if env:
        return env if os.path.exists(env) else None
    local = ROOT / ".venv-bench" / "bin" / "vllm-router"
    if local.exists():
        return str(local)
    return shutil.which("vllm-router")


def py_spy_binary() -> str | None:
    """``py-spy`` from ``.venv-bench/`` or the PATH."""
    local = ROOT / ".venv-bench" / "bin" / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start_vllm_router(procs: Processes, name: str, urls: Sequence[str], policy: str) -> str:
    """``vllm-router --policy policy`` over ``urls`` on core ``GATEWAY_CPU``; its base URL.

    Its logs are at ``warning`` (ours print nothing per request either); its Prometheus
    exporter stays on (sluicegate records metrics too) on a port of its own.
    """
    binary = vllm_router_binary()
    if binary is None:
        raise RuntimeError("vllm-router is not installed (scripts/bench-setup installs it)")
    base = free_port_block(2)
    cmd = [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(base),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(base + 1),
        "--worker-urls",
        *urls,
        "--policy",
        policy,
        "--worker-startup-check-interval",
        "1",
        "--log-level",
        "warning",
    ]
    procs.start(name, cmd, GATEWAY_CPU)
    url = f"http://127.0.0.1:{base}"
    wait_ready(procs, name, f"{url}/v1/models")
    return url


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


ROUTERS: tuple[tuple[str, str, str], ...] = (
    ("direct", "", "direct (ceiling)"),
    *(("sluicegate", p, f"sluicegate {p}") for p in GATEWAY_POLICIES),
    *(("vllm-router", p, f"vllm-router {p}") for p in ROUTER_POLICIES),
)
"""(kind, policy, label) of every router the throughput runs compare."""


def start_router(
    procs: Processes, workdir: Path, kind: str, policy: str, urls: Sequence[str]
) -> str:
    """Start one router over ``urls``; returns the URL wrk should load."""
    if kind == "direct":
        return urls[0]
    name = f"{kind}-{policy}"
    if kind == "sluicegate":
        config = workdir / f"mock-{len(procs.procs)}-{time.monotonic_ns()}.yaml"
        _gateway_config(config, urls)
        return start_gateway(procs, name, config, policy)
    return start_vllm_router(procs, name, urls, policy)


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
                    summary = _profile_gateway(procs, workdir, settings, preset, urls, script)
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
        wrk(url, script, settings.connections, settings.throughput_warmup_s)
        cpu0 = cpu_seconds(pid) if pid else 0.0
        result = wrk(url, script, settings.connections, settings.throughput_s)
        share = (cpu_seconds(pid) - cpu0) / result.seconds if pid else None
        return ThroughputRun(label, mode, result, share)
    finally:
        if kind != "direct":
            procs.stop(name)


# --------------------------------------------------------------------------- profile

# Where a sample's time goes: the innermost frame whose file matches decides (frames of
# files matching none — the standard library, multidict, yarl, aiohttp's shared HTTP
# helpers — pass the sample on to their caller). Checked in order.
_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging", ("/logging/",)),
    ("metrics (prometheus_client, ours)", ("prometheus_client/", "sluicegate/metrics")),
    ("metric scrapes (collector, parser)", ("sluicegate/datalayer/",)),
    ("request parse + model lookup", ("sluicegate/requestcontrol/parse", "sluicegate/tokens")),
    (
        "routing (runtime, director, scheduler, prefix index)",
        (
            "sluicegate/runtime",
            "sluicegate/requestcontrol/",
            "sluicegate/scheduling/",
            "sluicegate/flowcontrol/",
            "sluicegate/latency/",
        ),
    ),
    ("proxy relay (ours)", ("sluicegate/gateway/proxy",)),
    ("request handler (ours)", ("sluicegate/gateway/app",)),
    (
        "aiohttp client",
        ("aiohttp/client", "aiohttp/connector", "aiohttp/tracing", "aiohttp/cookiejar"),
    ),
    ("aiohttp server", ("aiohttp/web_",)),
)
_OTHER = "event loop, transports, asyncio"


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    """A py-spy sampling of the gateway under wrk load. Shares are of non-idle samples."""

    samples: int
    errors: int
    cpu: float
    """Share of its core the gateway used while sampled."""
    rps: float
    categories: tuple[tuple[str, float], ...]
    top_self: tuple[tuple[str, float], ...]
    """Functions by share of samples spent in their own code (innermost frame)."""
    top_ours: tuple[tuple[str, float], ...]
    """sluicegate functions by share of samples with them on the stack."""


def _frame_file(frame: str) -> str:
    start = frame.rfind(" (")
    return frame[start + 2 : -1] if start >= 0 else frame


def _category(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        path = _frame_file(frame)
        for name, needles in _CATEGORIES:
            if any(n in path for n in needles):
                return name
    return _OTHER


def _short(frame: str) -> str:
    """``Function (pkg/module.py:123)`` without the line number."""
    return re.sub(r":\d+\)$", ")", frame)


@dataclass(frozen=True, slots=True)
class FoldedSummary:
    """Shares (0..1) of the samples in py-spy's folded (``raw``) output."""

    samples: int
    categories: tuple[tuple[str, float], ...]
    top_self: tuple[tuple[str, float], ...]
    top_ours: tuple[tuple[str, float], ...]


def summarize_folded(folded: str, top: int = 12) -> FoldedSummary:
    """Categories (see ``_CATEGORIES``), hottest functions by own time, and hottest
    sluicegate functions by time on the stack, from folded stacks (``a;b;c COUNT``)."""
    categories: Counter[str] = Counter()
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        categories[_category(frames)] += count
        own[_short(frames[-1])] += count
        for name in {_short(f) for f in frames if "sluicegate/" in _frame_file(f)}:
            if "sluicegate/cli.py" not in name and "sluicegate/__main__" not in name:
                ours[name] += count

    def shares(counter: Counter[str], limit: int | None) -> tuple[tuple[str, float], ...]:
        return tuple((k, v / total) for k, v in counter.most_common(limit)) if total else ()

    return FoldedSummary(total, shares(categories, None), shares(own, top), shares(ours, top))


def _profile_gateway(
    procs: Processes,
    workdir: Path,
    settings: Settings,
    preset: str,
    urls: Sequence[str],
    script: str,
) -> ProfileSummary | None:
    """py-spy (core ``OTHER_CPU``) samples the gateway while wrk saturates it."""
    spy = py_spy_binary()
    if spy is None:
        return None
    name = f"sluicegate-{preset}"
    url = start_router(procs, workdir, "sluicegate", preset, urls)
    try:
        pid = procs.procs[name].pid
        wrk(url, script, settings.connections, settings.throughput_warmup_s)
        out = workdir / f"profile-{preset}.txt"
        cmd = [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(settings.profile_s),
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            str(out),
        ]
        sampler = subprocess.Popen(
            pinned(cmd, OTHER_CPU), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            cpu0 = cpu_seconds(pid)
            result = wrk(url, script, settings.connections, settings.profile_s + 1)
            cpu = (cpu_seconds(pid) - cpu0) / result.seconds
            log, _ = sampler.communicate(timeout=settings.profile_s + 30)
        finally:
            if sampler.poll() is None:
                sampler.kill()
                sampler.wait()
        text = log.decode(errors="replace")
        m = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        if not out.exists():
            (workdir / f"profile-{preset}-failure.txt").write_text(text)
            return None
        folded = summarize_folded(out.read_text())
        return ProfileSummary(
            folded.samples,
            int(m.group(2)) if m else 0,
            cpu,
            result.rps,
            folded.categories,
            folded.top_self,
            folded.top_ours,
        )
    finally:
        procs.stop(name)


# --------------------------------------------------------------------------- report


def _ms(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1000:.2f}"


def _signed_ms(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1000:+.2f}".replace("-", "−")


def _us(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1e6:.0f}"


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{share:.0%}"


def _median(values: Sequence[float]) -> float:
    clean = [v for v in values if v == v]
    return statistics.median(clean) if clean else float("nan")


@dataclass(frozen=True, slots=True)
class LatencyRow:
    """One target at one rate, medians over repeats. Seconds; shares of a core."""

    target: str
    rate: int
    achieved_rate: float
    ttft: tuple[float, float, float]
    """p50, p90, p99."""
    e2e: tuple[float, float, float]
    errors: int
    lag_p99: float
    generator_cpu: float
    sim_cpu: float
    gateway_cpu: float | None
    overhead: tuple[float, float, float] | None
    listen_overflows: int
    """Summed over the runs."""
    """The gateway's own histogram: mean, p50, p99."""


def _samples(run: LatencyRun, which: str) -> list[float]:
    return run.load.ttft if which == "ttft" else run.load.e2e


def _quantiles(group: Sequence[LatencyRun], which: str) -> tuple[float, float, float]:
    """Median over ``group`` of each run's p50, p90 and p99 of ``which`` (ttft, e2e)."""
    p50, p90, p99 = (
        _median([percentile(_samples(r, which), q) for r in group]) for q in (0.5, 0.9, 0.99)
    )
    return p50, p90, p99


def latency_rows(runs: Sequence[LatencyRun]) -> list[LatencyRow]:
    """Median of every statistic over the repeats of each (target, rate)."""
    groups: dict[tuple[str, int], list[LatencyRun]] = {}
    for run in runs:
        groups.setdefault((run.target, run.rate), []).append(run)
    rows = []
    for (target, rate), group in groups.items():
        hist = [r.overhead for r in group if r.overhead is not None]
        overhead = None
        if hist:
            overhead = (
                _median([h.mean for h in hist]),
                _median([h.quantile(0.5) for h in hist]),
                _median([h.quantile(0.99) for h in hist]),
            )
        cpus = [r.gateway_cpu for r in group if r.gateway_cpu is not None]
        rows.append(
            LatencyRow(
                target,
                rate,
                _median([r.load.achieved_rate for r in group]),
                _quantiles(group, "ttft"),
                _quantiles(group, "e2e"),
                sum(sum(r.load.errors.values()) for r in group),
                _median([percentile(r.load.lag, 0.99) for r in group]),
                _median([r.load.generator_cpu for r in group]),
                _median([r.sim_cpu for r in group]),
                _median(cpus) if cpus else None,
                overhead,
                sum(r.listen_overflows for r in group),
            )
        )
    return rows


def added_latency(
    runs: Sequence[LatencyRun], target: str, rate: int, baseline: str = DIRECT_SCRAPED
) -> dict[str, tuple[float, float, float]]:
    """``target`` minus ``baseline`` for TTFT and end-to-end p50/p99, paired by repeat:
    median, lowest and highest over the repeats (seconds)."""
    direct = [r for r in runs if r.target == baseline and r.rate == rate]
    through = [r for r in runs if r.target == target and r.rate == rate]
    out: dict[str, tuple[float, float, float]] = {}
    for which in ("ttft", "e2e"):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            deltas = [
                percentile(_samples(g, which), q) - percentile(_samples(d, which), q)
                for d, g in zip(direct, through, strict=False)
            ]
            if deltas:
                out[f"{which} {name}"] = (_median(deltas), min(deltas), max(deltas))
    return out


def throughput_rows(runs: Sequence[ThroughputRun]) -> list[ThroughputRun]:
    """The best run (most req/s) of each (router, mode), in the order first seen: the
    capacity sought is a maximum, and other work on the machine can only lower a rate."""
    groups: dict[tuple[str, str], list[ThroughputRun]] = {}
    for run in runs:
        groups.setdefault((run.router, run.mode), []).append(run)
    return [max(group, key=lambda r: r.result.rps) for group in groups.values()]


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


def _goal(met: bool | None) -> str:
    return "not measured" if met is None else ("**met**" if met else "**not met**")


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
        "next to [vllm-router](https://pypi.org/project/vllm-router/) (a Rust router) on "
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
    lines += _render_latency(settings, rows, latency)
    lines += _render_throughput(settings, throughput)
    lines += _render_profiles(throughput)
    lines += _render_goals(rows, latency, throughput)
    return "\n".join(lines) + "\n"


def _row_order(row: LatencyRow) -> tuple[int, int]:
    order = LATENCY_TARGETS.index(row.target) if row.target in LATENCY_TARGETS else 99
    return row.rate, order


def _render_latency(
    settings: Settings, rows: Sequence[LatencyRow], runs: Sequence[LatencyRun]
) -> list[str]:
    lines = [
        "## Added latency, streaming, against a simulated pool",
        "",
        f"`sluicegate sim --replicas {SIM_REPLICAS // SIM_PROCESSES} --profile {SIM_PROFILE} "
        f"--time-scale {SIM_TIME_SCALE:g} --no-prefix-caching` "
        + (
            "(one process for all four replicas, "
            if SIM_PROCESSES == 1
            else f"({SIM_PROCESSES} processes, "
        )
        + "core 0; prefix caching off so that a replica's speed does not depend on which "
        "requests it gets). An open-loop "
        "load generator in the benchmark's process (uvloop + aiohttp, core 0) sends "
        f"streaming completions at Poisson arrivals: ~{PROMPT_BYTES} B prompts, each unique "
        f"from its first byte, `max_tokens` {MAX_TOKENS}, `ignore_eos`. Direct: round-robin "
        "over the replicas. Through the gateway: `sluicegate serve --config pool.yaml "
        "--policy PRESET` (core 1), default settings (metrics scraped every 50 ms). Each run: "
        f"{settings.latency_warmup_s:g} s warm-up, then {settings.latency_s:g} s measured; "
        "every target gets the same arrival times and prompts. TTFT = first SSE `data:` "
        "chunk, e2e = end of stream, both from the moment the request is sent; ms.",
        "",
        "| target | offered req/s | sent req/s | TTFT p50 | p90 | p99 | e2e p50 | p90 | p99 "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=_row_order):
        lines.append(
            f"| {r.target} | {r.rate} | {r.achieved_rate:.0f} | "
            + " | ".join(_ms(v) for v in (*r.ttft, *r.e2e))
            + f" | {r.errors} |"
        )
    lines += [
        "",
        "**Added by the gateway**: through-gateway minus the `direct, scraped` baseline "
        "(straight to the replicas while an idle gateway scrapes them every 50 ms, as the "
        "gateways under test do: a scrape of the simulator, ~40 KB of exposition rendered in "
        "Python, holds up the simulator's event loop for a couple of ms — the replicas' "
        "cost of being scraped, not time spent in the gateway); paired run by "
        "run, median of the runs with the lowest and highest in brackets; ms. The "
        "`scraping alone` rows are that scrape cost (`direct, scraped` minus `direct`). Then "
        "the gateway's own `sluicegate_gateway_overhead_seconds` histogram (handler entry to "
        "calling the upstream, estimated from its buckets), µs, and its CPU:",
        "",
        "| added by | req/s | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | in-gateway mean µs "
        "| p50 µs | p99 µs | gateway CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(added: dict[str, tuple[float, float, float]], key: str) -> str:
        if key not in added:
            return "–"
        mid, low, high = added[key]
        spread = (
            f" ({_signed_ms(low)} … {_signed_ms(high)})" if settings.latency_repeats > 1 else ""
        )
        return _signed_ms(mid) + spread

    keys = ("ttft p50", "ttft p99", "e2e p50", "e2e p99")
    for r in sorted(rows, key=_row_order):
        if r.target == "direct":
            continue
        if r.target == DIRECT_SCRAPED:
            added = added_latency(runs, DIRECT_SCRAPED, r.rate, "direct")
            label = "scraping alone"
        else:
            added = added_latency(runs, r.target, r.rate)
            label = f"gateway, {r.target}"
        overhead = r.overhead or (float("nan"),) * 3
        lines.append(
            f"| {label} | {r.rate} | "
            + " | ".join(cell(added, k) for k in keys)
            + " | "
            + " | ".join(_us(v) for v in overhead)
            + f" | {_pct(r.gateway_cpu)} |"
        )
    lines += [
        "",
        "Is the load generator keeping up? p99 lateness of a request's send versus its "
        "schedule, the generator's and the simulator's CPU (core 0 holds both); and "
        "connections the machine dropped on full listen queues during these runs (all "
        "processes', summed over the runs: each drop costs a client a 1 s SYN retransmit):",
        "",
        "| target | req/s | send lateness p99 ms | generator CPU | simulator CPU "
        "| listen-queue drops |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=_row_order):
        lines.append(
            f"| {r.target} | {r.rate} | {_ms(r.lag_p99)} | {_pct(r.generator_cpu)} | "
            f"{_pct(r.sim_cpu)} | {r.listen_overflows} |"
        )
    lines.append("")
    return lines


def per_core(run: ThroughputRun) -> float | None:
    """Requests per CPU-second of the router: its req/s divided by the share of its core it
    got — what one whole core would do when other work took part of it."""
    if not run.router_cpu:
        return None
    return run.result.rps / run.router_cpu


def _ratio(
    a: ThroughputRun | None, b: ThroughputRun | None, normalized: bool = False
) -> float | None:
    if a is None or b is None:
        return None
    x, y = (per_core(a), per_core(b)) if normalized else (a.result.rps, b.result.rps)
    if x is None or not y:
        return None
    return x / y


def _find(rows: Sequence[ThroughputRun], router: str, mode: str) -> ThroughputRun | None:
    return next((r for r in rows if r.router == router and r.mode == mode), None)


def _render_throughput(settings: Settings, results: ThroughputResults) -> list[str]:
    lines = [
        "## Maximum requests/s on one core",
        "",
        f"The router pinned to core 1; `wrk -t1 -c{settings.connections}` and nginx on core 0. "
        f"nginx mocks {SIM_REPLICAS} vLLM replicas (one process, `return 200` of a fixed "
        "body): `json` replicas answer a completion JSON (~400 B), `sse` replicas a stream of "
        f"{MAX_TOKENS} SSE events + `[DONE]` (~3.5 KB, one write); all serve a static "
        "`/metrics` (the load, KV and cache-config lines of a vLLM 0.32 scrape), "
        "`/v1/models` and `/health`. wrk rotates "
        f"{BODY_VARIANTS} bodies: ~{PROMPT_BYTES} B prompts over {PREFIXES} shared "
        f"{PREFIX_BYTES} B prefixes, so cache-aware policies match real prefixes. "
        f"{settings.throughput_warmup_s} s warm-up, {settings.throughput_s} s measured, the "
        "router restarted for every run. `direct` = wrk straight to one mock replica: the "
        "ceiling of the load generator and mock. vllm-router runs with `--log-level "
        "warning` and its defaults otherwise (its Prometheus exporter on, like ours).",
        "",
    ]
    for note in results.notes:
        lines += [f"> {note}", ""]
    rows = throughput_rows(results.runs)
    if not rows:
        return [*lines, "Nothing was measured.", ""]
    lines += [
        "`router CPU` is the share of its core the router process used (all threads); "
        "`req per CPU-s` = req/s ÷ that share, the rate one whole core would give when other "
        "work on the machine took part of it.",
        "",
        "| router | answers | req/s | latency p50 ms | p90 | p99 | router CPU | req per CPU-s "
        "| non-2xx | socket errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        w = r.result
        pc = per_core(r)
        lines.append(
            f"| {r.router} | {r.mode} | {w.rps:,.0f} | {_ms(w.p50)} | {_ms(w.p90)} | "
            f"{_ms(w.p99)} | {_pct(r.router_cpu)} | {'–' if pc is None else f'{pc:,.0f}'} | "
            f"{w.non_2xx} | {w.socket_errors} |"
        )
    if settings.repeats > 1:
        lines += ["", "Every run's req/s, in order:", ""]
        for key in {(r.router, r.mode): None for r in results.runs}:
            values = [f"{r.result.rps:,.0f}" for r in results.runs if (r.router, r.mode) == key]
            lines.append(f"- {key[0]} ({key[1]}): {', '.join(values)}")
    lines += [
        "",
        "Ratios (sluicegate ÷ vllm-router, best runs), of req/s and of req per CPU-s:",
        "",
        "| comparison | answers | req/s ratio | per CPU-s ratio | goal |",
        "|---|---|---|---|---|",
    ]
    for mode in dict.fromkeys(r.mode for r in rows):
        for ours, theirs, goal in (
            ("sluicegate default", "vllm-router cache_aware", 1.0),
            ("sluicegate round-robin", "vllm-router round_robin", 0.5),
            ("sluicegate default", "vllm-router round_robin", None),
        ):
            a, b = _find(rows, ours, mode), _find(rows, theirs, mode)
            ratio, norm = _ratio(a, b), _ratio(a, b, normalized=True)
            if ratio is None:
                continue
            verdict = "–" if goal is None else f"≥ {goal:g}: {_goal(ratio >= goal)}"
            if goal is not None and norm is not None:
                verdict += f" (per CPU-s: {_goal(norm >= goal)})"
            lines.append(
                f"| {ours} ÷ {theirs} | {mode} | {ratio:.2f} | "
                f"{'–' if norm is None else f'{norm:.2f}'} | {verdict} |"
            )
    lines.append("")
    return lines


def _render_profiles(results: ThroughputResults) -> list[str]:
    if not results.profiles:
        return []
    lines = [
        "## Where the gateway's core goes",
        "",
        "py-spy (`record --rate 100 --format raw`, on core 0) sampling the saturated gateway "
        "(wrk as above). A sample counts for the innermost frame that belongs to one of "
        "these groups; frames of the standard library, multidict, yarl and aiohttp's shared "
        "HTTP helpers pass it to their caller. Python frames only: time inside C code "
        "(uvloop, the HTTP parser, orjson) is charged to the Python frame that called it, "
        "and samples outside any handler (the event loop itself, transport writes) to "
        f"'{_OTHER}'.",
        "",
    ]
    names = list(results.profiles)
    header = "| share of samples | " + " | ".join(names) + " |"
    lines += [header, "|---|" + "---|" * len(names)]
    categories = dict.fromkeys(c for p in results.profiles.values() for c, _ in p.categories)
    for cat in categories:
        cells = []
        for p in results.profiles.values():
            share = dict(p.categories).get(cat, 0.0)
            cells.append(f"{share:.0%}")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    lines.append(
        "| *(samples; gateway CPU; req/s while sampled)* | "
        + " | ".join(
            f"{p.samples} ({p.errors} errors); {p.cpu:.0%}; {p.rps:,.0f}"
            for p in results.profiles.values()
        )
        + " |"
    )
    for name, p in results.profiles.items():
        lines += [
            "",
            f"Hottest functions, `{name}` — own time, then sluicegate functions by time on "
            "the stack:",
            "",
            "| own time | function | | on stack | sluicegate function |",
            "|---|---|---|---|---|",
        ]
        for i in range(max(len(p.top_self), len(p.top_ours))):
            a = p.top_self[i] if i < len(p.top_self) else ("", 0.0)
            b = p.top_ours[i] if i < len(p.top_ours) else ("", 0.0)
            lines.append(
                f"| {a[1]:.1%} | `{a[0]}` | | {b[1]:.1%} | `{b[0]}` |"
                if a[0] and b[0]
                else f"| {a[1]:.1%} | `{a[0]}` | | | |"
                if a[0]
                else f"| | | | {b[1]:.1%} | `{b[0]}` |"
            )
    lines.append("")
    return lines


def _render_goals(
    rows: Sequence[LatencyRow], runs: Sequence[LatencyRun], results: ThroughputResults
) -> list[str]:
    lines = ["## Goals", ""]
    for r in sorted(rows, key=lambda r: (r.target, r.rate)):
        if r.target in ("direct", DIRECT_SCRAPED):
            continue
        added = added_latency(runs, r.target, r.rate)
        p50 = added.get("e2e p50", (float("nan"),))[0]
        p99 = added.get("e2e p99", (float("nan"),))[0]
        t50 = added.get("ttft p50", (float("nan"),))[0]
        t99 = added.get("ttft p99", (float("nan"),))[0]
        ok50 = max(p50, t50) <= 0.001 if p50 == p50 else None
        ok99 = max(p99, t99) <= 0.005 if p99 == p99 else None
        lines.append(
            f"- Added latency (vs `direct, scraped`), `{r.target}` at {r.rate} req/s: "
            f"p50 {_signed_ms(t50)} ms TTFT / "
            f"{_signed_ms(p50)} ms e2e (≤ 1 ms: {_goal(ok50)}); p99 {_signed_ms(t99)} ms TTFT / "
            f"{_signed_ms(p99)} ms e2e (≤ 5 ms: {_goal(ok99)})."
        )
    tr = throughput_rows(results.runs)
    for mode in dict.fromkeys(r.mode for r in tr):
        parts = []
        for ours, theirs, goal in (
            ("sluicegate default", "vllm-router cache_aware", 1.0),
            ("sluicegate round-robin", "vllm-router round_robin", 0.5),
        ):
            a, b = _find(tr, ours, mode), _find(tr, theirs, mode)
            ratio, norm = _ratio(a, b), _ratio(a, b, normalized=True)
            text = f"{ours} ÷ {theirs} = " + ("–" if ratio is None else f"{ratio:.2f}")
            text += f" (≥ {goal:g}: {_goal(None if ratio is None else ratio >= goal)}"
            if norm is not None:
                text += f"; per CPU-s {norm:.2f}, {_goal(norm >= goal)}"
            parts.append(text + ")")
        lines.append(f"- Requests/s on one core ({mode} answers): " + "; ".join(parts) + ".")
    lines.append("")
    return lines
