"""The agreement report's tables from the run folders beside this file.

    python docs/benchmarks/sim-vs-vllm/tables.py shared-prefix real=vllm des=des des-bytes=des-bytes

prints, for scenario S, per policy and side, the median and range over seeds of each metric
(folders ``{prefix}-S-seed{N}``), then the ratios between policies (median and range over
seeds of the per-seed ratio), whether the simulated ranking matches the real one where the
real policies differ by more than 10 %, and each simulated default/random ratio against the
real one (goal: within ±15 %).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
POLICIES = ("random", "round-robin", "default")
METRICS = {
    "TTFT p50 ms": lambda r: r["metrics"]["ttft_s"]["p50"] * 1e3,
    "TTFT p90 ms": lambda r: r["metrics"]["ttft_s"]["p90"] * 1e3,
    "E2E p50 ms": lambda r: r["metrics"]["e2e_s"]["p50"] * 1e3,
    "E2E p90 ms": lambda r: r["metrics"]["e2e_s"]["p90"] * 1e3,
    "prefix hit": lambda r: r["metrics"]["engine_prefix_hit_rate"],
    "req/s": lambda r: r["metrics"]["throughput_rps"],
    # the servers' own mean (their /metrics); the DES has no client-side extra: its TTFT
    "engine TTFT mean ms": lambda r: (
        r["engine_view"]["ttft_mean_s"] if r.get("engine_view") else r["metrics"]["ttft_s"]["mean"]
    )
    * 1e3,
}
PAIRS = (("default", "random"), ("round-robin", "random"), ("default", "round-robin"))


def runs(prefix: str, scenario: str) -> list[dict[str, dict[str, object]]]:
    """Per seed found: policy → its run."""
    out = []
    for folder in sorted(HERE.glob(f"{prefix}-{scenario}-seed*")):
        doc = json.loads((folder / "results.json").read_text())
        out.append({r["policy"]: r for r in doc["runs"]})
    return out


def spread(values: list[float], digits: int = 2) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main(scenario: str, sides: dict[str, str]) -> None:
    data = {side: runs(prefix, scenario) for side, prefix in sides.items()}
    print(f"seeds: " + ", ".join(f"{s} {len(v)}" for s, v in data.items()) + "\n")
    print("| policy | side | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for policy in POLICIES:
        for side, seeds in data.items():
            cells = []
            for fn in METRICS.values():
                values = [fn(s[policy]) for s in seeds]
                top = max(values)
                cells.append(spread(values, 3 if top < 1 else 2 if top < 10 else 1))
            print(f"| {policy} | {side} | " + " | ".join(cells) + " |")
    print()
    others = [s for s in data if s != "real"]
    head = " | ".join(others)
    print(f"| ratio | metric | real | {head} | same ranking as real? ({', '.join(others)}) "
          "| sim ratio ÷ real ratio − 1 |")
    print("|---|---|---|" + "---|" * len(others) + "---|---|")
    for a, b in PAIRS:
        for name, fn in METRICS.items():
            ratios = {
                side: [fn(s[a]) / fn(s[b]) if fn(s[b]) else float("nan") for s in seeds]
                for side, seeds in data.items()
            }
            real = statistics.median(ratios["real"])
            verdicts, errors = [], []
            for side in others:
                sim = statistics.median(ratios[side])
                if abs(real - 1) <= 0.10:
                    verdicts.append("n/a (real ≤ 10 %)")
                elif abs(sim - 1) <= 0.10 * 0.2:
                    verdicts.append("NO (tie)")
                else:
                    verdicts.append("yes" if (sim > 1) == (real > 1) else "NO")
                if (a, b) == ("default", "random"):
                    err = sim / real - 1
                    errors.append(f"{err * 100:+.0f} %" + (" ✗" if abs(err) > 0.15 else ""))
            cells = " | ".join(spread(ratios[s]) for s in others)
            print(f"| {a}/{b} | {name} | {spread(ratios['real'])} | {cells} | "
                  f"{', '.join(verdicts)} | {', '.join(errors)} |")


if __name__ == "__main__":
    main(sys.argv[1], dict(arg.split("=", 1) for arg in sys.argv[2:]))
