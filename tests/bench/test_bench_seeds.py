"""bench.seeds: ratios paired by seed, median and range, on hand-made results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate.bench.seeds import (
    PEAK,
    LatencySummary,
    Results,
    ResultsError,
    Run,
    Side,
    headline,
    headline_table,
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


def arm(load: float, flow_control: bool, **metrics: object) -> Run:
    """A run of policy ``p`` whose metrics are ``metrics`` as given (any shape)."""
    return {"policy": "p", "load": load, "flow_control": flow_control, "metrics": metrics}  # type: ignore[typeddict-item]


def test_a_named_metric_between_classes_of_one_run_and_between_flow_control_arms() -> None:
    seeds: list[Results] = [
        {
            "seed": s,
            "runs": [
                arm(
                    140,
                    True,
                    out=90.0 + s,
                    by_class={"C": {"ttft": {"mean": 1.0}}, "S": {"ttft": {"mean": 10.0 - s}}},
                ),
                arm(
                    140,
                    False,
                    out=100.0,
                    by_class={"C": {"ttft": {"mean": 5.0}}, "S": {"ttft": {"mean": 5.0}}},
                ),
            ],
        }
        for s in (0, 1, 2)
    ]
    on = Side("p", "by_class.C.ttft.mean", "C", True)
    within = headline(seeds, on, Side("p", "by_class.S.ttft.mean", "S", True))
    assert within == {140: [0.1, 1 / 9, 0.125]}
    across = headline(seeds, Side("p", "out", "out", True), Side("p", "out", "out", False))
    assert across == {140: [0.9, 0.91, 0.92]}
    assert headline(seeds, Side("p", "out", "out", False)) == {140: [100.0, 100.0, 100.0]}
    with pytest.raises(ResultsError, match="seed 0: p has two runs at load 140"):
        headline(seeds, Side("p", "out", "out"))
    with pytest.raises(ResultsError, match=r"seed 0: p at load 140: x\.y: missing \(got None\)"):
        headline(seeds, Side("p", "x.y", "x.y", True))


def test_peak_against_peak_takes_each_sides_maximum_over_levels() -> None:
    def tput(policy: str, load: float, value: float) -> Run:
        return {"policy": policy, "load": load, "metrics": {"out": value}}  # type: ignore[typeddict-item]

    seeds: list[Results] = [
        {
            "seed": 0,
            "runs": [
                tput("a", 40, 18.0),
                tput("a", 60, 17.0),
                tput("r", 40, 9.0),
                tput("r", 60, 10.0),
            ],
        },
        {"seed": 1, "runs": [tput("a", 40, 16.0), tput("a", 60, 20.0), tput("r", 40, 10.0)]},
    ]
    # seed 0: 18 / 10 (peaks at different levels); seed 1: 20 / 10 (r ran one level)
    assert headline(seeds, Side("a", "out", "out"), Side("r", "out", "out"), peak=True) == {
        PEAK: [1.8, 2.0]
    }
    text = headline_table(seeds, Side("a", "out", "out"), Side("r", "out", "out"), peak=True)
    assert "peak against peak" in text
    assert "| peak | 1.90 [1.80–2.00] | 1.8, 2 |" in text
    # level by level only the level every seed ran both at
    assert headline(seeds, Side("a", "out", "out"), Side("r", "out", "out")) == {40: [2.0, 1.6]}


def test_the_command_with_a_metric_and_its_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for s in (0, 1, 2):
        folder = tmp_path / str(s)
        folder.mkdir()
        runs = [arm(2, False, hit=0.8 + s / 100, ideal=0.9, imbalance=1.0 + s / 10)]
        folder.joinpath("results.json").write_text(json.dumps({"seed": s, "runs": runs}))
    dirs = [str(tmp_path / str(s)) for s in (0, 1, 2)]
    assert main(["--policy", "p", "--metric", "hit", "--base-metric", "ideal", *dirs]) == 0
    out = capsys.readouterr().out
    assert "`p` hit / `p` ideal, per level" in out
    assert "| 2 | 0.90 [0.89–0.91] |" in out
    assert main(["--policy", "p", "--metric", "imbalance", *dirs]) == 0
    assert "| 2 | 1.10 [1.00–1.20] | 1, 1.1, 1.2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--policy", "p", "--peak", *dirs])
    assert exit_.value.code == 2
    assert "need --metric" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--policy", "p", "--metric", "hit", str(tmp_path / "none")])
    assert exit_.value.code == 2
    assert "none/results.json" in capsys.readouterr().err
    (tmp_path / "0" / "results.json").write_text("[1, 2]")
    with pytest.raises(SystemExit) as exit_:
        main(["--policy", "p", "--metric", "hit", *dirs])
    assert exit_.value.code == 2
    assert "0/results.json: not a results file" in capsys.readouterr().err


def test_without_base_the_ratio_stays_in_the_policys_arm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [arm(140, True, c=1.0, s=10.0), arm(140, False, c=5.0, s=5.0)]
    (tmp_path / "results.json").write_text(json.dumps({"seed": 0, "runs": runs}))
    argv = ["--policy", "p", "--metric", "c", "--base-metric", "s", str(tmp_path)]
    assert main([*argv, "--flow-control", "on"]) == 0
    assert "| 140 | 0.10 [0.10–0.10] | 0.1 |" in capsys.readouterr().out
    assert main([*argv, "--flow-control", "on", "--base-flow-control", "off"]) == 0
    assert "| 140 | 0.20 [0.20–0.20] | 0.2 |" in capsys.readouterr().out
