"""bench.seeds: ratios paired by seed, median and range, on hand-made results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.bench.seeds import (
    LatencySummary,
    Results,
    ResultsError,
    Run,
    main,
    median_range,
    paired_ratios,
    table,
)


def run(policy: str, load: float, p90: float | None, rps: float) -> Run:
    lat: LatencySummary = {"mean": p90, "p50": p90, "p90": p90, "p99": p90}
    return {
        "policy": policy,
        "load": load,
        "metrics": {"tpot_s": lat, "ntpot_s": lat, "e2e_s": lat, "throughput_rps": rps},
    }


def test_ratios_are_paired_by_seed_and_levels_must_be_in_every_seed() -> None:
    seeds: list[Results] = [
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


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (run("a", 500, 1.0, 1), run("b", 500, 0.0, 1), "seed 3: b at load 500: p90 TPOT is 0"),
        (run("a", 500, 1.0, 1), run("b", 500, 1.0, 0), "seed 3: b at load 500: throughput is 0"),
        (run("a", 500, None, 1), run("b", 500, 1.0, 1), "seed 3: a at load 500: p90 TPOT: miss"),
        (run("a", 500, 1.0, 1), run("b", 500, None, 1), "seed 3: b at load 500: p90 TPOT: miss"),
    ],
)
def test_a_missing_or_zero_value_names_the_seed_run_and_metric(
    a: Run, b: Run, message: str
) -> None:
    with pytest.raises(ResultsError, match=message):
        paired_ratios([{"seed": 3, "runs": [a, b]}], "a", "b")


def test_a_run_without_the_metric_names_it() -> None:
    b = run("b", 500, 1.0, 1)
    del b["metrics"]["e2e_s"]  # type: ignore[misc]  # as a results.json of another version
    with pytest.raises(ResultsError, match="seed 3: b at load 500: p90 E2E: missing"):
        paired_ratios([{"seed": 3, "runs": [run("a", 500, 1.0, 1), b]}], "a", "b")


def test_the_command_exits_2_with_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(
        json.dumps({"seed": 0, "runs": [run("a", 5, 1.0, 1), run("b", 5, 1.0, 0)]})
    )
    with pytest.raises(SystemExit) as exit_:
        main(["--policy", "a", "--base", "b", str(tmp_path)])
    assert exit_.value.code == 2
    assert "seed 0: b at load 5: throughput is 0, so no ratio over it" in capsys.readouterr().err
