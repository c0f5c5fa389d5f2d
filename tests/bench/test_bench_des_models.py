"""Shared replicas' latency models in the lab (:mod:`sluicegate.bench.des_models`): one
training service fed by every replica's samples at their flushes, each replica predicting
with the version its last sync pulled; independent replicas keep their own models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_gateway import SEED_STRIDE
from sluicegate.bench.des_models import DEFAULT_MAX_BUFFERED, ReplicaModels, TrainingService
from sluicegate.bench.des_sharing import ReplicaSettings
from sluicegate.bench.des_spec import ClusterSpec
from sluicegate.bench.policies import policy_config
from sluicegate.bench.replica_models import row, variants
from sluicegate.bench.runner import run_level
from sluicegate.bench.scenarios import get_scenario
from sluicegate.clock import ManualClock
from sluicegate.framework import LLMRequest
from sluicegate.latency.features import FeatureRow, Sample
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
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


def service(
    replicas: int = 2, sync_s: float = 1.0, max_buffered: int = DEFAULT_MAX_BUFFERED
) -> TrainingService:
    return TrainingService(ManualClock(), SMALL, replicas, sync_s, max_buffered=max_buffered)


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
    assert svc.trainer.store.ttft.added == 60
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


def test_the_service_trains_one_hardware_blind_model_as_the_training_server_does() -> None:
    # The runtime's training server keeps one model for every class, and the client one
    # calibration (docs/replicas.md): the lab's service and views must too, or shared
    # runs on a mixed pool would measure per-class models the runtime cannot serve.
    svc = service()
    clock = svc.clock
    assert isinstance(clock, ManualClock)
    h100 = [replace(s, hardware_class="H100") for s in samples(30, seed=6)]
    a100 = [replace(s, hardware_class="A100") for s in samples(30, seed=7)]
    for s in h100 + a100:
        svc.views[0].observe(s)
    clock.set(1.0)
    # 60 samples ≥ min_samples 40, though neither class alone has 40.
    assert svc.advance(1.0)
    assert type(svc.trainer) is InProcessPredictor
    assert svc.trainer.store.ttft.added == 60
    held = svc.views[0]
    assert held.ready
    a = held.predict_query(query())
    trained = svc.trainer.predict(query().rows)
    assert a is not None
    assert trained is not None
    assert np.array_equal(a.ttft_ms, trained.ttft_ms)
    calibration = held.calibration
    assert calibration is not None
    assert calibration.max_classes == 0  # hardware-blind, as the client's


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
    # Kept: those a replica may still pull (published within one sync period), plus one;
    # one model trains at most once per retrain interval (10 s).
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
    pooled = training.trainer.store.ttft.added
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


def routes(sim: ClusterSimulation) -> list[tuple[float, int, float, float]]:
    return [(r.arrival, r.endpoint, r.first_token, r.finish) for r in sim.records]


def test_a_channel_losing_everything_still_shares_the_training_services_models() -> None:
    # loss=1.0 routes as independent replicas only when each keeps its own models: the
    # models do not travel over the channel.
    independent = routes(simulation(ReplicaSettings(3, "independent")))
    own = routes(simulation(ReplicaSettings(3, "shared", loss=1.0, share_models=False)))
    served = routes(simulation(ReplicaSettings(3, "shared", loss=1.0)))
    assert own == independent
    assert served != independent


@pytest.mark.parametrize(
    ("settings", "recorded"),
    [
        (ReplicaSettings(3, "independent"), "own"),
        (ReplicaSettings(3, "shared"), "shared"),
        (ReplicaSettings(1, "shared"), "own"),
    ],
)
def test_runs_record_where_their_models_came_from(settings: ReplicaSettings, recorded: str) -> None:
    scenario = get_scenario("slo-mixed").quick_variant()
    result = run_level(scenario, "predicted-latency", 10.0, 2.0, 0, gateways=settings)
    assert result.latency_models == recorded
    entry = settings.describe(result.latency_models)
    assert entry["replica_models"] == recorded
    sync_ms = entry["replica_model_sync_ms"]
    assert sync_ms == (1000.0 if recorded == "shared" else None)
    default = run_level(scenario, "default", 10.0, 2.0, 0, gateways=settings)
    assert default.latency_models == "none"
    assert settings.describe("none")["replica_model_sync_ms"] is None


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
