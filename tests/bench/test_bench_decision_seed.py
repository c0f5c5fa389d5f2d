"""``--decision-seed``: the same arrivals routed with other draws of the gateways (the
noise floor of a scenario), and nothing else changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate import cli
from sluicegate.bench.des_sharing import ReplicaSettings
from sluicegate.bench.des_spec import RunResult
from sluicegate.bench.replica_seeds import noise_summary
from sluicegate.bench.runner import cluster_spec, run_level
from sluicegate.bench.scenarios import get_scenario


def run(policy: str, decision_seed: int | None) -> RunResult:
    """Open-loop arrivals (a chat's next turn would wait for the previous answer)."""
    scenario = get_scenario("slo-mixed").quick_variant()
    return run_level(scenario, policy, 20.0, 3.0, 0, decision_seed=decision_seed)


def test_the_decision_seed_leaves_the_cluster_seed_alone() -> None:
    scenario = get_scenario("slo-mixed").quick_variant()
    spec = cluster_spec(scenario, "random", 0, decision_seed=101)
    assert (spec.seed, spec.decision_seed) == (0, 101)


def test_every_replica_of_a_run_takes_its_draws_from_the_decision_seed() -> None:
    def replicas(decision_seed: int | None) -> RunResult:
        scenario = get_scenario("slo-mixed").quick_variant()
        two = ReplicaSettings(2, "independent")
        return run_level(
            scenario, "random", 20.0, 3.0, 0, gateways=two, decision_seed=decision_seed
        )

    base, other = replicas(None), replicas(101)
    assert [r.arrival for r in base.records] == [r.arrival for r in other.records]
    # replica 1 (every other request, round-robin) moves too, not only replica 0
    odd = [(a.endpoint, b.endpoint) for a, b in zip(base.records, other.records, strict=True)]
    assert sum(x != y for x, y in odd[1::2]) > len(odd) // 8


def test_the_run_seed_is_the_default_decision_seed() -> None:
    same = run("random", 0)
    unset = run("random", None)
    assert [(r.arrival, r.endpoint, r.finish) for r in same.records] == [
        (r.arrival, r.endpoint, r.finish) for r in unset.records
    ]


@pytest.mark.parametrize("policy", ["random", "kube-service"])
def test_another_decision_seed_routes_the_same_arrivals_otherwise(policy: str) -> None:
    """The plugins' draws, and the per-connection balancer's of ``kube-service``."""
    base, other = run(policy, None), run(policy, 101)
    # the workload and the engines keep the run's seed: the same requests arrive ...
    assert [(r.arrival, r.prompt_tokens) for r in base.records] == [
        (r.arrival, r.prompt_tokens) for r in other.records
    ]
    # ... and the random picks differ
    moved = sum(a.endpoint != b.endpoint for a, b in zip(base.records, other.records, strict=True))
    assert moved > len(base.records) // 4


def test_cli_records_the_decision_seed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["bench", "run", "multi-turn-chat", "--quick", "--duration", "3"]
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, "--policies", "random", "--decision-seed", "7", "--out", str(out)])
    assert exited.value.code == 0
    assert json.loads((out / "results.json").read_text())["decision_seed"] == 7
    assert "the gateways' draws from decision seed 7." in (out / "report.md").read_text()


def test_cli_refuses_a_decision_seed_outside_the_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "run", "multi-turn-chat", "--quick", "--mode", "http"]
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, "--decision-seed", "7", "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert "--decision-seed applies to --mode des only" in capsys.readouterr().err


def test_noise_table_compares_each_decision_seed_with_its_own_seed() -> None:
    def doc(
        seed: int, attainment: float, decisions: int | None = None, duration: float = 600.0
    ) -> dict[str, object]:
        run = {"policy": "default", "load": 85, "metrics": {"slo_attainment": attainment}}
        out: dict[str, object] = {"scenario": "slo-mixed", "seed": seed, "runs": [run]}
        out |= {"mode": "des", "duration_s": duration, "kv_event_delay_s": 0.005}
        if decisions is not None:
            out["decision_seed"] = decisions
        return out

    base = [doc(0, 0.786), doc(1, 0.884)]
    table = noise_summary(base, [doc(0, 0.795, 101), doc(1, 0.866, 102)])
    row = next(line for line in table.splitlines() if line.startswith("| default"))
    assert "+0.9 (seed 0, decisions 101), -1.8 (seed 1, decisions 102)" in row
    assert row.endswith("| 1.8 |")
    with pytest.raises(ValueError, match="needs another --decision-seed"):
        noise_summary(base, [doc(0, 0.795)])
    with pytest.raises(ValueError, match="needs another --decision-seed"):
        noise_summary(base, [doc(0, 0.795, 0)])
    with pytest.raises(ValueError, match="not run as the replica runs were"):
        noise_summary(base, [doc(0, 0.795, 101, duration=120.0)])
    with pytest.raises(ValueError, match="without --decision-seed"):
        noise_summary([doc(0, 0.786, 101)], [doc(0, 0.795, 202)])
