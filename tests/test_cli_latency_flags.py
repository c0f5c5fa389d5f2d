"""``--latency-model-dir`` and ``--latency-trace`` of ``sluicegate serve`` and ``sluicegate
extproc``: checked, and carried to the picker's runtime (where the model directory
overrides the configuration's ``modelDir``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import sluicegate.extproc.run
import sluicegate.gateway.run
from sluicegate.api.loader import load_config
from sluicegate.cli import main
from sluicegate.latency.trace import TraceError
from sluicegate.runtime import Runtime, RuntimeOptions

POOL = {
    "apiVersion": "inference.networking.k8s.io/v1",
    "kind": "InferencePool",
    "metadata": {"name": "pool"},
    "spec": {
        "targetPorts": [{"number": 8000}],
        "endpoints": [{"address": "http://127.0.0.1:1", "name": "ep-0"}],
    },
}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    gateway = {
        "apiVersion": "sluicegate.dev/v1alpha1",
        "kind": "GatewayConfig",
        "spec": {"latencyPredictor": {"modelDir": str(tmp_path / "configured")}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump_all([POOL, gateway]))
    return path


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Options the serve and extproc commands would run with (nothing is started)."""
    seen: list[Any] = []

    async def record(options: Any, console: Any) -> None:
        seen.append(options)

    monkeypatch.setattr(sluicegate.gateway.run, "serve", record)
    monkeypatch.setattr(sluicegate.extproc.run, "run_extproc", record)
    return seen


def run(*argv: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    code = exit_info.value.code
    assert isinstance(code, int)
    return code


def err(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed on stderr, rich's line wrapping undone."""
    return "".join(capsys.readouterr().err.split("\n"))


def runtime_options(command: str, options: Any) -> RuntimeOptions:
    runtime = options.gateway.runtime if command == "serve" else options.runtime
    assert isinstance(runtime, RuntimeOptions)
    return runtime


@pytest.mark.parametrize("command", ["serve", "extproc"])
def test_flags_reach_the_runtime_and_override_the_model_dir(
    command: str, captured: list[Any], config_file: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("")
    models = tmp_path / "flagged"
    code = run(
        command,
        "--config",
        str(config_file),
        "--latency-model-dir",
        str(models),
        "--latency-trace",
        str(trace),
    )
    assert code == 0
    options = runtime_options(command, captured[0])
    assert (options.latency_model_dir, options.latency_trace) == (str(models), str(trace))
    runtime = Runtime(load_config(config_file), options)
    assert runtime.predictor is not None
    assert runtime.predictor.model_dir == str(models)
    assert runtime.predictor.trace == str(trace)
    assert runtime.predictor.local is not None
    assert runtime.predictor.local.settings.model_dir == str(models)


@pytest.mark.parametrize("command", ["serve", "extproc"])
def test_without_flags_the_configuration_decides(
    command: str, captured: list[Any], config_file: Path, tmp_path: Path
) -> None:
    assert run(command, "--config", str(config_file)) == 0
    options = runtime_options(command, captured[0])
    assert (options.latency_model_dir, options.latency_trace) == (None, None)
    runtime = Runtime(load_config(config_file), options)
    assert runtime.predictor is not None
    assert runtime.predictor.model_dir == str(tmp_path / "configured")


@pytest.mark.parametrize("command", ["serve", "extproc"])
def test_bad_flags_are_refused_before_starting(
    command: str,
    captured: list[Any],
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = (command, "--config", str(config_file))
    assert run(*base, "--latency-trace", str(tmp_path / "missing.jsonl")) == 2
    assert "--latency-trace" in err(capsys)
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert run(*base, "--latency-model-dir", str(a_file)) == 2
    assert "not a directory" in err(capsys)
    assert captured == []


@pytest.mark.parametrize("command", ["serve", "extproc"])
def test_a_bad_trace_line_found_at_start_is_an_error(
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def fail(options: Any, console: Any) -> None:
        raise TraceError("trace.jsonl:3: ttft_ms: not a number")

    monkeypatch.setattr(sluicegate.gateway.run, "serve", fail)
    monkeypatch.setattr(sluicegate.extproc.run, "run_extproc", fail)
    assert run(command, "--config", str(config_file)) == 2
    assert "trace.jsonl:3" in err(capsys)
