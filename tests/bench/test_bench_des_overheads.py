"""The profile's ``request_overhead_ms`` in the discrete-event lab: a request reaches its
engine's scheduler that long after it arrives, on the simulated clock, and the wait takes
no engine time (the engine's busy time and the decode are unchanged)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec, RunResult
from sluicegate.bench.policies import client_connections, policy_config
from sluicegate.bench.workloads import RequestSpec, Timed, random_text
from sluicegate.sim.profiles import EngineProfile, get_profile

TINY = get_profile("tiny")
MODEL = "tiny-llama"


@dataclass
class Scripted:
    arrivals: list[Timed]

    def initial(self) -> Iterator[Timed]:
        yield from self.arrivals

    def follow_up(self, spec: RequestSpec, now: float, reply: str) -> list[Timed]:
        return []


def _run(profile: EngineProfile, gap_s: float) -> RunResult:
    rng = random.Random(7)
    arrivals: list[Timed] = [
        (i * gap_s, RequestSpec("completions", MODEL, 24, f"{i} " + random_text(rng, 300)))
        for i in range(12)
    ]
    picker, predictor = policy_config("round-robin")
    spec = ClusterSpec(
        profile,
        2,
        picker,
        model=MODEL,
        seed=1,
        predictor=predictor,
        connections=client_connections("round-robin"),
    )
    return ClusterSimulation(spec).run(Scripted(arrivals), horizon_s=60.0)


def test_isolated_requests_start_later_by_the_overhead_and_cost_no_engine_time() -> None:
    plain = _run(TINY, 1.0)
    late = _run(replace(TINY, request_overhead_ms=40.0), 1.0)
    assert all(r.completed for r in (*plain.records, *late.records))
    for a, b in zip(plain.records, late.records, strict=True):
        assert b.first_token - b.arrival == pytest.approx(a.first_token - a.arrival + 0.040)
        assert b.finish - b.first_token == pytest.approx(a.finish - a.first_token)
    for a, b in zip(plain.engines, late.engines, strict=True):
        assert b.counters.busy_s == pytest.approx(a.counters.busy_s)
        assert b.counters.steps == a.counters.steps


def test_overlapping_requests_all_complete_with_the_overhead() -> None:
    """Arrivals every 5 ms onto engines busy decoding: the waits interleave with steps."""
    late = _run(replace(TINY, request_overhead_ms=40.0), 0.005)
    assert all(r.completed for r in late.records)
    for r in late.records:
        assert r.first_token - r.arrival >= 0.040
    for engine in late.engines:
        assert not engine.has_work()
