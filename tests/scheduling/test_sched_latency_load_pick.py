"""The latency scorer's ``load`` strategy: among the endpoints predicted to meet the SLOs,
the least capacity-weighted in-flight load wins on a pool mixing hardware classes; on a
pool of one class (or of none named) it scores exactly as ``most``."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, Hardware
from sluicegate.framework import (
    PREDICTIONS,
    CycleState,
    EndpointPrediction,
    LLMRequest,
    PluginContext,
)
from sluicegate.scheduling.config import load_preset

REGISTRY = default_registry()
H100, A100 = "h100-80gb", "a100-80gb"
CONFIGURED = {"capacityNormalization": "configured", "classCapacity": {H100: 3.0, A100: 1.0}}


def endpoint(i: int, cls: str | None, inflight: int) -> Endpoint:
    e = Endpoint(
        name=f"ep-{i}",
        host="10.0.0.1",
        port=8000 + i,
        metrics=EngineMetrics(scraped_at=0.0),
        index=i,
    )
    e.hardware = Hardware(cls, None)
    e.inflight.requests = inflight
    return e


def scorer(**params: Any) -> Any:
    return REGISTRY.create("latency-scorer", "s", params, PluginContext(ManualClock(), 0))


def request() -> LLMRequest:
    return LLMRequest(
        request_id="r",
        model="base",
        target_model="base",
        prompt=b"hi",
        prompt_tokens=1,
        arrival=0.0,
        headers={},
    )


def state(headrooms: list[tuple[float, float]], pool: list[Endpoint]) -> CycleState:
    s = CycleState()
    s.put(
        PREDICTIONS,
        {
            e.name: EndpointPrediction(
                ttft_ms=500.0 - t,
                tpot_ms=50.0 - p,
                ttft_valid=t > 0,
                tpot_valid=p > 0,
                ttft_headroom=t,
                tpot_headroom=p,
                dispatched=e.inflight.requests,
            )
            for e, (t, p) in zip(pool, headrooms, strict=True)
        },
    )
    return s


def test_load_picks_least_capacity_weighted_load_among_those_meeting_the_slo() -> None:
    # The H100 has the most headroom and 4 in flight (load 4 · 1); the first A100 2 in
    # flight (load 2 · 3 = 6); the second A100 1 (load 3) but is predicted to miss.
    pool = [endpoint(0, H100, 4), endpoint(1, A100, 2), endpoint(2, A100, 1)]
    headrooms = [(400.0, 30.0), (100.0, 10.0), (-50.0, 5.0)]
    got = scorer(headroomSelectionStrategy="load", **CONFIGURED).score(
        request(), state(headrooms, pool), pool
    )
    # ⌊(1 − l / l_max)·100 + 1⌋/100 over the group {H100: 4, A100: 6}
    assert got == [pytest.approx(0.34), pytest.approx(0.01), 0.0]
    most = scorer(headroomSelectionStrategy="most", **CONFIGURED).score(
        request(), state(headrooms, pool), pool
    )
    assert most[0] > most[1]  # ``most`` prefers the H100's headroom either way
    # Twice as much in flight on the H100 and it loses to the A100 under ``load``.
    pool[0].inflight.requests = 8
    got = scorer(headroomSelectionStrategy="load", **CONFIGURED).score(
        request(), state(headrooms, pool), pool
    )
    assert got[1] > got[0]


def test_load_counts_requests_alone_while_capacities_are_unknown() -> None:
    pool = [endpoint(0, H100, 3), endpoint(1, A100, 1)]
    got = scorer(headroomSelectionStrategy="load", capacityNormalization="measured").score(
        request(), state([(10.0, 1.0), (10.0, 1.0)], pool), pool
    )
    assert got == [pytest.approx(0.01), pytest.approx(0.67)]  # ⌊(1 − 1/3)·100 + 1⌋/100


@pytest.mark.parametrize("cls", [None, H100])
def test_load_scores_as_most_on_a_pool_of_one_class(cls: str | None) -> None:
    pool = [endpoint(0, cls, 5), endpoint(1, cls, 0), endpoint(2, cls, 2)]
    headrooms = [(300.0, 20.0), (50.0, 2.0), (-1.0, 4.0)]
    load = scorer(headroomSelectionStrategy="load", capacityNormalization="measured")
    most = scorer(headroomSelectionStrategy="most", capacityNormalization="measured")
    for _ in range(2):
        assert load.score(request(), state(headrooms, pool), pool) == most.score(
            request(), state(headrooms, pool), pool
        )


def test_load_needs_two_classes_seen_not_in_one_candidate_list() -> None:
    # Once the pool showed two classes, a decision among one class's endpoints (e.g. after
    # an affinity filter) is still by load.
    s = scorer(headroomSelectionStrategy="load", capacityNormalization="measured")
    mixed = [endpoint(0, H100, 1), endpoint(1, A100, 1)]
    s.score(request(), state([(1.0, 1.0), (1.0, 1.0)], mixed), mixed)
    h100s = [endpoint(0, H100, 4), endpoint(1, H100, 1)]
    got = s.score(request(), state([(300.0, 20.0), (10.0, 1.0)], h100s), h100s)
    assert got[1] > got[0]


def test_predicted_latency_preset_picks_by_load_and_the_blind_one_by_headroom() -> None:
    def strategy(preset: str) -> object:
        spec = next(p for p in load_preset(preset).plugins if p.type == "latency-scorer")
        return (spec.parameters or {}).get("headroomSelectionStrategy")

    assert strategy("predicted-latency") == "load"
    assert strategy("predicted-latency-pool") == "most"
