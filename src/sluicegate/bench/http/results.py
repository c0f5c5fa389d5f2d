"""An HTTP run as a ``results.json`` entry.

:class:`HttpRunResult` is what one (policy, level) run produced: the client's records
(simulated seconds), the engines' own counters, the CPU each process used and the time
scale. :func:`http_entry` turns it into the ``runs[]`` entry DES mode writes (through the
same :func:`~sluicegate.bench.runner.entry_from_records`, so both modes' reports read the
same fields), plus what only a real run has: inter-token latencies, how late requests were
sent, the engines' own mean TTFT/TPOT, CPU use, and warnings when the machine was too busy
for the latencies to be faithful.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from sluicegate.bench.http.client import HttpRequestRecord
from sluicegate.bench.http.pool import EngineCounters
from sluicegate.bench.metrics import latency_summary
from sluicegate.bench.runner import entry_from_records
from sluicegate.bench.scenario_spec import Scenario

SIM_CPU_WARNING = 0.8
"""Share of a core above which the simulator process is reported as CPU-bound."""


@dataclass(slots=True)
class HttpRunResult:
    """One HTTP run. Times in simulated seconds unless named ``wall``."""

    records: list[HttpRequestRecord]
    end_time: float
    endpoint_names: list[str]
    counters: EngineCounters
    time_scale: float
    router: str
    """``sluicegate`` or ``vllm-router``."""
    wall_s: float = 0.0
    """Wall seconds of the replay (processes' start and stop excluded)."""
    cpu: dict[str, float] = field(default_factory=dict)
    """Shares of one core used during the replay by ``sim`` and ``router`` (the
    processes), and ``load_average``: the machine's 1-minute load average at the end."""

    def warnings(self) -> list[str]:
        """Why this run's latencies may not be faithful."""
        out = []
        if self.cpu.get("sim", 0.0) > SIM_CPU_WARNING:
            out.append(
                f"the simulator used {self.cpu['sim']:.0%} of a core: its engines ran late, "
                "latencies are inflated"
            )
        cores = os.cpu_count() or 1
        if self.cpu.get("load_average", 0.0) > cores:
            out.append(
                f"load average {self.cpu['load_average']:.1f} on {cores} cores: the machine "
                "was busy, latencies are inflated"
            )
        return out


def http_entry(
    scenario: Scenario, policy: str, level: float, result: HttpRunResult, wall_s: float
) -> dict[str, Any]:
    """The ``runs[]`` entry of one HTTP run: DES mode's, plus ``metrics.itl_s`` (inter-token
    latency over completed requests, simulated s), how late requests were sent
    (``send_lag_s``), the engines' own mean TTFT/TPOT (``engine_view``), CPU use
    (``cpu``) and what makes the run's latencies doubtful (``warnings``), the time scale
    and the router."""
    c = result.counters
    entry = entry_from_records(
        scenario,
        policy,
        level,
        result.records,
        result.endpoint_names,
        simulated_s=result.end_time,
        wall_s=wall_s,
        prefix_queries=c.prefix_queries,
        prefix_hits=c.prefix_hits,
        preemptions=c.preemptions,
    )
    done = [r for r in result.records if r.completed]
    entry["metrics"]["itl_s"] = latency_summary([g for r in done for g in r.itl])
    lags = [r.lag for r in result.records]
    entry["send_lag_s"] = {"mean": sum(lags) / len(lags), "max": max(lags)} if lags else None
    entry["engine_view"] = c.engine_view()
    entry["cpu"] = result.cpu
    entry["warnings"] = result.warnings()
    entry["time_scale"] = result.time_scale
    entry["router"] = result.router
    # as the DES's runs say: whether the engines' KV events fed a precise index (the
    # HTTP lab's gateways subscribe to none)
    entry["kv_events"] = False
    return entry
