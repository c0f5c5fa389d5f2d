"""Every scenario's quick variant, end to end: results shape, determinism, report files,
goal verdicts and the ``sluicegate bench`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluicegate import cli
from sluicegate.bench import goals, report
from sluicegate.bench.policies import available_policies
from sluicegate.bench.runner import RunPlan, run_plan
from sluicegate.bench.scenario_spec import Scenario
from sluicegate.bench.scenarios import SCENARIOS, get_scenario

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {"mean", "p50", "p90", "p99"}
METRIC_KEYS = {
    "requests",
    "completed",
    "failed",
    "shed",
    "window_s",
    "throughput_rps",
    "output_tokens_per_s",
    "goodput_rps",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "slo_attainment",
    "prefix_hit_rate",
}


def quick(name: str) -> tuple[Scenario, RunPlan]:
    scenario = get_scenario(name).quick_variant()
    policies = tuple(p for p in scenario.policies if p in available_policies())
    return scenario, RunPlan(scenario, policies, scenario.levels, scenario.duration_s, seed=0)


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    """The quick run of every scenario with the policies this build has (seed 0)."""
    return {name: run_plan(quick(name)[1]) for name in SCENARIOS}


def without_wall_time(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(results))
    for run in out["runs"]:
        del run["wall_s"]
    return out


def check_summary(block: Any) -> None:
    assert isinstance(block, dict)
    assert set(block) >= SUMMARY_KEYS
    values = [block[k] for k in ("mean", "p50", "p90", "p99")]
    if values[0] is None:
        assert all(v is None for v in values)
        return
    assert all(isinstance(v, float) and v >= 0 for v in values)
    assert block["p50"] <= block["p90"] <= block["p99"]


def check_metrics(m: dict[str, Any]) -> None:
    assert set(m) >= METRIC_KEYS
    for key in ("requests", "completed", "failed", "shed"):
        assert isinstance(m[key], int)
        assert m[key] >= 0
    assert m["completed"] + m["failed"] + m["shed"] <= m["requests"]
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        check_summary(m[key])
    assert m["slo_attainment"] is None or 0.0 <= m["slo_attainment"] <= 1.0
    assert 0.0 <= m["prefix_hit_rate"] <= 1.0
    assert m["throughput_rps"] >= 0
    assert m["output_tokens_per_s"] >= 0


def test_scenarios_have_quick_variants() -> None:
    assert set(SCENARIOS) == {
        "sharegpt-sweep",
        "shared-prefix",
        "multi-turn-chat",
        "slo-mixed",
        "priority-overload",
        "cache-pressure",
        "shared-prefix-qwen32b",
        "heterogeneous-pool",
    }
    for name in SCENARIOS:
        full, fast = get_scenario(name), get_scenario(name).quick_variant()
        assert fast.name == name
        assert fast.quick == {}
        assert fast.duration_s <= full.duration_s
        assert len(fast.levels) <= len(full.levels)
        assert fast.replicas <= full.replicas
    with pytest.raises(ValueError, match="unknown scenario"):
        get_scenario("no-such-scenario")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_quick_run_has_the_results_shape(results: dict[str, dict[str, Any]], name: str) -> None:
    res = results[name]
    scenario, plan = quick(name)
    assert res["scenario"] == name
    assert res["mode"] == "des"
    assert res["seed"] == 0
    assert json.loads(json.dumps(res, allow_nan=False)) == res
    runs = res["runs"]
    assert plan.policies
    assert len(runs) == plan.count
    assert {(r["policy"], r["load"]) for r in runs} == {
        (p, level) for p in plan.policies for level in plan.levels
    }
    for run in runs:
        assert set(run) >= {"policy", "qps", "concurrency", "metrics"}
        expected: tuple[float | None, int | None]
        if scenario.load_unit == "req/s":
            expected = (run["load"], None)
        elif scenario.load_unit == "concurrent streams":
            expected = (None, int(run["load"]))
        else:
            expected = (None, None)
        assert (run["qps"], run["concurrency"]) == expected
        m = run["metrics"]
        check_metrics(m)
        assert m["completed"] > 0
        assert m["failed"] == 0
        assert m["completed"] + m["shed"] + m["incomplete"] == m["requests"]
        assert isinstance(m["by_class"], dict)
        for klass in m["by_class"].values():
            check_metrics(klass)
        if m["by_class"]:
            assert len(m["by_class"]) >= 2
            assert sum(c["requests"] for c in m["by_class"].values()) == m["requests"]
        assert len(run["replicas"]) == scenario.replicas
        assert sum(r["requests"] for r in run["replicas"]) == m["completed"]


def test_classes_and_slos_where_the_scenario_has_them(results: dict[str, dict[str, Any]]) -> None:
    slo = results["slo-mixed"]["runs"][0]["metrics"]
    assert set(slo["by_class"]) == {"Standard", "Sheddable"}
    assert slo["slo_attainment"] is not None
    overload = results["priority-overload"]["runs"][0]["metrics"]
    assert set(overload["by_class"]) == {"Critical", "Standard", "Sheddable"}
    chat = results["multi-turn-chat"]["runs"]
    assert all("ideal_prefix_hit_rate" in r["metrics"] for r in chat)
    for name in ("sharegpt-sweep", "shared-prefix", "multi-turn-chat"):
        for run in results[name]["runs"]:
            assert run["metrics"]["by_class"] == {}
            assert run["metrics"]["slo_attainment"] is None


def test_sharegpt_results_say_how_much_of_the_dataset_was_recovered(
    results: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    for name in ("sharegpt-sweep", "multi-turn-chat"):
        dataset = results[name]["dataset"]
        assert dataset["name"] == "sharegpt"
        # The packaged file is truncated: fewer complete records than the original 90K+.
        assert 17_000 < dataset["records_recovered"] < 90_000
        assert 0 < dataset["conversations"] <= dataset["records_recovered"]
        text = report.markdown(results[name], quick(name)[0], "cmd")
        assert f"{dataset['records_recovered']:,} complete records recovered" in text
    assert "dataset" not in results["shared-prefix"]


def test_runner_is_deterministic_for_a_seed(results: dict[str, dict[str, Any]]) -> None:
    for name in ("priority-overload", "multi-turn-chat"):
        again = run_plan(quick(name)[1])
        assert without_wall_time(again) == without_wall_time(results[name])
    scenario, plan = quick("priority-overload")
    other = run_plan(RunPlan(scenario, plan.policies, plan.levels, plan.duration_s, seed=1))
    assert other["seed"] == 1
    baseline = without_wall_time(results["priority-overload"])
    assert without_wall_time(other)["runs"] != baseline["runs"]


def test_report_files(results: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    for name, res in results.items():
        scenario = quick(name)[0]
        out = tmp_path / name
        written = report.write(res, scenario, out, f"sluicegate bench run {name} --quick")
        names = {p.name for p in written}
        expected = {"results.json", "report.md", "latency.png", "throughput.png", "replicas.png"}
        has_slo = any(r["metrics"]["slo_attainment"] is not None for r in res["runs"])
        assert names == expected | ({"slo.png"} if has_slo else set())
        assert all(p.parent == out and p.is_file() for p in written)
        assert json.loads((out / "results.json").read_text()) == res
        md = (out / "report.md").read_text()
        assert md.startswith(f"# Scenario `{name}`")
        assert f"sluicegate bench run {name} --quick" in md
        for run in res["runs"]:
            assert f"| {run['policy']} |" in md
        if any(r["metrics"]["by_class"] for r in res["runs"]):
            assert "### By class" in md
        if goals.check(res):
            assert "## Goals" in md
        for png in (p for p in written if p.suffix == ".png"):
            data = png.read_bytes()
            assert len(data) > 1000
            assert data.startswith(PNG_SIGNATURE)


def test_goal_verdicts(results: dict[str, dict[str, Any]]) -> None:
    for name, res in results.items():
        verdicts = goals.check(res)
        if name not in goals.CHECKS:
            assert verdicts == []
            continue
        assert verdicts
        for v in verdicts:
            assert v.met in (True, False, None)
            assert v.goal
            assert v.detail
    sweep = goals.check(results["sharegpt-sweep"])
    # Quick levels stay below 400 QPS; predicted-latency is not in this build.
    assert sweep[0].met is None
    if "predicted-latency" not in available_policies():
        assert sweep[1].met is None
    prefix = goals.check(results["shared-prefix"])
    assert [v.met in (True, False) for v in prefix] == [True, True]  # approximate, precise
    pressure = goals.check(results["cache-pressure"])
    assert [v.met in (True, False) for v in pressure] == [True, True]
    chat = goals.check(results["multi-turn-chat"])
    assert [v.met is None for v in chat] == [False, False]


def test_mixed_pool_results_break_down_by_accelerator(
    results: dict[str, dict[str, Any]],
) -> None:
    res = results["heterogeneous-pool"]
    assert [(m["profile"], m["replicas"], m["accelerator"]) for m in res["mix"]] == [
        ("llama3-8b-h100", 1, "h100-80gb"),
        ("llama3-8b-a100", 2, "a100-80gb"),
    ]
    for run in res["runs"]:
        m = run["metrics"]
        assert [r["accelerator"] for r in run["replicas"]] == [
            "h100-80gb",
            "a100-80gb",
            "a100-80gb",
        ]
        classes = m["by_accelerator"]
        assert set(classes) == {"h100-80gb", "a100-80gb"}
        for block in classes.values():
            check_metrics(block)
            assert block["cost_per_1m_output_tokens"] > 0
        assert classes["a100-80gb"]["endpoints"] == 2
        assert sum(c["completed"] for c in classes.values()) == m["completed"]
        # The pool's busy cost is the classes' costs weighted by their output tokens.
        tokens = {
            name: sum(r["output_tokens"] for r in run["replicas"] if r["accelerator"] == name)
            for name in classes
        }
        weighted = sum(classes[n]["cost_per_1m_output_tokens"] * tokens[n] for n in classes)
        assert m["cost_per_1m_output_tokens"] == pytest.approx(weighted / sum(tokens.values()))
        assert 0 < m["busy_fraction"] <= 1.0
        assert m["goodput_rps"] <= m["throughput_rps"]
    for name, other in results.items():  # one class: no breakdown, nothing priced per class
        if name != "heterogeneous-pool":
            assert all(not r["metrics"].get("by_accelerator") for r in other["runs"])


def test_heterogeneous_goals_on_hand_made_results() -> None:
    def run(policy: str, load: float, attainment: float, cost: float) -> dict[str, Any]:
        metrics = {"slo_attainment": attainment, "cost_per_1m_output_tokens": cost}
        return {"policy": policy, "load": load, "metrics": metrics}

    res = {
        "scenario": "heterogeneous-pool",
        "runs": [
            run("default", 40, 0.60, 1.0),
            run("predicted-latency", 40, 0.85, 1.0),
            run("predicted-latency-pool", 40, 0.70, 1.0),
            run("cost-aware", 40, 0.83, 0.80),
        ],
    }
    assert [v.met for v in goals.check(res)] == [True, True]
    res["runs"][2] = run("predicted-latency-pool", 40, 0.80, 1.0)  # only 5 points better
    res["runs"][3] = run("cost-aware", 40, 0.83, 0.90)  # 10 % cheaper only
    assert [v.met for v in goals.check(res)] == [False, False]
    assert [v.met for v in goals.check({**res, "runs": res["runs"][:2]})] == [None, None]


def test_goal_verdicts_on_hand_made_results() -> None:
    def run(policy: str, load: float, **metrics: Any) -> dict[str, Any]:
        return {"policy": policy, "load": load, "metrics": metrics}

    def lat(p90: float) -> dict[str, float]:
        return {"mean": p90, "p50": p90, "p90": p90, "p99": p90}

    better = {"tpot_s": lat(0.05), "e2e_s": lat(5.0), "throughput_rps": 400.0}
    worse = {"tpot_s": lat(0.1), "e2e_s": lat(10.0), "throughput_rps": 400.0}
    sweep = {
        "scenario": "sharegpt-sweep",
        "runs": [run("default", 400, **better), run("round-robin", 400, **worse)],
    }
    assert goals.check(sweep)[0].met is True
    sweep["runs"] = [run("default", 400, **worse), run("round-robin", 400, **better)]
    assert goals.check(sweep)[0].met is False
    # gie-v0.3 against round-robin, judged on TPOT and on NTPOT (E2E / output tokens).
    v03 = {"ntpot_s": lat(0.1), **better}
    rr = {"ntpot_s": lat(0.2), **worse}
    sweep["runs"] = [run("gie-v0.3", lvl, **v03) for lvl in (400, 500)] + [
        run("round-robin", lvl, **rr) for lvl in (400, 500)
    ]
    tpot_goal, ntpot_goal = goals.check(sweep)[-2:]
    assert (tpot_goal.met, ntpot_goal.met) == (True, True)
    assert "500: NTPOT 0.50×, E2E 0.50×, tput 1.00×" in ntpot_goal.detail
    # 0.85× TPOT misses from 500 req/s, but not at 400 (only E2E is judged there).
    sweep["runs"][1] = run("gie-v0.3", 500, **{**v03, "tpot_s": lat(0.085)})
    sweep["runs"][0] = run("gie-v0.3", 400, **{**v03, "tpot_s": lat(0.095)})
    assert goals.check(sweep)[-2].met is False
    sweep["runs"][1] = run("gie-v0.3", 500, **{**v03, "throughput_rps": 390.0})
    assert goals.check(sweep)[-1].met is False  # 0.975× the throughput
    prefix = {
        "scenario": "shared-prefix",
        "runs": [
            run("default", 10, output_tokens_per_s=2000.0),
            run("random", 10, output_tokens_per_s=1000.0),
        ],
    }
    assert [v.met for v in goals.check(prefix)] == [True]
    prefix["runs"].append(run("precise-prefix", 10, output_tokens_per_s=1800.0))
    assert [v.met for v in goals.check(prefix)] == [True, False]
    pressure = {
        "scenario": "cache-pressure",
        "runs": [
            run("default", 8, ttft_s=lat(1.0), output_tokens_per_s=1000.0),
            run(
                "precise-prefix",
                8,
                ttft_s=lat(0.5),
                output_tokens_per_s=1250.0,
                prefix_hits_of_servable=0.97,
            ),
        ],
    }
    assert [v.met for v in goals.check(pressure)] == [True, True]
    pressure["runs"][1]["metrics"].update(ttft_s=lat(0.7), prefix_hits_of_servable=0.9)
    assert [v.met for v in goals.check(pressure)] == [False, False]
    assert [v.met for v in goals.check({"scenario": "cache-pressure", "runs": []})] == [
        None,
        None,
    ]
    chat = {
        "scenario": "multi-turn-chat",
        "runs": [
            run(
                "default",
                2,
                engine_prefix_hit_rate=0.5,
                ideal_prefix_hit_rate=0.52,
                load_imbalance=1.1,
            )
        ],
    }
    assert [v.met for v in goals.check(chat)] == [True, True]
    assert goals.check({"scenario": "priority-overload", "runs": []})[0].met is None
    assert [v.met for v in goals.check({"scenario": "slo-mixed", "runs": []})] == [None]
    slo = {
        "scenario": "slo-mixed",
        "runs": [
            run("default", 70, slo_attainment=0.99),  # SLOs do not bind: not judged
            run("predicted-latency", 70, slo_attainment=0.99),
            run("default", 100, slo_attainment=0.30),
            run("predicted-latency", 100, slo_attainment=0.55),
            run("predicted-latency-oracle", 100, slo_attainment=0.58),
        ],
    }
    # One goal: the oracle of the present is no upper bound, so nothing is judged against it.
    assert [v.met for v in goals.check(slo)] == [True]
    assert "70" not in goals.check(slo)[0].detail
    slo["runs"][3] = run("predicted-latency", 100, slo_attainment=0.45)
    assert [v.met for v in goals.check(slo)] == [False]


def test_cli_bench_run_quick(results: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # another process, another str hash
    command = ["bench", "run", "multi-turn-chat", "--quick", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "sluicegate", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("results.json", "report.md", "latency.png", "throughput.png", "replicas.png"):
        assert (out / name).is_file(), name
    written = json.loads((out / "results.json").read_text())
    # The same run in this process: deterministic across processes.
    assert without_wall_time(written) == without_wall_time(results["multi-turn-chat"])
    assert "sluicegate bench run multi-turn-chat --quick --out" in (out / "report.md").read_text()


def test_cli_bench_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "list"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    scenario_lines = [line for line in lines if line.split(" ", 1)[0] in SCENARIOS]
    assert [line.split()[0] for line in scenario_lines] == list(SCENARIOS)
    for line in scenario_lines:
        name = line.split()[0]
        assert SCENARIOS[name]().description in line
    assert any(line.startswith("policies available:") for line in lines)


def test_a_policy_override_changes_one_parameter_and_nothing_else() -> None:
    from sluicegate.bench.policies import is_available, policy_config

    base, predictor = policy_config("predicted-latency")
    name = "predicted-latency:prefix-cache-affinity-filter.explorationProbability=0.01"
    varied, varied_predictor = policy_config(name)
    assert is_available(name)
    assert varied_predictor == predictor == "model"
    by_ref = {p.ref: p.parameters for p in varied.plugins}
    for spec in base.plugins:  # a type sets every plugin of it; the others are untouched
        expected = dict(spec.parameters)
        if spec.type == "prefix-cache-affinity-filter":
            expected["explorationProbability"] = 0.01
        assert by_ref[spec.ref] == expected
    assert policy_config("predicted-latency")[0] == base  # the preset itself is unchanged
    (scorer,) = [
        p
        for p in policy_config("predicted-latency:latency-scorer.headroomSelectionStrategy=least")[
            0
        ].plugins
        if p.ref == "latency-scorer"
    ]
    assert scorer.parameters["headroomSelectionStrategy"] == "least"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-such-policy:latency-scorer.x=1", "is not available"),
        ("predicted-latency:nope.x=1", "no plugin named or typed 'nope'"),
        ("predicted-latency:latency-scorer=1", "is not PLUGIN.PARAM=VALUE"),
        ("predicted-latency:latency-scorer.x", "is not PLUGIN.PARAM=VALUE"),
    ],
)
def test_a_malformed_policy_override_is_refused(name: str, message: str) -> None:
    from sluicegate.bench.policies import UnknownPolicyError, policy_config

    with pytest.raises(UnknownPolicyError, match=message):
        policy_config(name)


def test_cli_refuses_a_malformed_override_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(
            [
                "bench",
                "run",
                "slo-mixed",
                "--quick",
                "--policies",
                "predicted-latency:nope.x=1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert exited.value.code == 2
    assert "no plugin named or typed 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_rerun_keeps_the_hand_written_sections_of_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = iter(["# Scenario `x`\n\nfirst run\n", "# Scenario `x`\n\nsecond run\n"])
    monkeypatch.setattr(report, "markdown", lambda *_: next(generated))
    monkeypatch.setattr(report, "plots", lambda *_: [])
    scenario = get_scenario("slo-mixed")
    report.write({"runs": []}, scenario, tmp_path, "cmd")
    path = tmp_path / "report.md"
    assert path.read_text() == "# Scenario `x`\n\nfirst run\n"  # nothing kept yet
    hand = f"{report.KEPT_MARKER}\n\n## Measured by hand\n\n| a | b |\n"
    path.write_text(path.read_text() + "\n" + hand)
    report.write({"runs": []}, scenario, tmp_path, "cmd")
    assert path.read_text() == "# Scenario `x`\n\nsecond run\n\n" + hand


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["multi-turn-chat", "--policies", "random,nonexistent"],
            "unknown policy 'nonexistent'; known: cost-aware, default, ",
        ),
        (["multi-turn-chat", "--policies", "random,,default"], "empty policy name"),
        (["multi-turn-chat", "--policies", ""], "empty policy name"),
        (["multi-turn-chat", "--policies", "random,random"], "'random' is given twice"),
        (
            ["multi-turn-chat", "--policies", "vllm-router-round-robin"],
            "run in --mode http only",
        ),
        (
            ["multi-turn-chat", "--mode", "http", "--policies", "default,typo"],
            "unknown policy 'typo'; known: ",
        ),
        (
            ["slo-mixed", "--policies", "predicted-latency:latency-scorer.noSuchParam=1"],
            "plugin 'latency-scorer': noSuchParam: Extra inputs are not permitted",
        ),
        (["multi-turn-chat", "--qps", "2,x"], "--qps must be comma-separated numbers"),
        (["multi-turn-chat", "--qps", "2,0"], "--qps levels must be positive"),
        (["multi-turn-chat", "--qps", "nan"], "--qps levels must be positive"),
        (["multi-turn-chat", "--qps", "2,2"], "--qps names a level twice"),
        (["multi-turn-chat", "--duration", "0"], "--duration must be a positive number"),
        (["multi-turn-chat", "--duration", "-5"], "--duration must be a positive number"),
        (["no-such-scenario"], "unknown scenario 'no-such-scenario'; known: sharegpt-sweep"),
    ],
)
def test_cli_bench_run_refuses_unknown_names_and_bad_values(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing asked for is dropped or replaced by a default: exit 2 before any run."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "run", *argv, "--quick", "--out", str(tmp_path / "out")])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "run", "multi-turn-chat", "--mode", "grpc", "--out", "x"],
        ["bench", "run", "multi-turn-chat", "--flow-control", "maybe", "--out", "x"],
        ["bench", "micro", "nonexistent"],
    ],
)
def test_cli_bench_choice_options_refuse_unknown_values(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
