"""Ext_proc decisions per CPU-second with one and two picker replicas sharing state:
``python -m sluicegate.bench.extproc.replicas --redis-url URL``.

The question (issue: active-active replicas): do two ``sluicegate extproc`` replicas give
twice the decisions of one? On a 2-core machine that also runs the load client, the
simulated servers and Redis, wall-clock decisions per second cannot show it (the client
and the pickers share the cores). What can be measured is each replica's cost: decisions
per second of its own CPU time (``/proc``), with one replica and with two, both with
``sharedState`` on (prefix index, in-flight counts and waiting counts through Redis).
If two replicas each keep one replica's decisions per CPU-second, N cores give N times the
decisions of one (the rest of the fleet permitting). Each picker's CPU with no traffic
(scraping the replicas, the shared-state syncs: measured for a few seconds before the load)
is left out, as it does not grow with the decisions. The ratio printed is
``2 × per-replica rate with two ÷ rate with one``. One replica without ``sharedState`` is
measured too: what sharing costs per decision.

The pickers run pinned to ``PICKER_CPU`` (both, when two: their CPU time is what counts),
the client and the replicas on ``OTHER_CPU``, as in :mod:`~sluicegate.bench.extproc.decisions`
(``drive``: whole non-streamed requests as Envoy sends them, ``streams`` in flight in all,
split evenly over the replicas).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sluicegate.bench.extproc.decisions import IDLE_S, DecisionRun, drive
from sluicegate.bench.extproc.fleet import OTHER_CPU, picker, sim_pool
from sluicegate.bench.processes import Processes, cpu_seconds, load_average, pin_this_thread


def _shared_config(pool_config: Path, redis_url: str, key_prefix: str) -> Path:
    """The pool file with ``sharedState`` added to its GatewayConfig."""
    docs: list[dict[str, Any]] = list(yaml.safe_load_all(pool_config.read_text()))
    for doc in docs:
        if doc.get("kind") == "GatewayConfig":
            doc["spec"]["sharedState"] = {
                "redis": {"url": redis_url, "keyPrefix": key_prefix},
            }
    out = pool_config.with_name(f"pool-{key_prefix}.yaml")
    out.write_text(yaml.safe_dump_all(docs))
    return out


async def _drive_all(
    ports: Sequence[int], pids: Sequence[int], streams: int, seconds: float
) -> list[DecisionRun]:
    share = max(1, streams // len(ports))
    warmup = min(2.0, seconds / 3)
    return list(
        await asyncio.gather(
            *(
                drive(port, share, seconds, warmup, pid)
                for port, pid in zip(ports, pids, strict=True)
            )
        )
    )


def measure(
    redis_url: str | None, replicas: int, streams: int, seconds: float, run: int
) -> list[DecisionRun]:
    """One run: ``replicas`` pickers (with shared state when ``redis_url``) under
    ``streams`` streams in all; one DecisionRun per picker."""
    import uvloop

    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-extproc-replicas-") as tmp,
        pin_this_thread(OTHER_CPU),
    ):
        procs = Processes(Path(tmp))
        try:
            with sim_pool(procs, 1e-6) as pool, contextlib.ExitStack() as stack:
                config = pool.config
                if redis_url is not None:
                    config = _shared_config(config, redis_url, f"bench-{replicas}-{run}")
                running = [
                    stack.enter_context(picker(procs, config, name=f"extproc-{i}"))
                    for i in range(replicas)
                ]
                # Each picker's CPU with no traffic (scraping, the shared-state syncs): left
                # out of the rate, it does not depend on the decisions.
                cpu0 = [cpu_seconds(p.pid) for p in running]
                time.sleep(IDLE_S)
                idle = [
                    (cpu_seconds(p.pid) - c) / IDLE_S for p, c in zip(running, cpu0, strict=True)
                ]
                runs = uvloop.run(
                    _drive_all(
                        [p.grpc_port for p in running], [p.pid for p in running], streams, seconds
                    )
                )
                for r, share in zip(runs, idle, strict=True):
                    r.idle_share = share
                return runs
        finally:
            procs.stop_all()


def _net_rate(run: DecisionRun) -> float:
    """Decisions per CPU-second of the picker, its no-traffic CPU left out."""
    return 1e6 / run.net_cpu_us if run.net_cpu_us else 0.0


def _row(label: str, runs: Sequence[Sequence[DecisionRun]]) -> tuple[str, float]:
    """A table row over repeated runs: per-replica decisions per CPU-second net of the
    no-traffic CPU (median and range over runs of the replicas' mean), decisions/s in
    all, errors."""
    rates = [statistics.fmean(_net_rate(r) for r in one) for one in runs]
    walls = [sum(r.per_s for r in one) for one in runs]
    errors = sum(r.errors for one in runs for r in one)
    median = statistics.median(rates)
    cells = (
        f"| {label} | {median:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) "
        f"| {statistics.median(walls):,.0f} | {errors} |"
    )
    return cells, median


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.bench.extproc.replicas")
    parser.add_argument("--redis-url", required=True, help="a Redis server for sharedState")
    parser.add_argument("--streams", type=int, default=64, help="streams in flight in all")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds a run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    args = parser.parse_args(argv)
    before = load_average()
    cases: list[tuple[str, str | None, int]] = [
        ("1 replica, no sharedState", None, 1),
        ("1 replica, sharedState", args.redis_url, 1),
        ("2 replicas, sharedState (each)", args.redis_url, 2),
    ]
    results: dict[str, list[list[DecisionRun]]] = {label: [] for label, _, _ in cases}
    for k in range(args.repeats):  # interleaved: load drifts affect every case alike
        for label, url, n in cases:
            print(f"run {k + 1}/{args.repeats}: {label} ...", flush=True)
            results[label].append(measure(url, n, args.streams, args.seconds, k))
    lines = [
        "| pickers | decisions per CPU-second of each picker (net of idle), median (range) "
        "| decisions/s, all pickers | errors |",
        "|---|---|---|---|",
    ]
    medians: dict[str, float] = {}
    for label, _, _ in cases:
        row, medians[label] = _row(label, results[label])
        lines.append(row)
    one, two = medians[cases[1][0]], medians[cases[2][0]]
    ratio = 2 * two / one if one else 0.0
    lines += [
        "",
        f"Two replicas' capacity over one's (2 × per-replica rate with two ÷ rate with one, "
        f"medians): **{ratio:.2f} ×**. Load average before {before}, after {load_average()}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
