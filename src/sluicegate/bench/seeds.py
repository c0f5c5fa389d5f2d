"""Headline ratios over seeds: median and range of one policy's metric over another's.

``python -m sluicegate.bench.seeds --policy P --base B DIR...`` reads ``DIR/results.json``
of runs of the same scenario that differ only in ``--seed`` and prints, per load level
present in every run, the median [min–max] over the seeds of ``P``'s p90 TPOT, NTPOT and
E2E and its throughput, each divided by ``B``'s *of the same seed* (same request stream):
the form every headline ratio of the reports takes. The ratios are paired by seed because
the seed fixes the arrivals both policies see.

Headlines of another form name their metric: ``--metric PATH`` is a dotted path into a
run's ``metrics`` (``output_tokens_per_s``, ``ttft_s.mean``, ``by_class.Critical.ttft_s.mean``)
and ``--base-metric PATH`` the denominator's (default: the same path), so a ratio may also be
between two metrics of one run (``--base`` left out: the same policy). With neither ``--base``
nor ``--base-metric`` the values themselves are summarised (e.g. ``load_imbalance``).
``--flow-control on|off`` (``--base-flow-control``) picks the runs with flow control on or
off when a results file holds both arms of a policy; ``--peak`` divides each side's maximum
over the load levels (peak against peak) instead of pairing level by level.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, cast

MetricKey = Literal["tpot_s", "ntpot_s", "e2e_s", "throughput_rps"]

METRICS: tuple[tuple[MetricKey, str], ...] = (
    ("tpot_s", "p90 TPOT"),
    ("ntpot_s", "p90 NTPOT"),
    ("e2e_s", "p90 E2E"),
    ("throughput_rps", "throughput"),
)

PEAK = "peak"
"""The level key of a ``--peak`` summary (each side's maximum over the load levels)."""


class LatencySummary(TypedDict):
    """A latency in seconds as ``results.json`` summarises it (None: no request had one)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class RunMetrics(TypedDict):
    """The part of one run's ``metrics`` the default ratios read (the file holds more)."""

    tpot_s: LatencySummary
    ntpot_s: LatencySummary
    e2e_s: LatencySummary
    throughput_rps: float


class Run(TypedDict):
    """One ``runs[]`` entry of ``results.json``: a policy at a load level."""

    policy: str
    load: float
    flow_control: NotRequired[bool]
    metrics: RunMetrics


class Results(TypedDict):
    """The part of a ``results.json`` the ratios read."""

    seed: NotRequired[int]
    runs: list[Run]


class ResultsError(ValueError):
    """A results file lacks a value a ratio needs, holds two runs where one is meant, or the
    base's value is 0 (no ratio)."""


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a headline: ``policy``'s runs (flow control on, off, or ``None``: either,
    when the file holds one run per level) and the metric read from each, a dotted path
    into the run's ``metrics`` named ``label`` in messages."""

    policy: str
    path: str
    label: str
    flow_control: bool | None = None


def _default_sides(policy: str, base: str) -> list[tuple[Side, Side]]:
    """The four default ratios: p90 latencies (throughput as it is) of ``policy`` / ``base``."""
    pairs = []
    for key, label in METRICS:
        path = key if key == "throughput_rps" else f"{key}.p90"
        pairs.append((Side(policy, path, label), Side(base, path, label)))
    return pairs


def _where(result: Results, run: Run, label: str) -> str:
    return f"seed {result.get('seed')}: {run.get('policy')} at load {run.get('load')}: {label}"


def _value(result: Results, run: Run, side: Side) -> float:
    """``run``'s metric at ``side.path``: a :class:`ResultsError` naming the seed, policy,
    load and metric when it is missing or not a number (JSON is checked here, not trusted
    to match the types above)."""
    node: object = run.get("metrics")
    if not isinstance(node, dict):
        raise ResultsError(f"{_where(result, run, side.label)}: the run has no metrics")
    for part in side.path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise ResultsError(f"{_where(result, run, side.label)}: missing (got {node!r})")
    return float(node)


def _runs(result: Results, side: Side) -> dict[float, Run]:
    """``side``'s runs by load level; a :class:`ResultsError` when a level has two (both
    flow-control arms and ``side.flow_control`` is ``None``)."""
    chosen: dict[float, Run] = {}
    for run in result["runs"]:
        if run["policy"] != side.policy:
            continue
        if side.flow_control is not None and bool(run.get("flow_control")) != side.flow_control:
            continue
        if run["load"] in chosen:
            raise ResultsError(
                f"seed {result.get('seed')}: {side.policy} has two runs at load {run['load']} "
                "(flow control on and off): choose one with --flow-control / "
                "--base-flow-control"
            )
        chosen[run["load"]] = run
    return chosen


def _over(result: Results, base: Run, side: Side, numerator: float) -> float:
    denominator = _value(result, base, side)
    if denominator == 0:
        raise ResultsError(f"{_where(result, base, side.label)} is 0, so no ratio over it")
    return numerator / denominator


def _seed_values(
    result: Results, side: Side, base: Side | None, peak: bool
) -> dict[float | str, float]:
    """One seed's values per level (or under :data:`PEAK`): ``side``'s metric, divided by
    ``base``'s of the same level (or peak) when ``base`` is given."""
    runs = _runs(result, side)
    base_runs = _runs(result, base) if base is not None else {}
    if peak:
        if not runs or (base is not None and not base_runs):
            return {}
        top = max(runs.values(), key=lambda r: _value(result, r, side))
        value = _value(result, top, side)
        if base is None:
            return {PEAK: value}
        base_top = max(base_runs.values(), key=lambda r: _value(result, r, base))
        return {PEAK: _over(result, base_top, base, value)}
    levels = [level for level in runs if base is None or level in base_runs]
    values: dict[float | str, float] = {}
    for level in levels:
        value = _value(result, runs[level], side)
        values[level] = value if base is None else _over(result, base_runs[level], base, value)
    return values


def headline(
    results: Sequence[Results], side: Side, base: Side | None = None, peak: bool = False
) -> dict[float | str, list[float]]:
    """Per load level present in every result (or the single key :data:`PEAK`), the value
    of each result (one per seed, in the order given): ``side``'s metric over ``base``'s
    of the same seed and level, or ``side``'s metric alone without ``base``."""
    per_seed = [_seed_values(result, side, base, peak) for result in results]
    common = set.intersection(*(set(s) for s in per_seed)) if per_seed else set()
    keys: list[float | str] = sorted(level for level in common if not isinstance(level, str))
    keys += [PEAK] if PEAK in common else []
    return {level: [s[level] for s in per_seed] for level in keys}


def paired_ratios(
    results: Sequence[Results], policy: str, base: str
) -> dict[float, dict[MetricKey, list[float]]]:
    """Per load level (present for both policies in every result), per metric key, the
    ratio ``policy / base`` of each result (one per seed), in the order given; a
    :class:`ResultsError` when a value is missing or a base value is 0."""
    columns = {
        key: headline(results, side, base_side)
        for (key, _), (side, base_side) in zip(METRICS, _default_sides(policy, base), strict=True)
    }
    levels = sorted(float(level) for level in columns["tpot_s"])
    return {level: {key: columns[key][level] for key, _ in METRICS} for level in levels}


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


def _name(side: Side) -> str:
    arm = {None: "", True: " (flow control on)", False: " (flow control off)"}[side.flow_control]
    return f"`{side.policy}`{arm} {side.path}"


def headline_table(
    results: Sequence[Results], side: Side, base: Side | None = None, peak: bool = False
) -> str:
    """A Markdown table of :func:`headline`: median [min–max] and each seed's value."""
    seeds = ", ".join(str(r.get("seed")) for r in results)
    what = _name(side) if base is None else f"{_name(side)} / {_name(base)}"
    how = "peak against peak" if peak else "per level"
    lines = [
        f"{what}, {how}, paired by seed (seeds {seeds}): median [min–max]",
        "",
        "| load | median [min–max] | per seed |",
        "|---|---|---|",
    ]
    for level, values in headline(results, side, base, peak).items():
        cell = level if isinstance(level, str) else f"{level:g}"
        each = ", ".join(f"{v:.3g}" for v in values)
        lines.append(f"| {cell} | {median_range(values)} | {each} |")
    return "\n".join(lines) + "\n"


def _load(path: Path) -> Results:
    """``path`` parsed; a :class:`ResultsError` naming it when it cannot be read or is not a
    results file (an object with a ``runs`` list)."""
    try:
        data: object = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ResultsError(f"{path}: not a results file (no runs list)")
    return cast(Results, data)  # the runs' fields are checked as they are read


def _flow_control(value: str | None) -> bool | None:
    return None if value is None else value == "on"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.bench.seeds")
    parser.add_argument("dirs", nargs="+", help="folders holding results.json, one per seed")
    parser.add_argument("--policy", required=True)
    parser.add_argument("--base", help="the denominator's policy (default: --policy)")
    parser.add_argument("--metric", help="dotted path into a run's metrics, e.g. ttft_s.mean")
    parser.add_argument("--base-metric", help="the denominator's metric (default: --metric)")
    parser.add_argument("--flow-control", choices=("on", "off"), help="--policy's arm")
    parser.add_argument(
        "--base-flow-control",
        choices=("on", "off"),
        help="--base's arm (default: --flow-control when --base is left out)",
    )
    parser.add_argument("--peak", action="store_true", help="each side's maximum over levels")
    args = parser.parse_args(argv)
    custom = (args.base_metric, args.flow_control, args.base_flow_control, args.peak)
    if args.metric is None and any(custom):
        parser.error("--base-metric, --flow-control, --base-flow-control and --peak need --metric")
    if args.metric is None and args.base is None:
        parser.error("--base is required without --metric")
    try:
        results = [_load(Path(d) / "results.json") for d in args.dirs]
        if args.metric is None:
            text = table(results, args.policy, args.base)
        else:
            side = Side(args.policy, args.metric, args.metric, _flow_control(args.flow_control))
            base = None
            if args.base is not None or args.base_metric is not None:
                base_metric = args.base_metric or args.metric
                # Without --base the ratio is within the policy's own runs: same arm too.
                arm = args.base_flow_control or (None if args.base else args.flow_control)
                base = Side(args.base or args.policy, base_metric, base_metric, _flow_control(arm))
            text = headline_table(results, side, base, args.peak)
    except ResultsError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
