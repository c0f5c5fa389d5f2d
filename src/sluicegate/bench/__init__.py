"""The benchmark lab: workloads, simulated clusters, load runners, reports and plots.

What ``sluicegate bench`` runs, for use from code: the scenarios (:data:`SCENARIOS`,
:func:`get_scenario`), a run plan over policies and load levels (:class:`RunPlan`,
:func:`run_plan`, on the discrete-event simulation), its report and plots (:func:`write`)
and the micro-benchmarks by name (:data:`REPORTS`). Imported on first use: the lab's
modules pull in the whole gateway, matplotlib and the ShareGPT dataset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "SCENARIOS": "sluicegate.bench.scenarios",
    "get_scenario": "sluicegate.bench.scenarios",
    "RunPlan": "sluicegate.bench.runner",
    "run_plan": "sluicegate.bench.runner",
    "write": "sluicegate.bench.report",
    "REPORTS": "sluicegate.bench.micro",
}

if TYPE_CHECKING:
    from sluicegate.bench.micro import REPORTS
    from sluicegate.bench.report import write
    from sluicegate.bench.runner import RunPlan, run_plan
    from sluicegate.bench.scenarios import SCENARIOS, get_scenario


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = ["REPORTS", "SCENARIOS", "RunPlan", "get_scenario", "run_plan", "write"]
