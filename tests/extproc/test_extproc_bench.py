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
