"""The DES's default model predictor is the hardware-aware one: on a homogeneous pool —
of no named class, or of one — every request goes where, and finishes when, it did with
the single in-process model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec, RunResult
from sluicegate.bench.policies import policy_config
from sluicegate.bench.scenarios import get_scenario
from sluicegate.datalayer.endpoint import Hardware
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.sim.profiles import get_profile


def run(single: bool, cls: str | None) -> RunResult:
    scenario = get_scenario("slo-mixed")
    spec = ClusterSpec(
        profile=get_profile("llama3-8b-h100"),
        replicas=2,
        picker=policy_config("predicted-latency")[0],
        predictor="model",
        model=scenario.model,
        seed=1,
        extra_docs=list(scenario.extra_docs),
        predictor_settings=replace(PredictorSettings(), min_samples=20, retrain_interval_s=1.0),
        predictor_factory=InProcessPredictor if single else None,
    )
    sim = ClusterSimulation(spec)
    for endpoint in sim.endpoints:
        endpoint.hardware = Hardware(cls)
    return sim.run(scenario.workload(30.0, 5.0, 1), horizon_s=20.0)


@pytest.mark.parametrize("cls", [None, "h100-80gb"])
def test_a_homogeneous_pool_routes_exactly_as_with_the_single_model(cls: str | None) -> None:
    before, after = run(True, None), run(False, cls)
    predicted = [r for r in after.records if not r.fell_back]
    assert len(predicted) >= 50  # the models did route (the rest: warming up)
    assert [(r.endpoint, r.first_token, r.finish, r.status) for r in after.records] == [
        (r.endpoint, r.first_token, r.finish, r.status) for r in before.records
    ]
