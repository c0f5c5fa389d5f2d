"""Synthetic training data and production-sized models for the predictor speed benchmark.

The benchmark needs models of the size production trains (200 trees of depth ≤ 6 per
target, p90 objective) and requests shaped like a scheduler's: one prompt, many candidate
endpoints. :func:`synthetic_samples` draws samples of a busy pool whose TTFT and TPOT
follow a plausible cost model with log-normal noise; :func:`production_bundle` trains the
production configuration on them through the stratified sample window;
:func:`request_rows` turns samples into per-request candidate rows. The noise level also
bounds how good a p90 model can score (:func:`oracle_p90_mape`), which the report prints
beside the trained models' held-out MAPE.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from sluicegate.latency.features import FeatureRow, Sample, feature_matrix
from sluicegate.latency.model import ModelBundle, TrainConfig, TrainingData, train_bundle
from sluicegate.latency.store import SampleStore

TTFT_SIGMA = 0.25
TPOT_SIGMA = 0.15


def oracle_p90_mape(sigma: float) -> float:
    """MAPE of a perfect p90 predictor under log-normal noise of ``sigma`` (what the
    trained models' held-out MAPE should be compared with)."""
    z = np.random.default_rng(0).normal(0.0, sigma, 1_000_000)
    return float(np.mean(np.abs(np.exp(1.2815516 * sigma - z) - 1.0)))


def synthetic_samples(n: int, seed: int = 0) -> list[Sample]:
    """Samples of a busy pool of 8B-class replicas (prefill ≈ 12k tokens/s): TTFT is
    queueing + own prefill + prefill in flight + decode interference + KV pressure, TPOT
    grows with the batch and with prefills sharing it; log-normal noise (σ 0.25 / 0.15)."""
    rng = np.random.default_rng(seed)
    running = rng.integers(0, 65, n)
    busy = running / 64.0
    waiting = np.where(rng.random(n) < busy**3, rng.geometric(0.25, n), 0)
    decode = (running * rng.uniform(200, 1500, n)).astype(np.int64)
    kv = np.clip(decode / 120_000 + rng.normal(0.05, 0.05, n), 0.0, 1.0)
    prompt = np.exp(rng.uniform(np.log(32), np.log(16_000), n)).astype(np.int64)
    prefix = np.where(rng.random(n) < 0.4, rng.uniform(0.8, 1.0, n), rng.uniform(0, 0.3, n))
    prefill = (rng.random(n) < busy) * rng.integers(0, 40_000, n)
    since = rng.integers(0, 4, n)
    output = rng.integers(16, 2049, n)
    samples = []
    for i in range(n):
        row = FeatureRow(
            kv_cache_percentage=float(kv[i]),
            input_token_length=int(prompt[i]),
            num_request_waiting=int(waiting[i]),
            num_request_running=int(running[i]),
            prefill_tokens_in_flight=int(prefill[i]),
            decode_tokens_in_flight=int(decode[i]),
            prefix_cache_score=float(prefix[i]),
            dispatched_since_scrape=int(since[i]),
            expected_output_tokens=int(output[i]),
        )
        ttft = (
            12.0
            + row.effective_input_tokens / 12.0
            + row.prefill_tokens_in_flight / 12.0
            + 45.0 * row.num_request_waiting
            + 0.25 * row.num_request_running
            + max(0.0, row.kv_cache_percentage - 0.9) * 3000.0
        ) * float(np.exp(rng.normal(0, TTFT_SIGMA)))
        tpot = (
            7.0
            + 0.12 * row.num_request_running
            + row.decode_tokens_in_flight / 20_000.0
            + row.prefill_tokens_in_flight / 4000.0
        ) * float(np.exp(rng.normal(0, TPOT_SIGMA)))
        samples.append(Sample(row, ttft, tpot))
    return samples


def production_bundle(samples: Sequence[Sample]) -> tuple[ModelBundle, int, float]:
    """The bundle (production parameters) trained on ``samples`` through the stratified
    window, the window's TTFT size, and the training wall time in seconds."""
    store = SampleStore()
    for s in samples:
        store.add(s)
    started = time.perf_counter()
    bundle = train_bundle(TrainingData.snapshot(store), TrainConfig(), 0.0, 1)
    elapsed = time.perf_counter() - started
    assert bundle is not None
    return bundle, store.ttft.train_count, elapsed


def ttft_mape_by_half(bundle: ModelBundle, n: int = 20_000) -> tuple[float, float]:
    """TTFT MAPE on fresh samples below and above their median TTFT."""
    fresh = synthetic_samples(n, seed=99)
    y = np.array([s.ttft_ms for s in fresh])
    predicted = bundle.predict(feature_matrix([s.row for s in fresh])).ttft_ms
    ape = np.abs(predicted - y) / y
    fast = y < np.median(y)
    return float(ape[fast].mean()), float(ape[~fast].mean())


def request_rows(count: int, endpoints: int, seed: int) -> list[list[FeatureRow]]:
    """``count`` scheduling requests' candidate rows: one prompt, ``endpoints`` endpoints."""
    pool = [s.row for s in synthetic_samples(count * endpoints, seed)]
    out = []
    for i in range(count):
        base = pool[i * endpoints]
        out.append(
            [
                FeatureRow(
                    r.kv_cache_percentage,
                    base.input_token_length,
                    r.num_request_waiting,
                    r.num_request_running,
                    r.prefill_tokens_in_flight,
                    r.decode_tokens_in_flight,
                    r.prefix_cache_score,
                    r.dispatched_since_scrape,
                    base.expected_output_tokens,
                )
                for r in pool[i * endpoints : (i + 1) * endpoints]
            ]
        )
    return out
