"""``sluicegate sim calibrate``: fit a simulator profile to a real OpenAI-compatible server.

- :mod:`~sluicegate.sim.calibrate.client` — streamed completions and ``/metrics`` scrapes;
- :mod:`~sluicegate.sim.calibrate.probes` — the designed requests and what each measures;
- :mod:`~sluicegate.sim.calibrate.fit` — the step-time fit;
- :mod:`~sluicegate.sim.calibrate.run` — plan, time budget, result.

``docs/simulator.md`` ("Make the simulator match your hardware") describes the command.
"""

from __future__ import annotations

from sluicegate.sim.calibrate.fit import Fit, fit_profile, predict
from sluicegate.sim.calibrate.probes import Point
from sluicegate.sim.calibrate.run import CalibrateOptions, Calibration, calibrate

__all__ = ["CalibrateOptions", "Calibration", "Fit", "Point", "calibrate", "fit_profile", "predict"]
