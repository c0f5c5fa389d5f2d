"""``sluicegate bench run --backend``: option checks and the reduced scenarios (no vLLM
needed; the run itself is tests/vllm/test_real_vllm_bench.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sluicegate.bench.http.vllm import SMALL_SCENARIOS, small_scenario, vllm_python
from sluicegate.bench.vllm_backend import MODEL_NAME, PYTHON_ENV
from sluicegate.bench.workloads import OpenLoop


def _exit_code(argv: list[str]) -> int:
    from sluicegate.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    code = exit_info.value.code
    assert isinstance(code, int)
    return code


def test_unknown_backend_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "run", "shared-prefix", "--mode", "http", "--backend", "tgi"]
    assert _exit_code([*argv, "--out", str(tmp_path)]) == 2
    assert "'sim', 'vllm'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "extra",
    [
        ["shared-prefix", "--backend", "vllm"],  # DES mode
        ["sharegpt-sweep", "--mode", "http", "--backend", "vllm"],  # no reduced variant
        ["shared-prefix", "--mode", "http", "--vllm-python", sys.executable],  # sim backend
        ["shared-prefix", "--mode", "http", "--backend", "vllm", "--vllm-python", "/nonexistent"],
        ["shared-prefix", "--mode", "http", "--backend", "vllm", "--time-scale", "2"],
    ],
)
def test_bad_vllm_options_exit_2_before_running(
    extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    assert _exit_code(["bench", "run", *extra, "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


def test_vllm_python_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    with pytest.raises(ValueError, match="--vllm-python"):
        vllm_python(None)
    assert vllm_python(sys.executable) == sys.executable
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    assert vllm_python(None) == sys.executable


@pytest.mark.parametrize("name", sorted(SMALL_SCENARIOS))
def test_reduced_scenarios_fit_a_two_core_machine(name: str) -> None:
    scenario = small_scenario(name)
    assert small_scenario(f"{name}-small").name == scenario.name == f"{name}-small"
    assert scenario.replicas == 2
    assert scenario.model == MODEL_NAME
    assert max(scenario.levels) <= 5
    workload = scenario.workload(max(scenario.levels), scenario.duration_s, 0)
    if isinstance(workload, OpenLoop):  # sessions' request count depends on the replies
        assert 10 <= len(list(workload.initial())) <= 100


def test_unknown_reduced_scenario_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="shared-prefix, multi-turn-chat"):
        small_scenario("slo-mixed")


def test_reduced_scenarios_run_simulated_only_with_a_profile_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``shared-prefix-small`` outside ``--backend vllm``: the simulated side of the
    sim-vs-vllm comparison; its placeholder profile must be replaced by a calibrated one."""
    import dataclasses
    import json

    from sluicegate.sim.profile_file import dump_profile
    from sluicegate.sim.profiles import PROFILES

    out = tmp_path / "out"
    argv = ["bench", "run", "shared-prefix-small", "--quick", "--policies", "random"]
    assert _exit_code([*argv, "--out", str(out)]) == 2
    assert "--profile-file" in capsys.readouterr().err
    assert not out.exists()

    profile = dataclasses.replace(PROFILES["tiny"], name="calibrated-tiny-llama")
    path = tmp_path / "profile.yaml"
    path.write_text(dump_profile(profile))
    assert _exit_code([*argv, "--profile-file", str(path), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["scenario"] == "shared-prefix-small"
    assert results["pool"] == {"profile": profile.name, "replicas": 2, "model": MODEL_NAME}
    [run] = results["runs"]
    assert run["policy"] == "random"
    assert run["metrics"]["completed"] == run["metrics"]["requests"] > 0
