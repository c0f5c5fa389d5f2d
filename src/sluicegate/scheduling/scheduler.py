"""Runs scheduling profiles: filters → weighted scorers → picker."""

from __future__ import annotations

from collections.abc import Sequence
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

MAX_PROFILE_ROUNDS = 16
"""Rounds of profile selection per request before a handler is considered stuck."""


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
        self, request: LLMRequest, state: CycleState, candidates: Sequence[Endpoint]
    ) -> ProfileResult | None:
        """The profile's choice, or None when the filters leave no endpoint."""
        endpoints: Sequence[Endpoint] = candidates
        for f in self.filters:
            endpoints = f.filter(request, state, endpoints)
            if not endpoints:
                return None
        totals = [0.0] * len(endpoints)
        for ws in self.scorers:
            scores = ws.scorer.score(request, state, endpoints)
            weight = ws.weight
            for i, s in enumerate(scores):
                totals[i] += weight * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s)
        scored = [ScoredEndpoint(e, t) for e, t in zip(endpoints, totals, strict=True)]
        targets = self.picker.pick(request, state, scored)
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

    def prepare(
        self, request: LLMRequest, state: CycleState, candidates: Sequence[Endpoint]
    ) -> None:
        """Run the data producers (in dependency order) over the candidates."""
        for producer in self.producers:
            producer.produce(request, state, candidates)

    def schedule(
        self, request: LLMRequest, state: CycleState, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        """Pick endpoints for ``request``; raises :class:`SchedulingError` if none fits."""
        if not candidates:
            raise SchedulingError("no candidate endpoints")
        results: dict[str, ProfileResult | None] = {}
        for _ in range(MAX_PROFILE_ROUNDS):
            names = self.profile_handler.pick_profiles(request, state, self.profiles, results)
            if not names:
                break
            for name in names:
                results[name] = self.profiles[name].run(request, state, candidates)
        else:
            raise SchedulingError(f"profile handler did not finish in {MAX_PROFILE_ROUNDS} rounds")
        return self.profile_handler.process_results(request, state, results)

    def notify_pre_request(
        self, request: LLMRequest, state: CycleState, result: SchedulingResult
    ) -> None:
        for hook in self.pre_request:
            hook.pre_request(request, state, result)


__all__ = ["Scheduler", "SchedulerProfile", "SchedulingError", "WeightedScorer"]
