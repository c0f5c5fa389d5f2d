"""Gateway-replica headlines over seeds: ``python -m sluicegate.bench.replica_seeds DIR...``.

Reads ``DIR/results.json`` of runs of one scenario made with ``--gateway-replicas`` that
differ only in ``--seed``, and prints a Markdown table: for each policy, load level and
replica setting (count and state), the scenario's headline number
(:data:`~sluicegate.bench.goals_replicas.HEADLINES`: prefix hit rate, SLO attainment, or
Critical mean TTFT) as median [min–max] over the seeds, and beside it the same for its
difference from one replica *of the same seed* (same arrivals): relative for the hit rate
and TTFT, in points for attainment, plus how many seeds met the goal.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluicegate.bench.goals_replicas import HEADLINES

_Key = tuple[str, float, int, str]
"""Policy, load level, gateway replicas, replica state."""


def _spread(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "–"
    median = statistics.median(values)
    if len(values) == 1:
        return format(median, fmt)
    return f"{median:{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def summary(documents: Sequence[dict[str, Any]]) -> str:
    """The table for ``documents`` (one ``results.json`` per seed, one scenario)."""
    scenario = documents[0]["scenario"]
    if any(d["scenario"] != scenario for d in documents):
        raise ValueError("the results are of different scenarios")
    headline = HEADLINES.get(scenario)
    if headline is None:
        raise ValueError(f"scenario {scenario!r} has no replica headline")
    values: dict[_Key, list[float]] = {}
    deltas: dict[_Key, list[float]] = {}
    met: dict[_Key, list[bool]] = {}
    points = scenario == "slo-mixed"
    for doc in documents:
        runs = [r for r in doc["runs"] if bool(r.get("flow_control")) == headline.flow_control]
        one = {
            (r["policy"], float(r["load"])): r["metrics"]
            for r in runs
            if r.get("gateway_replicas", 1) == 1
        }
        for r in runs:
            n = int(r.get("gateway_replicas", 1))
            key = (r["policy"], float(r["load"]), n, str(r.get("replica_state", "independent")))
            value = headline.value(r["metrics"])
            if value is None:
                continue
            values.setdefault(key, []).append(value)
            base = one.get(key[:2])
            base_value = headline.value(base) if base is not None else None
            if n == 1 or base is None or base_value is None:
                continue
            delta = value - base_value if points else (value / base_value - 1 if base_value else 0)
            deltas.setdefault(key, []).append(delta * 100)
            if key[3] == "shared":
                ok = headline.ok(base, r["metrics"])
                met.setdefault(key, []).append(bool(ok))
    unit = "points" if points else "%"
    lines = [
        f"| policy | load | gateways | state | {headline.what.split(' ≥ ')[0].split(' ≤ ')[0]} "
        f"| vs one replica ({unit}) | goal met (seeds) |",
        "|---|---|---|---|---|---|---|",
    ]
    percent = scenario != "priority-overload"
    for key in sorted(values):
        policy, load, n, state = key
        shown = [v * 100 for v in values[key]] if percent else values[key]
        shown_value = _spread(shown, ".1f") + "%" if percent else _spread(shown, ".2f") + " s"
        shown_delta = _spread(deltas.get(key, []), "+.1f") if n > 1 else "–"
        seeds = met.get(key)
        goal = f"{sum(seeds)}/{len(seeds)}" if seeds else "–"
        state_label = state if n > 1 else "–"
        lines.append(
            f"| {policy} | {load:g} | {n} | {state_label} | {shown_value} | {shown_delta} "
            f"| {goal} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dirs", nargs="+", help="folders holding a results.json each")
    args = parser.parse_args(argv)
    documents = [json.loads((Path(d) / "results.json").read_text()) for d in args.dirs]
    print(summary(documents))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
