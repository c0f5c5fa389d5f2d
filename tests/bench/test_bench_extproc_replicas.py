"""The replica-scale harness's own arithmetic and configuration (no processes started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluicegate.bench.extproc.decisions import DecisionRun
from sluicegate.bench.extproc.fleet import _pool_config
from sluicegate.bench.extproc.replicas import _net_rate, _row, _shared_config


def test_shared_config_adds_shared_state_to_the_gateway_config(tmp_path: Path) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(_pool_config([9000, 9001], 50.0))
    out = _shared_config(pool, "redis://127.0.0.1:1/0", "bench-2-0")
    docs = list(yaml.safe_load_all(out.read_text()))
    gateway = next(d for d in docs if d["kind"] == "GatewayConfig")
    assert gateway["spec"]["sharedState"] == {
        "redis": {"url": "redis://127.0.0.1:1/0", "keyPrefix": "bench-2-0"}
    }
    assert gateway["spec"]["scrapeIntervalMs"] == 50.0
    assert "sharedState" not in pool.read_text()  # the plain pool file is left as it was


def _run(decisions: int, cpu_s: float, idle_share: float, seconds: float = 10.0) -> DecisionRun:
    return DecisionRun(32, seconds, decisions, cpu_s, 0, True, idle_share=idle_share)


def test_rates_leave_the_idle_cpu_out_and_rows_take_medians() -> None:
    # 10 s, 5 CPU-s of which 1 idle (0.1 of a core): 4 CPU-s for 4,000 decisions.
    assert _net_rate(_run(4000, 5.0, 0.1)) == pytest.approx(1000.0)
    runs = [[_run(4000, 5.0, 0.1), _run(2000, 3.0, 0.1)], [_run(3000, 4.0, 0.1)]]
    row, median = _row("2 replicas", runs)
    # Run 1: mean(1000, 1000) = 1000; run 2: 3000 / 3 = 1000.
    assert median == pytest.approx(1000.0)
    assert row.startswith("| 2 replicas | 1,000 (1,000-1,000) | ")
