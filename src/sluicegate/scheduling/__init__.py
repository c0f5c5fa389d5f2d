"""Scheduling: choosing an endpoint for a request with profiles of filters, scorers, a picker.

- :mod:`~sluicegate.scheduling.scheduler` — ``Scheduler``, ``SchedulerProfile``,
  ``WeightedScorer``: running profiles (filters → weighted scorers → picker);
- :mod:`~sluicegate.scheduling.config` — ``build_scheduler`` from an
  ``EndpointPickerConfig`` (``BuiltScheduler``), and the packaged presets
  (``load_preset``, ``preset_names``);
- :mod:`~sluicegate.scheduling.prefix_index` — ``PrefixIndex``, the approximate
  prefix-cache index;
- :mod:`~sluicegate.scheduling.plugins` — the built-in plugins, registered by
  :mod:`sluicegate.builtins`, not exported here.

The names are imported on first use (lazy): importing a plugin runs this file, and a plugin
leans on the framework layer only, so this file must not load the configuration models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "DEFAULT_PRESET": "sluicegate.scheduling.config",
    "BuiltScheduler": "sluicegate.scheduling.config",
    "build_scheduler": "sluicegate.scheduling.config",
    "load_preset": "sluicegate.scheduling.config",
    "preset_names": "sluicegate.scheduling.config",
    "PrefixIndex": "sluicegate.scheduling.prefix_index",
    "Scheduler": "sluicegate.scheduling.scheduler",
    "SchedulerProfile": "sluicegate.scheduling.scheduler",
    "WeightedScorer": "sluicegate.scheduling.scheduler",
}

if TYPE_CHECKING:
    from sluicegate.scheduling.config import (
        DEFAULT_PRESET,
        BuiltScheduler,
        build_scheduler,
        load_preset,
        preset_names,
    )
    from sluicegate.scheduling.prefix_index import PrefixIndex
    from sluicegate.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "DEFAULT_PRESET",
    "BuiltScheduler",
    "PrefixIndex",
    "Scheduler",
    "SchedulerProfile",
    "WeightedScorer",
    "build_scheduler",
    "load_preset",
    "preset_names",
]
