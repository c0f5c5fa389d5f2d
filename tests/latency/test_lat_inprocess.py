"""The in-process predictor: fallback, retraining (simulation and live), atomic swaps."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from lat_support import FAST, random_rows, samples

from sluicegate.clock import ManualClock, MonotonicClock
from sluicegate.latency.features import feature_matrix
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.model import TrainingData, train_bundle
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.latency.store import SampleStore


def settings(**overrides: object) -> PredictorSettings:
    base = PredictorSettings(retrain_interval_s=10.0, min_samples=100, train=FAST)
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_is_a_latency_predictor_and_falls_back_before_any_model() -> None:
    predictor = InProcessPredictor(ManualClock(), settings())
    assert isinstance(predictor, LatencyPredictor)
    assert not predictor.needs_io  # asked synchronously while scheduling
    assert not predictor.ready
    assert predictor.predict(random_rows(3)) is None
    predictor.observe(samples(1)[0])  # fine without a model


def test_maybe_retrain_waits_for_interval_and_samples() -> None:
    clock = ManualClock()
    p = InProcessPredictor(clock, settings())
    for s in samples(99, seed=1):
        p.observe(s)
    clock.set(100.0)
    assert not p.maybe_retrain()  # 99 samples minus the held-out ones: too few
    for s in samples(300, seed=2):
        p.observe(s)
    assert p.ttft_samples >= 100
    assert p.maybe_retrain()
    assert p.ready
    assert p.bundle is not None
    assert p.bundle.version == 1
    assert p.bundle.trained_at == 100.0
    assert p.trainings == 1
    assert p.ttft_mape is not None
    assert p.ttft_coverage is not None
    p.observe(samples(1, seed=3)[0])
    clock.set(105.0)
    assert not p.maybe_retrain()  # the interval counts from the last training
    assert p.maybe_retrain(now=110.0)
    assert p.bundle.version == 2
    # Nothing new: no training, however long we wait.
    clock.set(500.0)
    assert not p.maybe_retrain()
    assert p.trainings == 2


def test_first_training_does_not_wait_for_the_interval() -> None:
    clock = ManualClock()
    p = InProcessPredictor(clock, settings(retrain_interval_s=10.0))
    for s in samples(300, seed=2):
        p.observe(s)
    clock.set(1.0)
    assert p.maybe_retrain()  # no model yet: decisions fall back until there is one
    p.observe(samples(1, seed=3)[0])
    clock.set(5.0)
    assert not p.maybe_retrain()  # then the interval holds
    assert p.maybe_retrain(now=11.0)


def test_simulation_training_is_deterministic_and_reads_no_timer() -> None:
    def run() -> np.ndarray:
        clock = ManualClock()
        p = InProcessPredictor(clock, settings(retrain_interval_s=5.0))
        batch = samples(1500, seed=4, sigma=0.2)
        for i, s in enumerate(batch):
            clock.set(i * 0.01)
            p.observe(s)
            p.maybe_retrain()
        # The first as soon as 100 training samples exist (t ≈ 1.1), then every 5 s.
        assert p.trainings == 3
        assert p.last_train_duration_s == 0.0  # no timer: nothing measured
        out = p.predict(random_rows(50, seed=5))
        assert out is not None
        return np.concatenate([out.ttft_ms, out.tpot_ms])

    assert np.array_equal(run(), run())


def test_prediction_metrics_with_a_timer() -> None:
    p = InProcessPredictor(ManualClock(), settings(min_samples=10), timer=time.perf_counter)
    for s in samples(200, seed=6):
        p.observe(s)
    assert p.maybe_retrain(now=10.0)
    assert p.last_train_duration_s > 0
    p.predict(random_rows(7))
    p.predict(random_rows(3))
    assert p.prediction_calls == 2
    assert p.predicted_rows == 10
    assert p.prediction_seconds_total >= p.last_prediction_duration_s > 0


def test_swap_is_atomic_under_concurrent_predictions() -> None:
    store_a, store_b = SampleStore(), SampleStore()
    for s in samples(1500, seed=7):
        store_a.add(s)
    for s in samples(1500, seed=8, sigma=0.5):
        store_b.add(s)
    bundles = [
        train_bundle(TrainingData.snapshot(store_a), FAST, 0.0, 1),
        train_bundle(TrainingData.snapshot(store_b), FAST, 0.0, 2),
    ]
    assert bundles[0] is not None
    assert bundles[1] is not None
    rows = random_rows(20, seed=9)
    x = feature_matrix(rows)
    expected = [b.predict(x) for b in bundles if b is not None]
    p = InProcessPredictor(ManualClock(), settings(), bundle=bundles[0])
    stop = threading.Event()
    errors: list[BaseException] = []
    seen = [0, 0]

    def predict_loop() -> None:
        try:
            while not stop.is_set():
                out = p.predict(rows)
                assert out is not None
                for i, e in enumerate(expected):
                    if np.array_equal(out.ttft_ms, e.ttft_ms):
                        assert np.array_equal(out.tpot_ms, e.tpot_ms)  # never a mix
                        seen[i] += 1
                        break
                else:
                    raise AssertionError("prediction from neither model")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=predict_loop) for _ in range(4)]
    for t in threads:
        t.start()
    # Meanwhile: real retrainings swap fresh bundles in, and the two known ones alternate.
    for s in samples(400, seed=10):
        p.observe(s)
    deadline = time.monotonic() + 1.5
    i = 0
    while time.monotonic() < deadline:
        b = bundles[i % 2]
        assert b is not None
        p.swap(b)
        i += 1
        time.sleep(0.001)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert seen[0] > 0
    assert seen[1] > 0


async def test_live_trainer_trains_in_a_thread_saves_and_swaps(tmp_path: Path) -> None:
    model_dir = tmp_path / "models"
    p = InProcessPredictor(
        MonotonicClock(),
        settings(min_samples=50, model_dir=str(model_dir), train=replace(FAST, n_estimators=150)),
        timer=time.perf_counter,
    )
    for s in samples(20_000, seed=11, sigma=0.2):
        p.observe(s)
    loop = asyncio.get_running_loop()
    gaps: list[float] = []

    async def ticker() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    trainer = asyncio.create_task(p.run_trainer(interval_s=0.05))
    try:
        for _ in range(600):
            await asyncio.sleep(0.02)
            if p.ready:
                break
        assert p.ready, "no model after 12 s"
    finally:
        trainer.cancel()
        tick.cancel()
        await asyncio.gather(trainer, tick, return_exceptions=True)
    assert p.trainings >= 1
    assert p.last_train_duration_s > 0.05
    # The loop kept ticking while XGBoost trained in its thread.
    assert max(gaps) < max(0.25, p.last_train_duration_s / 2), (max(gaps), p.last_train_duration_s)
    # Saved: a restarted predictor starts warm with the same answers.
    restarted = InProcessPredictor(MonotonicClock(), settings())
    assert not restarted.ready
    assert restarted.load(model_dir)
    rows = random_rows(30, seed=12)
    a, b = p.predict(rows), restarted.predict(rows)
    assert a is not None
    assert b is not None
    if p.bundle is not None and restarted.bundle is not None:
        assert restarted.bundle.version == p.bundle.version
        assert np.array_equal(a.ttft_ms, b.ttft_ms)


async def test_retrain_async_needs_new_samples() -> None:
    p = InProcessPredictor(MonotonicClock(), settings(min_samples=20))
    assert not await p.retrain_async()
    for s in samples(100, seed=13):
        p.observe(s)
    assert await p.retrain_async()
    assert not await p.retrain_async()  # nothing new


def test_save_and_load(tmp_path: Path) -> None:
    p = InProcessPredictor(ManualClock(), settings(min_samples=10))
    assert not p.save(tmp_path / "none")
    assert not p.load(tmp_path / "none")
    for s in samples(200, seed=14):
        p.observe(s)
    assert p.maybe_retrain(now=10.0)
    assert p.save(tmp_path / "m")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bundle.json").write_text("{}")
    q = InProcessPredictor(ManualClock(), settings())
    assert not q.load(tmp_path / "bad")  # logged, not raised
    assert q.load(tmp_path / "m")
    assert q.ready


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="retrain_interval_s"):
        PredictorSettings(retrain_interval_s=0)
    with pytest.raises(ValueError, match="min_samples"):
        PredictorSettings(min_samples=0)


async def test_live_trainer_trains_the_first_model_without_waiting_the_interval() -> None:
    """With no model, every decision falls back: the first training comes as soon as
    there are enough samples (checked every second), not one retrain interval later."""
    p = InProcessPredictor(MonotonicClock(), settings(min_samples=50, retrain_interval_s=60.0))
    for s in samples(500, seed=4, sigma=0.1):
        p.observe(s)
    trainer = asyncio.create_task(p.run_trainer())
    try:
        for _ in range(400):
            await asyncio.sleep(0.02)
            if p.ready:
                break
        assert p.ready, "no first model after 8 s with a 60 s retrain interval"
        trainings = p.trainings
        await asyncio.sleep(1.5)
        assert p.trainings == trainings  # once a model exists, the interval holds
    finally:
        trainer.cancel()
        await asyncio.gather(trainer, return_exceptions=True)
