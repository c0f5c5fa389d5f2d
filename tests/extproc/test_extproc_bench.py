"""The CPU accounting of ``sluicegate bench micro extproc`` (no processes started)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from sluicegate.bench.extproc.decisions import DecisionRun
from sluicegate.bench.processes import cpu_seconds


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_thread_cpu_is_part_of_process_cpu() -> None:
    end = time.process_time() + 0.05
    while time.process_time() < end:  # spend some CPU on this thread
        pass
    pid, tid = os.getpid(), threading.get_native_id()
    thread = cpu_seconds(pid, tid)
    assert 0.0 <= thread <= cpu_seconds(pid)


def test_loop_share() -> None:
    run = DecisionRun(16, 2.0, 1000, 0.8, 0, True, loop_cpu_s=0.6)
    assert run.loop_share == pytest.approx(0.75)
    assert run.cpu_us == pytest.approx(800.0)
    assert DecisionRun(16, 2.0, 0, 0.0, 0, True).loop_share == 0.0


def test_floor_section_derives_the_cost_of_python_work_and_the_budget() -> None:
    from sluicegate.bench.extproc.report import _floor_section

    null = DecisionRun(64, 1.0, 1000, 0.300, 0, True)  # 300 µs per stream
    worked = DecisionRun(64, 1.0, 1000, 0.490, 0, True)  # +100 µs of work → 490 µs
    round_robin = DecisionRun(64, 1.0, 1000, 0.560, 0, True)
    default = DecisionRun(64, 1.0, 1000, 0.600, 0, True)
    text = "\n".join(_floor_section([default], round_robin, null, worked))
    assert "cost 1.9 µs of the process's CPU" in text
    # 2,000/s = 500 µs each; the runtime takes 300, leaving 200 / 1.9 ≈ 105 µs of Python.
    assert "takes 300, which leaves about 105 µs" in text
    assert "| `sluicegate extproc` (default preset) | 1,000 | 600 |" in text


def test_floor_section_says_so_when_noise_hides_the_cost_of_work() -> None:
    from sluicegate.bench.extproc.report import _floor_section

    null = DecisionRun(64, 1.0, 1000, 0.300, 0, True)
    worked = DecisionRun(64, 1.0, 1000, 0.295, 0, True)  # cheaper than nothing: noise
    text = "\n".join(_floor_section([null], null, null, worked))
    assert "too noisy to derive a cost" in text
    assert "leaves about" not in text
