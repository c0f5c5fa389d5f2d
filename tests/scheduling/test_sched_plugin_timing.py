"""Plugin call timing: one scheduling cycle in ``every`` has each of its plugin calls
timed, by the reference's extension-point names."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.builtins import default_registry
from sluicegate.framework import CycleState, PluginContext
from sluicegate.framework.plugin import Plugin
from sluicegate.scheduling.config import build_scheduler, load_preset
from sluicegate.scheduling.scheduler import PluginTiming

REGISTRY = default_registry()


def test_every_nth_cycle_times_each_plugin_call(
    ctx: PluginContext, make_endpoint: Any, make_request: Any
) -> None:
    scheduler = build_scheduler(load_preset("default"), ctx, REGISTRY).scheduler
    calls: list[tuple[int, str, str, float]] = []
    cycle = 0

    def sink(point: str, plugin: Plugin, seconds: float) -> None:
        calls.append((cycle, point, plugin.name, seconds))

    scheduler.timing = PluginTiming(sink, every=3)
    endpoints = [make_endpoint(i) for i in range(3)]
    for cycle in range(7):
        request = make_request(f"prompt {cycle}")
        state = CycleState()
        scheduler.prepare(request, state, endpoints)
        result = scheduler.schedule(request, state, endpoints)
        scheduler.notify_pre_request(request, state, result)
    assert sorted({c for c, *_ in calls}) == [0, 3, 6]
    points = {p for c, p, _, _ in calls if c == 0}
    assert {"PrepareData", "Scorer", "Picker", "ProfilePicker"} <= points  # no filters here
    assert "ProcessProfilesResults" in points
    names = {n for c, p, n, _ in calls if c == 0 and p == "Scorer"}
    assert names == {ws.scorer.name for p in scheduler.profiles.values() for ws in p.scorers}
    assert all(0 <= s < 1 for *_, s in calls)
    per_cycle = [sum(1 for c, *_ in calls if c == n) for n in (0, 3, 6)]
    assert per_cycle[0] == per_cycle[1] == per_cycle[2]


def test_without_timing_nothing_is_timed_and_every_must_be_positive(ctx: PluginContext) -> None:
    scheduler = build_scheduler(load_preset("default"), ctx, REGISTRY).scheduler
    assert scheduler.timing is None
    with pytest.raises(ValueError, match="at least 1"):
        PluginTiming(lambda point, plugin, seconds: None, every=0)
