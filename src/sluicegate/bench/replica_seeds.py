"""Gateway-replica headlines over seeds: ``python -m sluicegate.bench.replica_seeds DIR...``.

Reads ``DIR/results.json`` of runs of one scenario made with ``--gateway-replicas`` that
differ only in ``--seed``, and prints a Markdown table: for each policy, load level and
replica setting (count and state), the scenario's headline number
(:data:`~sluicegate.bench.goals_replicas.HEADLINES`: prefix hit rate, SLO attainment, or
Critical mean TTFT) as median [min–max] over the seeds, and beside it the same for its
difference from one replica *of the same seed* (same arrivals): relative for the hit rate
and TTFT, in points for attainment, plus how many seeds met the goal.

``--noise DIR...`` adds the yardstick: one-replica runs of the same seeds made with
``--decision-seed`` (the same arrivals, other draws of the gateway), each compared with its
seed's one-replica run as the replica runs are: how far one replica moves from itself.
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


def noise_summary(documents: Sequence[dict[str, Any]], noise: Sequence[dict[str, Any]]) -> str:
    """The noise table: per policy and level, each ``noise`` run's difference from the
    one-replica run of its seed in ``documents`` (in the replica table's unit), and the
    largest of them in size."""
    scenario = documents[0]["scenario"]
    headline = HEADLINES.get(scenario)
    if headline is None:
        raise ValueError(f"scenario {scenario!r} has no replica headline")
    if any(d["scenario"] != scenario for d in noise):
        raise ValueError("the noise runs are of another scenario")
    points = scenario == "slo-mixed"
    setting = {(d["mode"], d["duration_s"], d.get("kv_event_delay_s")) for d in documents}
    if any(d.get("decision_seed") is not None for d in documents):
        raise ValueError("the replica runs are to be made without --decision-seed")
    for doc in noise:
        if doc.get("decision_seed") is None or doc["decision_seed"] == doc["seed"]:
            raise ValueError(f"seed {doc['seed']}: a noise run needs another --decision-seed")
        if (doc["mode"], doc["duration_s"], doc.get("kv_event_delay_s")) not in setting:
            raise ValueError(
                f"seed {doc['seed']}, decisions {doc['decision_seed']}: not run as the "
                "replica runs were (mode, duration, KV-event delay)"
            )

    def one_replica(r: dict[str, Any]) -> bool:
        flow = bool(r.get("flow_control")) == headline.flow_control
        return flow and r.get("gateway_replicas", 1) == 1

    base: dict[tuple[int, str, float], float] = {}
    for doc in documents:
        for r in filter(one_replica, doc["runs"]):
            value = headline.value(r["metrics"])
            if value is not None:
                base[(int(doc["seed"]), r["policy"], float(r["load"]))] = value
    deltas: dict[tuple[str, float], list[tuple[int, int, float]]] = {}
    for doc in noise:
        for r in filter(one_replica, doc["runs"]):
            value = headline.value(r["metrics"])
            one = base.get((int(doc["seed"]), r["policy"], float(r["load"])))
            if value is None or one is None or (not points and not one):
                continue  # (a relative change from nothing is no number)
            delta = value - one if points else value / one - 1
            deltas.setdefault((r["policy"], float(r["load"])), []).append(
                (int(doc["seed"]), int(doc["decision_seed"]), delta * 100)
            )
    unit = "points" if points else "%"
    lines = [
        f"| policy | load | one replica, another decision seed: vs its seed's run ({unit}) "
        "| largest |",
        "|---|---|---|---|",
    ]
    for (policy, load), found in sorted(deltas.items()):
        each = ", ".join(f"{d:+.1f} (seed {s}, decisions {k})" for s, k, d in sorted(found))
        largest = max(abs(d) for _, _, d in found)
        lines.append(f"| {policy} | {load:g} | {each} | {largest:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dirs", nargs="+", help="folders holding a results.json each")
    parser.add_argument(
        "--noise",
        nargs="+",
        default=[],
        metavar="DIR",
        help="one-replica runs of the same seeds with --decision-seed",
    )
    args = parser.parse_args(argv)
    documents = [json.loads((Path(d) / "results.json").read_text()) for d in args.dirs]
    print(summary(documents))
    if args.noise:
        noise = [json.loads((Path(d) / "results.json").read_text()) for d in args.noise]
        print()
        print(noise_summary(documents, noise))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
