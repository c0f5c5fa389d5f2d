"""Runs scheduling profiles: filters → weighted scorers → picker.

With a :class:`PluginTiming`, one cycle in ``every`` has each plugin call timed and
reported by extension point (the reference's names: ``Filter``, ``Scorer``, ``Picker``,
``ProfilePicker``, ``ProcessProfilesResults``, ``PreRequest``, and ``PrepareData`` for
the data producers); the other cycles pay one countdown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    CycleState,
    DataProducer,
    Filter,
    LLMRequest,
    Picker,
    PreRequest,
    ProfileHandler,
    ProfileResult,
    SchedulerProfileLike,
    SchedulingError,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
)
from sluicegate.framework.plugin import Plugin

MAX_PROFILE_ROUNDS = 16
"""Rounds of profile selection per request before a handler is considered stuck."""

PluginSink = Callable[[str, Plugin, float], None]
"""Told of one timed call: (extension point, plugin, seconds)."""


class PluginTiming:
    """Which calls to time: one in ``every`` of each kind (producers, scheduling, hooks),
    reported to ``sink``."""

    __slots__ = ("_countdown", "every", "sink")

    def __init__(self, sink: PluginSink, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        self.sink = sink
        self.every = every
        self._countdown = [0, 0, 0]  # prepare, schedule, pre-request: the first is timed

    def due(self, kind: int) -> PluginSink | None:
        """The sink if this call of ``kind`` (0..2) is to be timed, else None."""
        left = self._countdown[kind]
        if left:
            self._countdown[kind] = left - 1
            return None
        self._countdown[kind] = self.every - 1
        return self.sink


def _timed(sink: PluginSink, point: str, plugin: Plugin, started: float) -> None:
    sink(point, plugin, time.perf_counter() - started)


@dataclass(slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(slots=True)
class SchedulerProfile(SchedulerProfileLike):
    """One named pipeline. Combined score = Σ weight · clamp(score, 0, 1)."""

    name: str
    picker: Picker
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)

    def run(
        self,
        request: LLMRequest,
        state: CycleState,
        candidates: Sequence[Endpoint],
        sink: PluginSink | None = None,
    ) -> ProfileResult | None:
        """The profile's choice, or None when the filters leave no endpoint; each plugin
        call timed into ``sink`` when given."""
        endpoints: Sequence[Endpoint] = candidates
        clock = time.perf_counter
        for f in self.filters:
            started = clock() if sink is not None else 0.0
            endpoints = f.filter(request, state, endpoints)
            if sink is not None:
                _timed(sink, "Filter", f, started)
            if not endpoints:
                return None
        totals = [0.0] * len(endpoints)
        for ws in self.scorers:
            started = clock() if sink is not None else 0.0
            scores = ws.scorer.score(request, state, endpoints)
            if sink is not None:
                _timed(sink, "Scorer", ws.scorer, started)
            weight = ws.weight
            for i, s in enumerate(scores):
                totals[i] += weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
        scored = [ScoredEndpoint(e, t) for e, t in zip(endpoints, totals, strict=True)]
        started = clock() if sink is not None else 0.0
        targets = self.picker.pick(request, state, scored)
        if sink is not None:
            _timed(sink, "Picker", self.picker, started)
        if not targets:
            return None
        return ProfileResult(targets, {s.endpoint.name: s.score for s in scored})


@dataclass(slots=True)
class Scheduler:
    """Producers, a profile handler and its profiles, and pre-request hooks."""

    profile_handler: ProfileHandler
    profiles: dict[str, SchedulerProfile]
    producers: list[DataProducer] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    timing: PluginTiming | None = None
    """Times plugin calls (sampled) when set."""

    def prepare(
        self, request: LLMRequest, state: CycleState, candidates: Sequence[Endpoint]
    ) -> None:
        """Run the data producers (in dependency order) over the candidates."""
        sink = self.timing.due(0) if self.timing is not None else None
        if sink is None:
            for producer in self.producers:
                producer.produce(request, state, candidates)
            return
        for producer in self.producers:
            started = time.perf_counter()
            producer.produce(request, state, candidates)
            _timed(sink, "PrepareData", producer, started)

    def schedule(
        self, request: LLMRequest, state: CycleState, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        """Pick endpoints for ``request``; raises :class:`SchedulingError` if none fits."""
        if not candidates:
            raise SchedulingError("no candidate endpoints")
        sink = self.timing.due(1) if self.timing is not None else None
        clock = time.perf_counter
        handler = self.profile_handler
        results: dict[str, ProfileResult | None] = {}
        for _ in range(MAX_PROFILE_ROUNDS):
            started = clock() if sink is not None else 0.0
            names = handler.pick_profiles(request, state, self.profiles, results)
            if sink is not None:
                _timed(sink, "ProfilePicker", handler, started)
            if not names:
                break
            for name in names:
                results[name] = self.profiles[name].run(request, state, candidates, sink)
        else:
            raise SchedulingError(f"profile handler did not finish in {MAX_PROFILE_ROUNDS} rounds")
        started = clock() if sink is not None else 0.0
        result = handler.process_results(request, state, results)
        if sink is not None:
            _timed(sink, "ProcessProfilesResults", handler, started)
        return result

    def notify_pre_request(
        self, request: LLMRequest, state: CycleState, result: SchedulingResult
    ) -> None:
        sink = self.timing.due(2) if self.timing is not None else None
        for hook in self.pre_request:
            started = time.perf_counter() if sink is not None else 0.0
            hook.pre_request(request, state, result)
            if sink is not None:
                _timed(sink, "PreRequest", hook, started)


__all__ = [
    "PluginSink",
    "PluginTiming",
    "Scheduler",
    "SchedulerProfile",
    "SchedulingError",
    "WeightedScorer",
]
