"""Synthetic latency data for the predictor tests: latency as a known function of the row.

``ttft_ms = 15 + 0.04 · effective_input_tokens + 25 · waiting + 0.005 · prefill_in_flight``
and ``tpot_ms = 6 + 0.15 · running + 0.00005 · decode_in_flight + 2 · kv``, each times
log-normal noise of the given sigma (0: exact).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from sluicegate.latency.features import REUSE_DISTANCE_CAP_TOKENS, FeatureRow, Sample
from sluicegate.latency.model import TrainConfig
from sluicegate.latency.predictserver import PredictionServer
from sluicegate.latency.trainserver import TrainingServer

FAST = TrainConfig(n_estimators=60, learning_rate=0.15)
"""Small, quick models for tests (the production size is 200 trees at 0.05)."""


class TrainServerFactory(Protocol):
    """The ``train_server`` fixture: ``await train_server(**TrainServerOptions fields)``."""

    async def __call__(self, **options: Any) -> TrainingServer: ...


PredictServerFactory = Callable[..., Awaitable[PredictionServer]]
"""The ``predict_server`` fixture: ``await predict_server(training_url, **options)``."""


def random_rows(n: int, seed: int = 0) -> list[FeatureRow]:
    rng = np.random.default_rng(seed)
    timing = np.random.default_rng(seed + 77)  # its own stream: the other draws stay as they were
    later = np.random.default_rng(seed + 91)  # likewise for the features added after those
    rows = []
    for _ in range(n):
        rows.append(
            FeatureRow(
                kv_cache_percentage=float(rng.random()),
                input_token_length=int(np.exp(rng.uniform(np.log(16), np.log(8192)))),
                num_request_waiting=int(min(rng.geometric(0.35) - 1, 20)),
                num_request_running=int(rng.integers(0, 65)),
                prefill_tokens_in_flight=int(rng.integers(0, 30_000)),
                decode_tokens_in_flight=int(rng.integers(0, 60_000)),
                prefix_cache_score=float(rng.random()),
                dispatched_since_scrape=int(rng.integers(0, 5)),
                expected_output_tokens=int(rng.integers(16, 1025)),
                ms_since_last_token=float(timing.uniform(0.0, 1000.0)),
                token_interval_ms=float(timing.uniform(0.0, 60.0)),
                prompt_tokens_before_last_token=int(later.integers(0, 20_000)),
                prompt_tokens_after_last_token=int(later.integers(0, 5_000)),
                prefix_reuse_distance_tokens=int(
                    np.exp(later.uniform(np.log(64), np.log(REUSE_DISTANCE_CAP_TOKENS)))
                ),
            )
        )
    return rows


def true_ttft(row: FeatureRow) -> float:
    return (
        15.0
        + 0.04 * row.effective_input_tokens
        + 25.0 * row.num_request_waiting
        + 0.005 * row.prefill_tokens_in_flight
    )


def true_tpot(row: FeatureRow) -> float:
    return (
        6.0
        + 0.15 * row.num_request_running
        + 0.00005 * row.decode_tokens_in_flight
        + 2.0 * row.kv_cache_percentage
    )


def samples(n: int, seed: int = 0, sigma: float = 0.0, tpot: bool = True) -> list[Sample]:
    """``n`` samples of random rows with the known latencies times log-normal noise."""
    rng = np.random.default_rng(seed + 1_000_003)
    out = []
    for row in random_rows(n, seed):
        noise_t, noise_p = np.exp(rng.normal(0.0, sigma, 2)) if sigma else (1.0, 1.0)
        out.append(
            Sample(
                row,
                true_ttft(row) * float(noise_t),
                true_tpot(row) * float(noise_p) if tpot else None,
            )
        )
    return out
