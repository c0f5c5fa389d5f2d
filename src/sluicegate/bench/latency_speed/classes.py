"""In-process prediction speed with hardware classes
(``python -m sluicegate.bench.latency_speed.classes``).

The same production-size models and request rows as the in-process part of
``sluicegate bench micro latency``
(:mod:`~sluicegate.bench.latency_speed.in_process`), predicted three ways, back to back on
one pinned thread:

- ``InProcessPredictor.predict(rows)`` — the single model, as before hardware classes;
- ``HardwareAwarePredictor.predict(rows, classes)`` with every candidate of one class —
  a homogeneous pool under the hardware-aware ``predicted-latency`` preset;
- the same with the candidates alternating between two classes (two models, merged into
  one booster per target: :mod:`sluicegate.latency.merged`).

Throughput is endpoint predictions per CPU-second of the calling thread; latency the
wall time per call. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np

from sluicegate.bench.latency_speed.synthetic import (
    production_bundle,
    request_rows,
    synthetic_samples,
)
from sluicegate.bench.processes import pin_this_thread
from sluicegate.clock import ManualClock
from sluicegate.latency.features import FeatureRow
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import InProcessPredictor

CPU = 1
"""The core the measuring thread is pinned to (the latency benchmark's server core)."""


def measure(
    predict: Callable[[Sequence[FeatureRow]], object], rows: list[list[FeatureRow]], calls: int
) -> tuple[float, float, float]:
    """(endpoint predictions per CPU-s, p50 ms, p99 ms) of ``calls`` back-to-back calls."""
    for i in range(200):
        predict(rows[i % len(rows)])
    wall: list[float] = []
    started_cpu = time.thread_time()
    for i in range(calls):
        batch = rows[i % len(rows)]
        started = time.perf_counter_ns()
        predict(batch)
        wall.append((time.perf_counter_ns() - started) / 1e6)
    cpu = time.thread_time() - started_cpu
    return (
        calls * len(rows[0]) / cpu,
        float(np.percentile(wall, 50)),
        float(np.percentile(wall, 99)),
    )


def _with_classes(
    predictor: HardwareAwarePredictor, classes: list[str | None]
) -> Callable[[Sequence[FeatureRow]], object]:
    def predict(rows: Sequence[FeatureRow]) -> object:
        return predictor.predict(rows, classes)

    return predict


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=150_000)
    parser.add_argument("--calls", type=int, default=20_000, help="calls at 10 endpoints")
    args = parser.parse_args(argv)
    bundle, _, _ = production_bundle(synthetic_samples(args.samples, seed=1))
    single = InProcessPredictor(ManualClock(), bundle=bundle)
    aware = HardwareAwarePredictor(ManualClock())
    for cls in ("h100-80gb", "a100-80gb"):
        lane = aware.lane(cls)
        assert lane is not None
        lane.swap(bundle)
    aware.models_changed()
    lines = [
        "| endpoints per call | predictor | endpoint predictions/s (CPU) | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    with pin_this_thread(CPU) as pinned:
        for endpoints in (10, 100):
            rows = request_rows(200, endpoints, seed=endpoints)
            one: list[str | None] = ["h100-80gb"] * endpoints
            two: list[str | None] = [
                "h100-80gb" if i % 2 else "a100-80gb" for i in range(endpoints)
            ]
            calls = args.calls if endpoints == 10 else args.calls // 4
            arms: tuple[tuple[str, Callable[[Sequence[FeatureRow]], object]], ...] = (
                ("`InProcessPredictor` (single model, before)", single.predict),
                ("`HardwareAwarePredictor`, 1 class", _with_classes(aware, one)),
                ("`HardwareAwarePredictor`, 2 classes", _with_classes(aware, two)),
            )
            for label, predict in arms:
                rate, p50, p99 = measure(predict, rows, calls)
                lines.append(f"| {endpoints} | {label} | {rate:,.0f} | {p50:.3f} | {p99:.3f} |")
    print(f"Pinned to core {CPU}: {pinned}; {args.samples:,} training samples.\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
