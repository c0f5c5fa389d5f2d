"""Requests/s per core of the gateway behind its own HTTP server and behind libraries.

The throughput run of :mod:`sluicegate.bench.gateway.throughput` — the front server alone
on core ``GATEWAY_CPU``; ``wrk -t1`` and the nginx mock pool on ``OTHER_CPU``; rotating
~1 KB prompts over shared prefixes; JSON and SSE answers; the ``default`` and
``round-robin`` presets — with the front server as the variable: ``sluicegate serve``,
granian (RSGI) and uvicorn (httptools, ASGI), see :mod:`sluicegate.bench.gateway.servers`.
Runs are interleaved (every server once per round, restarted for every run) so that
other work on the machine falls on all of them alike; the share of its core each server
process tree used gives requests per CPU-second.

``--python`` is an interpreter that has granian and uvicorn installed (a separate venv:
they are not the project's dependencies) and the project's requirements; this module's
own interpreter only drives wrk and nginx::

    PYTHONPATH=$PWD/src SLUICEGATE_BENCH_NICE=-10 .venv/bin/python \\
        -m sluicegate.bench.gateway.server_compare --python /tmp/srvbench/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from sluicegate.bench.gateway.mock import start_mock
from sluicegate.bench.gateway.routers import write_pool_config
from sluicegate.bench.gateway.settings import (
    BODY_VARIANTS,
    GATEWAY_CPU,
    GATEWAY_POLICIES,
    OTHER_CPU,
    PREFIXES,
    completion_body,
    prompts,
)
from sluicegate.bench.loadgen import wrk, wrk_rotating_script
from sluicegate.bench.processes import (
    Processes,
    bench_nice,
    cpu_seconds,
    free_port_block,
    load_average,
    niceness,
    wait_ready,
)

SERVERS = ("sluicegate", "granian", "uvicorn")
MODES = ("json", "sse")


@dataclass(frozen=True, slots=True)
class Run:
    server: str
    policy: str
    mode: str
    round: int
    rps: float
    cpu: float
    """Share of its core the server's processes used (all threads, children too)."""
    p50_ms: float
    p99_ms: float
    errors: int
    """Non-2xx answers plus socket errors."""


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every living descendant (granian runs a worker child)."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            with contextlib.suppress(OSError):  # it exited meanwhile
                total += tree_cpu_seconds(int(child))
    return total


def server_command(python: str, server: str, config: Path, policy: str, port: int) -> list[str]:
    """The command of ``server``: a name of :data:`SERVERS`; for a library, ``+nowatch``
    appended leaves out the disconnect watcher, and for granian ``+NAME=VALUE`` appends
    a setting (e.g. ``granian+task_impl=rust``)."""
    common = ["--config", str(config), "--policy", policy, "--port", str(port)]
    name, *opts = server.split("+")
    if name == "sluicegate":
        return [python, "-m", "sluicegate", "--log-level", "warning", "serve", *common]
    extra = ["--no-disconnect-watch" if opt == "nowatch" else f"--granian={opt}" for opt in opts]
    return [python, "-m", "sluicegate.bench.gateway.servers", name, *common, *extra]


def versions(python: str) -> str:
    """Versions of the servers and their event loop/parser, in ``python``."""
    code = (
        "import importlib.metadata as m, sys; print(sys.version.split()[0], "
        "*(f'{p} {m.version(p)}' for p in ('granian','uvicorn','httptools','uvloop')), sep=', ')"
    )
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def measure(args: argparse.Namespace, workdir: Path) -> list[Run]:
    procs = Processes(workdir)
    runs: list[Run] = []
    bodies = prompts(BODY_VARIANTS, PREFIXES, seed=3)
    try:
        pool = start_mock(procs, workdir)
        configs = {}
        for mode in args.modes:
            configs[mode] = workdir / f"pool-{mode}.yaml"
            write_pool_config(configs[mode], pool.sse_urls if mode == "sse" else pool.json_urls)
        scripts = {
            mode: wrk_rotating_script(
                [completion_body(p, mode == "sse") for p in bodies], "/v1/completions"
            )
            for mode in args.modes
        }
        for rnd in range(args.rounds):
            for mode in args.modes:
                for policy in args.policies:
                    for server in args.servers:
                        run = one_run(procs, args, server, policy, mode, rnd, configs, scripts)
                        runs.append(run)
                        print(
                            f"round {rnd + 1} {mode} {policy} {server}: {run.rps:,.0f} req/s, "
                            f"cpu {run.cpu:.0%}, p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms, "
                            f"errors {run.errors}",
                            flush=True,
                        )
                        procs.check("nginx")
    finally:
        procs.stop_all()
    return runs


def one_run(
    procs: Processes,
    args: argparse.Namespace,
    server: str,
    policy: str,
    mode: str,
    rnd: int,
    configs: dict[str, Path],
    scripts: dict[str, str],
) -> Run:
    port = free_port_block(1)
    name = f"{server}-{policy}-{mode}-{rnd}"
    pid = procs.start(
        name, server_command(args.python, server, configs[mode], policy, port), GATEWAY_CPU
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(procs, name, f"{url}/ready")
        time.sleep(0.2)  # the first scrape of every endpoint
        wrk(url, scripts[mode], args.connections, args.warmup, OTHER_CPU)
        cpu0 = tree_cpu_seconds(pid)
        result = wrk(url, scripts[mode], args.connections, args.seconds, OTHER_CPU)
        cpu = (tree_cpu_seconds(pid) - cpu0) / result.seconds
    finally:
        procs.stop(name)
    return Run(
        server,
        policy,
        mode,
        rnd,
        result.rps,
        cpu,
        result.p50 * 1000,
        result.p99 * 1000,
        result.non_2xx + result.socket_errors,
    )


def table(runs: list[Run], servers: tuple[str, ...]) -> str:
    """Markdown: median (range) req/s, per CPU-s, p50/p99 per server, policy and mode;
    then ours against the best library, by median req per CPU-s."""
    lines = [
        "| answers | policy | server | req/s median (min … max) | req per CPU-s median "
        "(min … max) | server CPU | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    verdict = [
        "| answers | policy | sluicegate ÷ best library (per CPU-s) | best library | ≥ 1.15? |",
        "|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((r.mode, r.policy) for r in runs)
    for mode, policy in keys:
        per_cpu: dict[str, float] = {}
        for server in servers:
            rs = [r for r in runs if (r.mode, r.policy, r.server) == (mode, policy, server)]
            if not rs:
                continue
            rps = [r.rps for r in rs]
            pcs = [r.rps / r.cpu if r.cpu > 0 else r.rps for r in rs]
            per_cpu[server] = statistics.median(pcs)
            lines.append(
                f"| {mode} | {policy} | {server} | {statistics.median(rps):,.0f} "
                f"({min(rps):,.0f} … {max(rps):,.0f}) | {per_cpu[server]:,.0f} "
                f"({min(pcs):,.0f} … {max(pcs):,.0f}) | "
                f"{statistics.median([r.cpu for r in rs]):.0%} | "
                f"{statistics.median([r.p50_ms for r in rs]):.2f} | "
                f"{statistics.median([r.p99_ms for r in rs]):.2f} | "
                f"{sum(r.errors for r in rs)} |"
            )
        libs = {s: v for s, v in per_cpu.items() if s != "sluicegate"}
        if "sluicegate" in per_cpu and libs:
            best = max(libs, key=lambda s: libs[s])
            ratio = per_cpu["sluicegate"] / libs[best]
            verdict.append(
                f"| {mode} | {policy} | {ratio:.2f} | {best} | "
                f"{'**yes**' if ratio >= 1.15 else '**no**'} |"
            )
    return "\n".join([*lines, "", *verdict])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter of the servers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10, help="measured, per run")
    parser.add_argument("--warmup", type=int, default=2, help="s, per run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--servers",
        type=lambda s: tuple(s.split(",")),
        default=SERVERS,
        help="comma-separated; +nowatch, and granian settings as granian+NAME=VALUE",
    )
    parser.add_argument("--policies", type=lambda s: tuple(s.split(",")), default=GATEWAY_POLICIES)
    parser.add_argument("--modes", type=lambda s: tuple(s.split(",")), default=MODES)
    parser.add_argument("--out", type=Path, default=None, help="every run, as JSON")
    args = parser.parse_args(argv)
    print(f"servers' interpreter: {versions(args.python)}; load before: {load_average()}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluicegate-servers-") as tmp, niceness(bench_nice()):
        runs = measure(args, Path(tmp))
    print(f"load after: {load_average()}; {(time.monotonic() - started) / 60:.1f} min\n")
    print(table(runs, args.servers))
    if args.out is not None:
        args.out.write_bytes(orjson.dumps([asdict(r) for r in runs], option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
