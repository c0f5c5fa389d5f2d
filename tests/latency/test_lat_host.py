"""PredictorHost at start: saved models from the model directory (the flag's over the
settings'), and training on a recorded trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from lat_support import random_rows, samples
from prometheus_client import CollectorRegistry, generate_latest

from sluicegate.api.settings import LatencyPredictorSettings
from sluicegate.clock import MonotonicClock
from sluicegate.latency.host import PredictorHost
from sluicegate.latency.trace import TraceError, TraceWriter


def write_trace(path: Path, n: int) -> Path:
    with TraceWriter(path) as writer:
        writer.write_all(samples(n, seed=3, sigma=0.1))
    return path


async def test_a_trace_trains_at_start_and_models_go_to_the_flag_directory(
    tmp_path: Path,
) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", 300)
    configured, flagged = tmp_path / "configured", tmp_path / "flagged"
    settings = LatencyPredictorSettings(modelDir=str(configured), minSamples=50)
    host = PredictorHost(settings, MonotonicClock(), {}, model_dir=str(flagged), trace=str(trace))
    assert host.local is not None
    assert not host.local.ready
    await host.start()
    try:
        assert host.local.ready
        assert host.local.trainings == 1
        assert host.local.ttft_samples > 200  # the trace's samples stay in the window
    finally:
        await host.stop()
    assert (flagged / "bundle.json").exists()
    assert not configured.exists()
    # A restart with the same directory starts warm, without the trace.
    again = PredictorHost(settings, MonotonicClock(), {}, model_dir=str(flagged))
    await again.start()
    try:
        assert again.local is not None
        assert again.local.ready
    finally:
        await again.stop()


async def test_without_the_flag_the_settings_directory_is_used(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", 200)
    configured = tmp_path / "configured"
    settings = LatencyPredictorSettings(modelDir=str(configured), minSamples=50)
    host = PredictorHost(settings, MonotonicClock(), {}, trace=str(trace))
    await host.start()
    await host.stop()
    assert (configured / "bundle.json").exists()


async def test_a_short_trace_waits_for_live_traffic(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", 20)
    settings = LatencyPredictorSettings(minSamples=100)
    host = PredictorHost(settings, MonotonicClock(), {}, trace=str(trace))
    await host.start()
    try:
        assert host.local is not None
        assert not host.local.ready
        assert host.local.ttft_samples > 0  # kept for the first live training
    finally:
        await host.stop()


async def test_a_bad_trace_line_stops_the_start(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"ttft_ms": "soon"}\n')
    host = PredictorHost(LatencyPredictorSettings(), MonotonicClock(), {}, trace=str(trace))
    with pytest.raises(TraceError, match=r"trace\.jsonl:1"):
        await host.start()
    await host.stop()


async def test_remote_client_failures_are_exported(unused_tcp_port: int) -> None:
    """With prediction servers configured, the client's counters reach /metrics: a call to a
    server that is not there shows up as a call answered without predictions."""
    settings = LatencyPredictorSettings(
        predictionUrls=[f"http://127.0.0.1:{unused_tcp_port}"], timeoutMs=500
    )
    host = PredictorHost(settings, MonotonicClock(), {})
    assert host.remote is not None
    assert host.local is None
    registry = CollectorRegistry()
    host.register_metrics(registry)
    await host.start()
    try:
        assert await host.remote.predict_async(random_rows(3)) is None
    finally:
        await host.stop()
    text = generate_latest(registry).decode()
    assert "sluicegate_predictor_remote_calls_total 1.0" in text
    unanswered = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(
            (
                "sluicegate_predictor_remote_failures_total",
                "sluicegate_predictor_remote_timeouts_total",
                "sluicegate_predictor_remote_no_server_total",
            )
        )
    )
    assert unanswered == 1.0


@pytest.mark.parametrize("remote", [False, True])
def test_online_calibration_follows_the_settings_and_is_exported(
    remote: bool, unused_tcp_port: int
) -> None:
    """Quantile models (the default) get an online calibration, in process or remote, and
    its scales reach /metrics; a mean objective or ``onlineCalibration: false`` gets none."""
    urls = {"predictionUrls": [f"http://127.0.0.1:{unused_tcp_port}"]} if remote else {}

    def service(**fields: object) -> PredictorHost:
        return PredictorHost(LatencyPredictorSettings(**urls, **fields), MonotonicClock(), {})

    host = service(quantile=0.8)
    calibration = host.service.calibration
    assert calibration is not None
    assert calibration.ttft.alpha == 0.8
    calibration.tpot.update(1.0, 2.0)
    registry = CollectorRegistry()
    host.register_metrics(registry)
    text = generate_latest(registry).decode()
    assert 'sluicegate_predictor_calibration_scale{target="ttft"} 1.0' in text
    assert 'sluicegate_predictor_calibration_misses_total{target="tpot"} 1.0' in text
    assert service(objective="mean").service.calibration is None
    assert service(onlineCalibration=False).service.calibration is None
