"""bench.seeds: ratios paired by seed, median and range, on hand-made results."""

from __future__ import annotations

from typing import Any

from sluicegate.bench.seeds import median_range, paired_ratios, table


def run(policy: str, load: float, p90: float, rps: float) -> dict[str, Any]:
    lat = {"mean": p90, "p50": p90, "p90": p90, "p99": p90}
    return {
        "policy": policy,
        "load": load,
        "metrics": {"tpot_s": lat, "ntpot_s": lat, "e2e_s": lat, "throughput_rps": rps},
    }


def test_ratios_are_paired_by_seed_and_levels_must_be_in_every_seed() -> None:
    seeds = [
        {"seed": 0, "runs": [run("a", 500, 1.0, 100), run("b", 500, 2.0, 100)]},
        {"seed": 1, "runs": [run("a", 500, 3.0, 90), run("b", 500, 4.0, 100)]},
        {
            "seed": 2,
            "runs": [
                run("a", 500, 1.0, 100),
                run("b", 500, 1.0, 50),
                run("a", 400, 1.0, 1),  # only in this seed: left out
                run("b", 400, 1.0, 1),
            ],
        },
    ]
    ratios = paired_ratios(seeds, "a", "b")
    assert list(ratios) == [500]
    assert ratios[500]["e2e_s"] == [0.5, 0.75, 1.0]
    assert ratios[500]["throughput_rps"] == [1.0, 0.9, 2.0]
    assert median_range(ratios[500]["e2e_s"]) == "0.75 [0.50–1.00]"
    text = table(seeds, "a", "b")
    assert "(seeds 0, 1, 2)" in text
    assert (
        "| 500 | 0.75 [0.50–1.00] | 0.75 [0.50–1.00] | 0.75 [0.50–1.00] | 1.00 [0.90–2.00] |"
        in text
    )
