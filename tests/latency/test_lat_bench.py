"""The latency benchmark's building blocks (the benchmark itself runs by hand)."""

from __future__ import annotations

import pytest
from lat_support import FAST

from sluicegate.bench.latency_speed.in_process import measure_in_process
from sluicegate.bench.latency_speed.synthetic import (
    oracle_p90_mape,
    request_rows,
    synthetic_samples,
)
from sluicegate.bench.loadgen import parse_wrk
from sluicegate.clock import ManualClock
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.model import TrainingData, train_bundle
from sluicegate.latency.store import SampleStore


def test_synthetic_samples_and_request_rows() -> None:
    batch = synthetic_samples(500, seed=1)
    assert len(batch) == 500
    assert all((s.ttft_ms or 0) > 0 and (s.tpot_ms or 0) > 0 for s in batch)
    assert synthetic_samples(500, seed=1) == batch  # seeded
    rows = request_rows(4, 10, seed=2)
    assert [len(r) for r in rows] == [10] * 4
    for candidates in rows:  # one prompt, many endpoints
        assert len({r.input_token_length for r in candidates}) == 1
        assert len({r.num_request_running for r in candidates}) > 1


def test_measure_in_process_on_a_small_model() -> None:
    store = SampleStore()
    for s in synthetic_samples(600, seed=3):
        store.add(s)
    bundle = train_bundle(TrainingData.snapshot(store), FAST, 0.0, 1)
    assert bundle is not None
    run = measure_in_process(
        InProcessPredictor(ManualClock(), bundle=bundle), request_rows(5, 10, seed=4), 50
    )
    assert run.calls == 50
    assert len(run.wall_ms) == 50
    assert run.predictions_per_cpu_s > 0
    assert run.percentile_ms(99) >= run.percentile_ms(50) > 0


def test_oracle_mape_and_wrk_parsing() -> None:
    assert oracle_p90_mape(0.25) == pytest.approx(0.44, abs=0.01)
    out = (
        "  Latency Distribution\n     50%  512.00us\n     99%    2.10ms\n"
        "  1000 requests in 1.00s, 100.00KB read\n"
    )
    wrk = parse_wrk(out)  # the server run's latencies: seconds, shown as ms
    assert wrk.p50 * 1000 == pytest.approx(0.512)
    assert wrk.p99 * 1000 == pytest.approx(2.1)
