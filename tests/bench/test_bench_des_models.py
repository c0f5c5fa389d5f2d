"""Shared replicas' latency models in the lab (:mod:`sluicegate.bench.des_models`): one
training service fed by every replica's samples at their flushes, each replica predicting
with the version its last sync pulled; independent replicas keep their own models."""

from __future__ import annotations

import numpy as np
import pytest

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_gateway import SEED_STRIDE
from sluicegate.bench.des_models import ReplicaModels, TrainingService
from sluicegate.bench.des_sharing import ReplicaSettings
from sluicegate.bench.des_spec import ClusterSpec
from sluicegate.bench.policies import policy_config
from sluicegate.bench.replica_models import row, variants
from sluicegate.bench.scenarios import get_scenario
from sluicegate.clock import ManualClock
from sluicegate.framework import LLMRequest
from sluicegate.latency.features import FeatureRow, Sample
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.model import TrainConfig
from sluicegate.latency.predictor import PredictionQuery

SMALL = PredictorSettings(
    retrain_interval_s=10.0, min_samples=40, train=TrainConfig(n_estimators=20)
)


def samples(n: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = int(rng.integers(16, 4000))
        waiting = int(rng.integers(0, 8))
        row = FeatureRow(float(rng.random()), tokens, waiting, int(rng.integers(0, 32)), 0, 0,
                         0.0, 0, 128)  # fmt: skip
        out.append(Sample(row, 20.0 + 0.05 * tokens + 30.0 * waiting, 8.0 + waiting))
    return out


def query(n: int = 4) -> PredictionQuery:
    rows = [s.row for s in samples(n, seed=99)]
    request = LLMRequest("q", "m", "m", b"", 0, 0.0)
    return PredictionQuery(request, [], rows)


def service(replicas: int = 2, sync_s: float = 1.0, **options: int) -> TrainingService:
    return TrainingService(ManualClock(), SMALL, replicas, sync_s, **options)  # type: ignore[arg-type]


def test_samples_reach_the_service_at_their_replicas_flushes() -> None:
    svc = service()
    clock = svc.clock
    assert isinstance(clock, ManualClock)
    clock.set(0.2)
    for s in samples(30, seed=1):
        svc.views[0].observe(s)  # replica 0 of 2 flushes at 0.5, 1.5, ...
    for s in samples(30, seed=2):
        svc.views[1].observe(s)  # replica 1 at 1.0, 2.0, ...
    assert not svc.advance(0.49)
    assert svc.samples_pooled == 0
    assert not svc.advance(0.5)  # 30 < min_samples: no model yet
    assert svc.samples_pooled == 30
    assert svc.advance(1.0)  # both replicas' samples: 60 ≥ 40, the first version
    assert svc.samples_pooled == 60
    assert svc.trainer.lanes[None].store.ttft.added == 60
    assert not svc.advance(1.0)  # idempotent at one time (every replica calls it)
    assert svc.versions_published == 1


def test_each_replica_predicts_with_the_version_its_last_sync_pulled() -> None:
    svc = service()
    clock = svc.clock
    assert isinstance(clock, ManualClock)
    for s in samples(60, seed=3):
        svc.views[0].observe(s)
    clock.set(0.6)
    assert svc.advance(0.6)  # trained at 0.6 on the samples flushed at 0.5
    first, second = svc.views
    assert not first.ready  # replica 0 syncs at 0, 1, 2 ...; replica 1 at 0.5, 1.5 ...
    assert not second.ready
    assert first.predict_query(query()) is None
    clock.set(1.0)
    assert first.ready
    assert not second.ready
    clock.set(1.5)
    assert second.ready
    a, b = first.predict_query(query()), second.predict_query(query())
    assert a is not None
    assert b is not None
    assert np.array_equal(a.ttft_ms, b.ttft_ms)  # one model version, pulled by both
    trained = svc.trainer.predict(query().rows)
    assert trained is not None
    assert np.array_equal(a.ttft_ms, trained.ttft_ms)
    # A newer version is used from each replica's next sync on, not before.
    for s in samples(60, seed=4):
        first.observe(s)
    clock.set(10.7)
    assert svc.advance(10.7)
    assert first.held is not None
    assert first.held.number == 1
    clock.set(11.0)
    assert first.ready
    assert first.held is not None
    assert first.held.number == 2
    assert second.held is not None
    assert second.held.number == 1
    clock.set(11.5)
    assert second.ready
    assert second.held is not None
    assert second.held.number == 2
    assert svc.counters()["model_pulls"] == 4
    # Calibration stays per replica (as the client's is per gateway).
    assert first.calibration is not None
    assert first.calibration is not second.calibration


def test_buffers_and_kept_versions_are_bounded() -> None:
    svc = service(replicas=1, sync_s=1.0, max_buffered=3)
    for s in samples(5, seed=5):
        svc.views[0].observe(s)
    assert svc.samples_dropped == 2
    svc = service(replicas=2, sync_s=30.0)
    clock = svc.clock
    assert isinstance(clock, ManualClock)
    for step in range(12):
        for s in samples(50, seed=10 + step):
            svc.views[step % 2].observe(s)
        clock.set(10.0 * step + 5.0)
        svc.advance(clock.now())
    assert svc.versions_published >= 10
    # Kept: those a replica may still pull (published within one sync period), plus one.
    assert len(svc._versions) <= 30.0 / 10.0 + 2


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="model sync must be a positive"):
        service(sync_s=0.0)
    with pytest.raises(ValueError, match="model_sync_s must be a positive"):
        ReplicaSettings(2, "shared", model_sync_s=-1.0)


# ---------------------------------------------------------------------- in a run


def simulation(settings: ReplicaSettings) -> ClusterSimulation:
    scenario = get_scenario("slo-mixed").quick_variant()
    picker, predictor = policy_config("predicted-latency")
    spec = ClusterSpec(
        scenario.profile,
        scenario.replicas,
        picker,
        predictor=predictor,
        model=scenario.model,
        extra_docs=list(scenario.extra_docs),
        predictor_settings=SMALL,
        gateways=settings,
    )
    sim = ClusterSimulation(spec)
    sim.run(scenario.workload(40.0, 6.0, 0), horizon_s=30.0)
    return sim


def test_shared_replicas_train_one_model_on_every_replicas_samples() -> None:
    sim = simulation(ReplicaSettings(3, "shared"))
    training = sim.training
    assert training is not None
    assert all(isinstance(p, ReplicaModels) for p in sim.predictors)
    assert len(sim.predictors) == 3
    completed = sum(1 for r in sim.records if r.completed)
    pooled = sum(lane.store.ttft.added for lane in training.trainer.lanes.values())
    # Every replica's samples are at the service (all but the last second's flushes).
    assert training.samples_pooled == pooled
    assert pooled > 0.8 * completed
    assert training.versions_published >= 1
    held = {p.held.number for p in sim.predictors if isinstance(p, ReplicaModels) and p.held}
    assert len(held) == 1  # by the end, every replica holds the same version
    counters = sim._sharing_counters()
    assert counters is not None
    assert counters["model_versions"] == training.versions_published
    assert counters["model_samples_pooled"] == pooled


@pytest.mark.parametrize(
    "settings",
    [ReplicaSettings(3, "independent"), ReplicaSettings(3, "shared", share_models=False)],
)
def test_independent_replicas_and_own_models_keep_a_model_each(settings: ReplicaSettings) -> None:
    sim = simulation(settings)
    assert sim.training is None
    models = sim.predictors
    assert len(models) == 3
    assert len({id(m) for m in models}) == 3
    assert all(isinstance(m, HardwareAwarePredictor) for m in models)
    completed = sum(1 for r in sim.records if r.completed)
    own = [m.ttft_samples for m in models if isinstance(m, HardwareAwarePredictor)]
    assert max(own) < 0.6 * completed  # each has only its own share


def test_a_predictor_factory_is_refused_for_shared_models() -> None:
    scenario = get_scenario("slo-mixed").quick_variant()
    picker, predictor = policy_config("predicted-latency")
    spec = ClusterSpec(
        scenario.profile,
        scenario.replicas,
        picker,
        predictor=predictor,
        model=scenario.model,
        predictor_factory=HardwareAwarePredictor,
        gateways=ReplicaSettings(2, "shared"),
    )
    with pytest.raises(ValueError, match="predictor factory"):
        ClusterSimulation(spec)


def test_the_diagnostic_runs_the_five_ways_on_one_set_of_arrivals() -> None:
    one, other, independent, own, service = variants(2, 0.5)
    assert one.gateways.gateways == other.gateways.gateways == 1
    assert other.plugin_seed_offset == SEED_STRIDE  # replica 1's stream, same arrivals
    assert not independent.gateways.models_shared
    assert own.gateways.sharing
    assert not own.gateways.models_shared
    assert service.gateways.models_shared
    assert service.gateways.model_sync_s == 0.5
    line = row(
        {
            "variant": "x",
            "slo_attainment": 0.9061,
            "shed": 7,
            "fallbacks": 3,
            "models": [
                {"ttft_samples": 10, "trainings": 2, "ttft_mape": 0.5},
                {"ttft_samples": 12, "trainings": 2, "ttft_mape": None},
            ],
        }
    )
    assert line == "| x | 90.6% | 7 | 3 | 10, 12 | 2, 2 | 50.0%, – |"
