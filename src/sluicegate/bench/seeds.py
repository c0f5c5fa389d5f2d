"""Headline ratios over seeds: median and range of one policy's metric over another's.

``python -m sluicegate.bench.seeds --policy P --base B DIR...`` reads ``DIR/results.json``
of runs of the same scenario that differ only in ``--seed`` and prints, per load level
present in every run, the median [min–max] over the seeds of ``P``'s p90 TPOT, NTPOT and
E2E and its throughput, each divided by ``B``'s *of the same seed* (same request stream):
the form every headline ratio of the reports takes. The ratios are paired by seed because
the seed fixes the arrivals both policies see.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

MetricKey = Literal["tpot_s", "ntpot_s", "e2e_s", "throughput_rps"]

METRICS: tuple[tuple[MetricKey, str], ...] = (
    ("tpot_s", "p90 TPOT"),
    ("ntpot_s", "p90 NTPOT"),
    ("e2e_s", "p90 E2E"),
    ("throughput_rps", "throughput"),
)


class LatencySummary(TypedDict):
    """A latency in seconds as ``results.json`` summarises it (None: no request had one)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class RunMetrics(TypedDict):
    """The part of one run's ``metrics`` the ratios read (the file holds more)."""

    tpot_s: LatencySummary
    ntpot_s: LatencySummary
    e2e_s: LatencySummary
    throughput_rps: float


class Run(TypedDict):
    """One ``runs[]`` entry of ``results.json``: a policy at a load level."""

    policy: str
    load: float
    metrics: RunMetrics


class Results(TypedDict):
    """The part of a ``results.json`` the ratios read."""

    seed: NotRequired[int]
    runs: list[Run]


class ResultsError(ValueError):
    """A results file lacks a value a ratio needs, or the base's value is 0 (no ratio)."""


def _value(result: Results, run: Run, key: MetricKey, label: str) -> float:
    """``run``'s metric ``key`` (p90 of a latency): a :class:`ResultsError` naming the seed,
    policy, load and metric when it is missing or not a number (JSON is checked here, not
    trusted to match the types above)."""
    where = f"seed {result.get('seed')}: {run.get('policy')} at load {run.get('load')}: {label}"
    metrics: object = run.get("metrics")
    if not isinstance(metrics, dict):
        raise ResultsError(f"{where}: the run has no metrics")
    value: object = metrics.get(key)
    if key != "throughput_rps":
        value = value.get("p90") if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResultsError(f"{where}: missing (got {value!r})")
    return float(value)


def _ratio(result: Results, run: Run, base: Run, key: MetricKey, label: str) -> float:
    numerator = _value(result, run, key, label)
    denominator = _value(result, base, key, label)
    if denominator == 0:
        raise ResultsError(
            f"seed {result.get('seed')}: {base['policy']} at load {base['load']}: {label} "
            "is 0, so no ratio over it"
        )
    return numerator / denominator


def paired_ratios(
    results: Sequence[Results], policy: str, base: str
) -> dict[float, dict[MetricKey, list[float]]]:
    """Per load level (present for both policies in every result), per metric key, the
    ratio ``policy / base`` of each result (one per seed), in the order given; a
    :class:`ResultsError` when a value is missing or a base value is 0."""
    per_seed: list[dict[float, dict[MetricKey, float]]] = []
    for result in results:
        runs = {(r["policy"], r["load"]): r for r in result["runs"]}
        levels = {load for (p, load) in runs if p == policy and (base, load) in runs}
        per_seed.append(
            {
                level: {
                    key: _ratio(result, runs[policy, level], runs[base, level], key, label)
                    for key, label in METRICS
                }
                for level in levels
            }
        )
    common = set.intersection(*(set(s) for s in per_seed)) if per_seed else set()
    return {
        level: {key: [s[level][key] for s in per_seed] for key, _ in METRICS}
        for level in sorted(common)
    }


def median_range(values: Sequence[float]) -> str:
    """``median [min–max]`` with two decimals."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def table(results: Sequence[Results], policy: str, base: str) -> str:
    """A Markdown table of :func:`paired_ratios`, as median [min–max]."""
    seeds = ", ".join(str(r.get("seed")) for r in results)
    head = " | ".join(label for _, label in METRICS)
    lines = [
        f"`{policy}` / `{base}`, paired by seed (seeds {seeds}): median [min–max]",
        "",
        f"| load | {head} |",
        "|---" * (len(METRICS) + 1) + "|",
    ]
    for level, ratios in paired_ratios(results, policy, base).items():
        cells = " | ".join(median_range(ratios[key]) for key, _ in METRICS)
        lines.append(f"| {level:g} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.bench.seeds")
    parser.add_argument("dirs", nargs="+", help="folders holding results.json, one per seed")
    parser.add_argument("--policy", required=True)
    parser.add_argument("--base", required=True)
    args = parser.parse_args(argv)
    results: list[Results] = [json.loads((Path(d) / "results.json").read_text()) for d in args.dirs]
    try:
        text = table(results, args.policy, args.base)
    except ResultsError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
