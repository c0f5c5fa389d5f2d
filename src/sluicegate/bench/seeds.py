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
from typing import Any

METRICS: tuple[tuple[str, str], ...] = (
    ("tpot_s", "p90 TPOT"),
    ("ntpot_s", "p90 NTPOT"),
    ("e2e_s", "p90 E2E"),
    ("throughput_rps", "throughput"),
)


def _value(metrics: dict[str, Any], key: str) -> float:
    value = metrics[key] if key == "throughput_rps" else metrics[key]["p90"]
    return float(value)


def paired_ratios(
    results: Sequence[dict[str, Any]], policy: str, base: str
) -> dict[float, dict[str, list[float]]]:
    """Per load level (present for both policies in every result), per metric key, the
    ratio ``policy / base`` of each result (one per seed), in the order given."""
    per_seed: list[dict[float, dict[str, float]]] = []
    for result in results:
        runs = {(r["policy"], r["load"]): r["metrics"] for r in result["runs"]}
        levels = {load for (p, load) in runs if p == policy and (base, load) in runs}
        per_seed.append(
            {
                level: {
                    key: _value(runs[policy, level], key) / _value(runs[base, level], key)
                    for key, _ in METRICS
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


def table(results: Sequence[dict[str, Any]], policy: str, base: str) -> str:
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
    results = [json.loads((Path(d) / "results.json").read_text()) for d in args.dirs]
    print(table(results, args.policy, args.base), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
