"""Small functions several built-in plugins share (score normalisation, sampling)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework.scheduling import ScoredEndpoint


def min_max_inverse(values: Sequence[float]) -> list[float]:
    """``(max − v) / (max − min)`` per value, in [0, 1]; all 1.0 when the values are equal
    (and ``[]`` for no values). Shared by the scorers that rank endpoints by a load count."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]


def uniform_sample(rng: random.Random, scored: Sequence[ScoredEndpoint], k: int) -> list[Endpoint]:
    """``min(k, n)`` distinct endpoints of ``scored`` in uniformly random order."""
    n = len(scored)
    if n == 0:
        return []
    if k == 1:
        return [scored[rng.randrange(n)].endpoint]
    return [s.endpoint for s in rng.sample(scored, min(k, n))]


__all__ = ["min_max_inverse", "uniform_sample"]
