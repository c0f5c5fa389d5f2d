"""TurnBatcher: concurrent server-side predictions share one booster call."""

from __future__ import annotations

import asyncio

import numpy as np
from lat_support import FAST, random_rows, samples

from sluicegate.clock import ManualClock
from sluicegate.latency.batching import TurnBatcher
from sluicegate.latency.features import feature_matrix
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.model import ModelBundle, TrainingData, train_bundle
from sluicegate.latency.store import SampleStore


def bundle_of(seed: int, version: int) -> ModelBundle:
    store = SampleStore()
    for s in samples(400, seed=seed):
        store.add(s)
    bundle = train_bundle(TrainingData.snapshot(store), FAST, 0.0, version)
    assert bundle is not None
    return bundle


async def test_one_call_per_turn_and_per_bundle_each_caller_gets_its_rows() -> None:
    a, b = bundle_of(1, 1), bundle_of(2, 2)
    predictor = InProcessPredictor(ManualClock(), bundle=a)
    batcher = TurnBatcher(predictor)
    matrices = [feature_matrix(random_rows(n, seed=n)) for n in (1, 5, 10, 3, 7)]
    bundles = [a, a, b, a, b]
    results = await asyncio.gather(
        *(batcher.predict(bn, x) for bn, x in zip(bundles, matrices, strict=True))
    )
    assert batcher.merged_calls == 2  # one per bundle
    assert predictor.prediction_calls == 2
    assert predictor.predicted_rows == 26
    for bn, x, out in zip(bundles, matrices, results, strict=True):
        alone = bn.predict(x)
        assert np.array_equal(out.ttft_ms, alone.ttft_ms)
        assert np.array_equal(out.tpot_ms, alone.tpot_ms)
    # Separate turns: separate calls.
    await batcher.predict(a, matrices[0])
    await batcher.predict(a, matrices[1])
    assert batcher.merged_calls == 4


async def test_row_limit_splits_merges() -> None:
    a = bundle_of(3, 1)
    batcher = TurnBatcher(InProcessPredictor(ManualClock(), bundle=a), max_rows=12)
    matrices = [feature_matrix(random_rows(5, seed=i)) for i in range(5)]
    results = await asyncio.gather(*(batcher.predict(a, x) for x in matrices))
    assert batcher.merged_calls == 3  # 10 + 10 + 5 rows
    for x, out in zip(matrices, results, strict=True):
        assert np.array_equal(out.ttft_ms, a.predict(x).ttft_ms)
