"""Predictor speed in the gateway's own process (``InProcessPredictor``).

One call predicts TTFT and TPOT for every candidate endpoint of one request. Calls are
made back to back on one thread (the report pins it to a core): throughput is endpoint
predictions per CPU-second of that thread (``time.thread_time``), so other load on a
shared machine does not count against it, and each call's wall time
(``time.perf_counter_ns``) is the latency a scheduling decision sees. Two comparisons
explain the numbers: the same work through ``Booster.inplace_predict`` (the xgboost
wrapper, without ``sluicegate.latency.xgbfast``'s direct call), and one booster call's
cost by row count — most of a small call is fixed cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sluicegate.bench.latency_speed.synthetic import synthetic_samples
from sluicegate.latency.features import FeatureRow, feature_matrix
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.model import ModelBundle


@dataclass(frozen=True, slots=True)
class InProcessRun:
    """Back-to-back calls of one size: total thread CPU and each call's wall and CPU ms."""

    endpoints: int
    calls: int
    cpu_s: float
    wall_ms: list[float]
    cpu_ms: list[float]
    """CPU time of each call (excludes time the thread was preempted)."""

    @property
    def predictions_per_cpu_s(self) -> float:
        return self.calls * self.endpoints / self.cpu_s

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.wall_ms, q))

    def cpu_percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.cpu_ms, q))


def measure_in_process(
    predictor: InProcessPredictor, rows: Sequence[Sequence[FeatureRow]], calls: int
) -> InProcessRun:
    """``calls`` predictions, one at a time, cycling through the row sets."""
    for i in range(min(200, calls)):  # warm up
        predictor.predict(rows[i % len(rows)])
    wall: list[float] = []
    cpu_each: list[float] = []
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    cpu_started = time.thread_time()
    for i in range(calls):
        batch = rows[i % len(rows)]
        started_cpu = cpu_clock()
        started = clock()
        predictor.predict(batch)
        ended = clock()
        cpu_each.append((cpu_clock() - started_cpu) / 1e6)
        wall.append((ended - started) / 1e6)
    cpu = time.thread_time() - cpu_started
    return InProcessRun(len(rows[0]), calls, cpu, wall, cpu_each)


def measure_wrapper(bundle: ModelBundle, rows: Sequence[Sequence[FeatureRow]], calls: int) -> float:
    """Endpoint predictions per CPU-second with ``Booster.inplace_predict`` itself (no
    fast path), for comparison."""
    boosters = [bundle.ttft.booster, bundle.tpot.booster if bundle.tpot else bundle.ttft.booster]
    started = time.thread_time()
    for i in range(calls):
        x = feature_matrix(rows[i % len(rows)])
        for booster in boosters:
            booster.inplace_predict(x, validate_features=False)
    return calls * len(rows[0]) / (time.thread_time() - started)


def booster_call_us(bundle: ModelBundle, calls: int) -> dict[int, float]:
    """CPU µs of one TTFT booster call for 1, 10, 100 and 1,000 rows."""
    out = {}
    for n in (1, 10, 100, 1000):
        x = feature_matrix([s.row for s in synthetic_samples(n, seed=n)])
        k = max(20, calls // max(1, n // 10))
        for _ in range(20):
            bundle.ttft.predict(x)
        started = time.thread_time()
        for _ in range(k):
            bundle.ttft.predict(x)
        out[n] = (time.thread_time() - started) / k * 1e6
    return out
