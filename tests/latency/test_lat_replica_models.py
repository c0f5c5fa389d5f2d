"""Several gateway replicas sharing one latency predictor (``docs/replicas.md``, "Latency
models"): each replica's predictor host, built as ``sluicegate serve`` builds it, sends its
samples to the one training server and asks its own prediction server, which syncs from
that training server; the model exists only because the replicas' samples were pooled,
and every replica predicts with the same model version."""

from __future__ import annotations

import asyncio

import numpy as np
from lat_support import PredictServerFactory, TrainServerFactory, random_rows, samples

from sluicegate.api.settings import LatencyPredictorSettings
from sluicegate.clock import MonotonicClock
from sluicegate.framework import LLMRequest
from sluicegate.latency.host import PredictorHost
from sluicegate.latency.predictor import PredictionQuery
from sluicegate.latency.predictserver import PredictionServer
from sluicegate.latency.trainserver import TrainingServer

REPLICAS = 3
PER_REPLICA = 150


def url(server: TrainingServer | PredictionServer) -> str:
    return f"http://127.0.0.1:{server.port}"


async def eventually(condition: object, timeout_s: float = 15.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_replicas_pool_their_samples_and_predict_with_one_model_version(
    train_server: TrainServerFactory, predict_server: PredictServerFactory
) -> None:
    # More samples than any one replica sees: a model means the samples were pooled.
    trainer = await train_server(min_samples=2 * PER_REPLICA)
    sidecars = [await predict_server(url(trainer)) for _ in range(REPLICAS)]
    hosts = [
        PredictorHost(
            LatencyPredictorSettings(prediction_urls=[url(sidecar)], training_url=url(trainer)),
            MonotonicClock(),
            environ={},
        )
        for sidecar in sidecars
    ]
    for host in hosts:
        await host.start()
    try:
        for g, host in enumerate(hosts):
            assert host.remote is not None  # remote mode: no models of its own
            for sample in samples(PER_REPLICA, seed=10 + g, sigma=0.1):
                host.service.observe(sample)
        store = trainer.predictor.store
        await eventually(lambda: store.ttft.added == REPLICAS * PER_REPLICA)
        await eventually(
            lambda: trainer.predictor.bundle is not None and not trainer.predictor.has_new_samples()
        )
        bundle = trainer.predictor.bundle
        assert bundle is not None
        await eventually(
            lambda: all(
                s.predictor.bundle is not None and s.predictor.bundle.version == bundle.version
                for s in sidecars
            )
        )
        rows = random_rows(8, seed=3)
        query = PredictionQuery(LLMRequest("q", "m", "m", b"", 0, 0.0), [], rows)
        answers = [await host.service.predict_query_async(query) for host in hosts]
        first = answers[0]
        assert first is not None
        for answer in answers[1:]:
            assert answer is not None
            assert np.array_equal(answer.ttft_ms, first.ttft_ms)
            assert np.array_equal(answer.tpot_ms, first.tpot_ms)
        expected = trainer.predictor.predict(rows)
        assert expected is not None
        assert np.allclose(first.ttft_ms, expected.ttft_ms, rtol=1e-5)
    finally:
        for host in hosts:
            await host.stop()
