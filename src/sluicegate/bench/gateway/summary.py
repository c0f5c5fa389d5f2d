"""The gateway benchmark's runs summarized into the numbers its report shows.

Latency: every statistic of a (target, rate) is the median over its repeats
(:func:`latency_rows`), and what the gateway adds is through-gateway minus the baseline,
paired run by run (:func:`added_latency`). Throughput: the best run of each (router,
answer mode) — the capacity sought is a maximum, and other work on the machine can only
lower a rate (:func:`throughput_rows`) — and requests per CPU-second of the router
(:func:`per_core`), for ratios against vllm-router (:func:`rps_ratio`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.bench.gateway.latency import LatencyRun
from sluicegate.bench.gateway.settings import DIRECT_SCRAPED
from sluicegate.bench.gateway.throughput import ThroughputRun
from sluicegate.bench.loadgen import percentile


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
    """The gateway's own histogram: mean, p50, p99."""
    listen_overflows: int
    """Summed over the runs."""


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


def per_core(run: ThroughputRun) -> float | None:
    """Requests per CPU-second of the router: its req/s divided by the share of its core it
    got — what one whole core would do when other work took part of it."""
    if not run.router_cpu:
        return None
    return run.result.rps / run.router_cpu


def rps_ratio(
    a: ThroughputRun | None, b: ThroughputRun | None, normalized: bool = False
) -> float | None:
    """``a``'s req/s over ``b``'s (req per CPU-s with ``normalized``); None when a run or
    a number is missing."""
    if a is None or b is None:
        return None
    x, y = (per_core(a), per_core(b)) if normalized else (a.result.rps, b.result.rps)
    if x is None or not y:
        return None
    return x / y


def find_run(rows: Sequence[ThroughputRun], router: str, mode: str) -> ThroughputRun | None:
    """The row of ``router`` in answer mode ``mode``, if measured."""
    return next((r for r in rows if r.router == router and r.mode == mode), None)
