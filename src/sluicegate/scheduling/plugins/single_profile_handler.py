"""``single-profile-handler``: run the one configured profile once; its result is primary.

Type: profile handler. Parameters: none. Added automatically when the configuration has a
single scheduling profile and no handler, as llm-d-router does
(https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/config/loader/defaults.go).
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.framework import (
    CycleState,
    LLMRequest,
    ProfileHandler,
    ProfileResult,
    SchedulerProfileLike,
    SchedulingError,
    SchedulingResult,
)


class SingleProfileHandler(ProfileHandler):
    type_name = "single-profile-handler"

    def pick_profiles(
        self,
        request: LLMRequest,
        state: CycleState,
        profiles: Mapping[str, SchedulerProfileLike],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if results:
            return []
        if len(profiles) != 1:
            raise SchedulingError(
                f"single-profile-handler needs exactly one profile, got {len(profiles)}"
            )
        return list(profiles)

    def process_results(
        self, request: LLMRequest, state: CycleState, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        ((name, result),) = results.items()
        if result is None or not result.targets:
            raise SchedulingError(
                "failed to find target endpoint: every candidate was filtered out"
            )
        return SchedulingResult({name: result}, name)
