"""Scores of the latency-accuracy benchmark (:mod:`sluicegate.bench.latency_accuracy`):
MAPE, median APE and coverage of held-out predictions, and where a level's TTFT error
comes from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sluicegate.latency.features import FeatureRow


@dataclass(frozen=True, slots=True)
class TargetScores:
    """One target's scores over the held-out requests (fractions; NaN: nothing scored)."""

    n: int
    mean_mape: float
    mean_median_ape: float
    quantile_coverage: float
    quantile_mape: float
    observed_p50_ms: float
    ablation_mape: float
    """MAPE of the mean model without the token-timing features."""


def score(
    observed: np.ndarray,
    mean: np.ndarray,
    quantile: np.ndarray,
    ablation: np.ndarray | None = None,
) -> TargetScores:
    """Scores of predictions against observed times (ms); rows with no observation or a
    missing prediction are left out."""
    if ablation is None:
        ablation = np.full_like(observed, math.nan)
    keep = (observed > 0) & np.isfinite(observed) & np.isfinite(mean) & np.isfinite(quantile)
    y, m, q, a = observed[keep], mean[keep], quantile[keep], ablation[keep]
    if len(y) == 0:
        nan = math.nan
        return TargetScores(0, nan, nan, nan, nan, nan, nan)
    ape = np.abs(m - y) / y
    blind = np.isfinite(a)
    return TargetScores(
        n=len(y),
        mean_mape=float(ape.mean()),
        mean_median_ape=float(np.median(ape)),
        quantile_coverage=float(np.mean(y <= q)),
        quantile_mape=float(np.mean(np.abs(q - y) / y)),
        observed_p50_ms=float(np.median(y)),
        ablation_mape=(
            float(np.mean(np.abs(a[blind] - y[blind]) / y[blind])) if blind.any() else math.nan
        ),
    )


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Where a level's TTFT error comes from (mean model; fractions, NaN: none such)."""

    whole_match_share: float
    """Scored requests whose prefix-cache score on the chosen endpoint was 1 (every
    full block of the prompt said to be cached there)."""
    long_iteration_share: float
    """Scored requests dispatched when the endpoint's iteration in progress had already
    run longer than its last interval (``ms_since_last_token > token_interval_ms``): a
    longer iteration than the one before, e.g. a large prefill, whose end the token
    timing cannot place."""
    long_iteration_mape: float
    """TTFT MAPE of those requests."""
    other_mape: float
    """TTFT MAPE of the rest."""


def diagnose(rows: Sequence[FeatureRow], observed: np.ndarray, mean: np.ndarray) -> Diagnosis:
    """:class:`Diagnosis` of the scored requests' ``rows`` and their observed and
    mean-model TTFT (ms), rows left out as :func:`score` leaves them."""
    keep = (observed > 0) & np.isfinite(observed) & np.isfinite(mean)
    nan = math.nan
    if not keep.any():
        return Diagnosis(nan, nan, nan, nan)
    y, m = observed[keep], mean[keep]
    ape = np.abs(m - y) / y
    kept = [row for row, k in zip(rows, keep.tolist(), strict=True) if k]
    whole = np.array([row.prefix_cache_score >= 1.0 for row in kept])
    long = np.array(
        [0 < row.token_interval_ms < row.ms_since_last_token for row in kept], dtype=bool
    )

    def mape(mask: np.ndarray) -> float:
        return float(ape[mask].mean()) if mask.any() else nan

    return Diagnosis(float(whole.mean()), float(long.mean()), mape(long), mape(~long))
