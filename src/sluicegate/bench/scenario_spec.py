"""What a benchmark scenario is (:class:`Scenario`); the scenarios themselves are defined in
:mod:`sluicegate.bench.scenarios`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sluicegate.bench.workloads import Workload
from sluicegate.sim.profiles import EngineProfile

WorkloadFactory = Callable[[float, float, int], Workload]
"""(load level, duration in s, seed) → workload. The load level is req/s, sessions/s or a
concurrency, as the scenario's ``load_unit`` says."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    profile: EngineProfile
    replicas: int
    model: str
    workload: WorkloadFactory
    levels: tuple[float, ...]
    duration_s: float
    policies: tuple[str, ...]
    load_unit: str = "req/s"
    goals: tuple[str, ...] = ()
    published: str = ""
    extra_docs: tuple[dict[str, Any], ...] = ()
    adapters: tuple[str, ...] = ()
    flow_control: tuple[bool, ...] = (False,)
    """Flow control settings compared by default (off, on, or both)."""
    dataset: str | None = None
    """``"sharegpt"`` when the workload replays ShareGPT: results say how much of the
    packaged file was recovered."""
    drain_factor: float = 4.0
    """The run continues after the last arrival for up to this many durations."""
    quick: dict[str, Any] = field(default_factory=dict)
    """Overrides for ``--quick``: replicas, levels, duration_s."""
    mix: tuple[tuple[EngineProfile, int], ...] = ()
    """A pool mixing hardware: replicas by profile, in endpoint order (``profile`` is then
    the first, ``replicas`` their sum); empty: ``replicas`` × ``profile``."""

    def __post_init__(self) -> None:
        if self.mix and sum(n for _, n in self.mix) != self.replicas:
            raise ValueError(f"scenario {self.name}: replicas must be the sum of mix's counts")

    def quick_variant(self) -> Scenario:
        return replace(self, **self.quick, quick={})

    def replica_profiles(self) -> tuple[EngineProfile, ...]:
        """Each replica's profile for a mixed pool (empty: all run ``profile``)."""
        return tuple(p for p, n in self.mix for _ in range(n))

    def mix_description(self) -> list[dict[str, Any]]:
        """The mix as results record it: profile, replicas, class and price of each."""
        return [
            {
                "profile": p.name,
                "replicas": n,
                "accelerator": p.accelerator,
                "cost_per_hour": p.cost_per_hour,
            }
            for p, n in self.mix
        ]


__all__ = ["Scenario", "WorkloadFactory"]
