"""The gateway's own latency predictor: trained in process on live traffic, used by the
``predicted-latency`` preset once ready, exported on ``/metrics``, saved and reloaded; the
prediction metrics of a request, and the ``x-prediction-based-scheduling`` opt-out."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from gw_support import GatewayFactory
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.api.settings import LatencyPredictorSettings
from sluicegate.clock import MonotonicClock
from sluicegate.framework import PREDICTOR_SERVICE
from sluicegate.gateway.proxy import upstream_headers
from sluicegate.latency.features import Sample
from sluicegate.latency.host import PredictorHost, remote_urls
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.latency.predictserver import PredictionServer, PredictServerOptions
from sluicegate.latency.trainserver import TrainingServer, TrainServerOptions
from sluicegate.requestcontrol.parse import CONTROL_HEADERS
from sluicegate.runtime import RuntimeOptions

MODEL = "tiny-llama"


async def stream_completion(
    http: aiohttp.ClientSession, url: str, i: int, headers: Mapping[str, str] | None = None
) -> None:
    body = {
        "model": MODEL,
        "prompt": f"request {i}: " + "words " * (20 + 7 * (i % 9)),
        "max_tokens": 6 + i % 5,
        "ignore_eos": True,
        "stream": True,
    }
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as response:
        assert response.status == 200
        await response.read()


async def test_models_train_on_live_traffic_and_are_used(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=2)
    settings = {
        "latencyPredictor": {
            "minSamples": 20,
            "retrainIntervalMs": 200,
            "modelDir": str(tmp_path / "models"),
        }
    }
    gw = await gateway(cluster, preset="predicted-latency", settings=settings)
    url = f"http://127.0.0.1:{gw.port}"
    local = gw.runtime.predictor.local
    assert local is not None
    assert not local.ready
    for batch in range(6):
        await asyncio.gather(*(stream_completion(http, url, 10 * batch + i) for i in range(10)))
    for _ in range(100):
        if local.ready:
            break
        await asyncio.sleep(0.1)
    assert local.ready, "no model was trained from 60 streamed requests"
    assert local.ttft_samples >= 20
    fallbacks = value(await scrape(http, url), "sluicegate_predictor_fallbacks_total")
    calls = local.prediction_calls
    await stream_completion(http, url, 999)
    text = await scrape(http, url)
    # Scheduled on predictions: the models were asked, and it was no fallback.
    assert local.prediction_calls > calls
    assert value(text, "sluicegate_predictor_fallbacks_total") == fallbacks
    assert "sluicegate_predictor_ready 1.0" in text
    assert "sluicegate_predictor_trainings_total" in text
    assert (tmp_path / "models" / "bundle.json").exists()


async def test_saved_models_are_loaded_at_start(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=1)
    models = tmp_path / "models"
    settings = {"latencyPredictor": {"minSamples": 10, "retrainIntervalMs": 100}}
    first = await gateway(
        cluster,
        preset="predicted-latency",
        settings={"latencyPredictor": {**settings["latencyPredictor"], "modelDir": str(models)}},
    )
    url = f"http://127.0.0.1:{first.port}"
    await asyncio.gather(*(stream_completion(http, url, i) for i in range(30)))
    for _ in range(100):
        if (models / "bundle.json").exists():
            break
        await asyncio.sleep(0.1)
    assert (models / "bundle.json").exists()
    second = await gateway(
        cluster,
        preset="predicted-latency",
        settings={"latencyPredictor": {"modelDir": str(models)}},
    )
    assert second.runtime.predictor.local.ready  # warm from the first one's models


def test_remote_servers_come_from_settings_or_the_environment() -> None:
    settings = LatencyPredictorSettings()
    assert remote_urls(settings, {}) == ((), None)
    env = {
        "PREDICTION_SERVER_URL": "http://localhost:8001, http://localhost:8002",
        "TRAINING_SERVER_URL": "http://localhost:8000",
    }
    assert remote_urls(settings, env) == (
        ("http://localhost:8001", "http://localhost:8002"),
        "http://localhost:8000",
    )
    configured = LatencyPredictorSettings(predictionUrls=["http://p:1"], trainingUrl=None)
    assert remote_urls(configured, env) == (("http://p:1",), "http://localhost:8000")
    host = PredictorHost(settings, MonotonicClock(), env)
    assert host.remote is not None
    assert host.local is None
    assert host.remote.settings.timeout_s == pytest.approx(0.1)
    assert PredictorHost(settings, MonotonicClock(), {}).local is not None


# --------------------------------------------------------------------------- prediction metrics

PREDICTED_TTFT_MS = 50.0
PREDICTED_TPOT_MS = 5.0
LABELS = {"model_name": MODEL, "target_model_name": MODEL}
OPT_OUT = {"x-prediction-based-scheduling": "false"}


class StubPredictor(SynchronousPredictor):
    """A ready in-process predictor with fixed answers (TTFT 50 ms, TPOT 5 ms)."""

    ready = True
    calibration = None

    def __init__(self) -> None:
        self.calls = 0

    def predict_query(self, query: PredictionQuery) -> Predictions:
        self.calls += 1
        n = len(query.rows)
        return Predictions(
            np.full(n, PREDICTED_TTFT_MS, np.float32), np.full(n, PREDICTED_TPOT_MS, np.float32)
        )

    def observe(self, sample: Sample) -> None:
        pass


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as response:
        return await response.text()


def value(text: str, sample: str, **labels: str) -> float:
    """The sum of the ``sample`` series whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def test_prediction_metrics_of_a_request_scheduled_on_predictions(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    stub = StubPredictor()
    gw = await gateway(
        cluster,
        preset="predicted-latency",
        runtime=RuntimeOptions(services={PREDICTOR_SERVICE: stub}),
    )
    url = f"http://127.0.0.1:{gw.port}"
    # SLOs no answer can meet: both kinds of violation are counted.
    await stream_completion(http, url, 1, {"x-slo-ttft-ms": "0.001", "x-slo-tpot-ms": "0.001"})
    await stream_completion(http, url, 2, {"x-slo-ttft-ms": "600000"})  # met
    text = await scrape(http, url)
    p = "inference_objective_request_"
    assert value(text, p + "predicted_ttft_seconds_count", **LABELS) == 2
    assert value(text, p + "predicted_ttft_seconds_sum", **LABELS) == pytest.approx(0.1)
    assert value(text, p + "predicted_tpot_seconds_count", **LABELS) == 2
    assert value(text, p + "predicted_tpot_seconds_sum", **LABELS) == pytest.approx(0.01)
    assert value(text, p + "ttft_prediction_duration_seconds_count", **LABELS) == 2
    assert value(text, p + "tpot_prediction_duration_seconds_count", **LABELS) == 2
    assert value(text, p + "slo_violation_total", type="ttft", **LABELS) == 1
    assert value(text, p + "slo_violation_total", type="tpot", **LABELS) == 1
    assert value(text, "sluicegate_predictor_fallbacks_total") == 0

    # Opted out: no prediction is made, and it is no fallback either.
    calls = stub.calls
    await stream_completion(http, url, 3, OPT_OUT)
    text = await scrape(http, url)
    assert stub.calls == calls
    assert value(text, p + "predicted_ttft_seconds_count", **LABELS) == 2
    assert value(text, "sluicegate_predictor_fallbacks_total") == 0
    # GIE v1.3's opt-out header, whatever its value, does the same.
    await stream_completion(http, url, 4, {"x-prediction-based-scheduling-off": "true"})
    assert stub.calls == calls
    assert value(await scrape(http, url), "sluicegate_predictor_fallbacks_total") == 0

    async with http.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
        headers={"x-prediction-based-scheduling": "sometimes"},
    ) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["param"] == "x-prediction-based-scheduling"


async def test_the_configured_default_applies_without_the_header_and_reloads(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1)
    stub = StubPredictor()
    gw = await gateway(
        cluster,
        preset="predicted-latency",
        settings={"latencyPredictor": {"predictionBasedSchedulingDefault": False}},
        runtime=RuntimeOptions(services={PREDICTOR_SERVICE: stub}),
    )
    url = f"http://127.0.0.1:{gw.port}"
    await stream_completion(http, url, 1)
    assert stub.calls == 0
    await stream_completion(http, url, 2, {"x-prediction-based-scheduling": "TRUE"})
    assert stub.calls == 1
    settings = gw.config.gateway
    predictor = settings.latency_predictor.model_copy(
        update={"prediction_based_scheduling_default": True}
    )
    gw.apply_config(
        dataclasses.replace(
            gw.config, gateway=settings.model_copy(update={"latency_predictor": predictor})
        )
    )
    await stream_completion(http, url, 3)
    assert stub.calls == 2


async def test_a_cold_predictor_counts_warming_up_fallbacks(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    gw = await gateway(cluster, preset="predicted-latency")  # in-process, no model yet
    url = f"http://127.0.0.1:{gw.port}"
    await stream_completion(http, url, 1)
    await stream_completion(http, url, 2, OPT_OUT)
    text = await scrape(http, url)
    assert value(text, "sluicegate_predictor_fallbacks_total", reason="warming-up") == 1
    assert value(text, "inference_objective_request_predicted_ttft_seconds_count") == 0


def test_the_opt_in_header_is_not_forwarded_upstream() -> None:
    client = {
        "X-Prediction-Based-Scheduling": "false",
        "X-Prediction-Based-Scheduling-Off": "",
        "x-slo-ttft-ms": "100",
    }
    forwarded = upstream_headers(client, CONTROL_HEADERS, "req-1", strip_authorization=False)
    assert {k.lower() for k in forwarded} == {"x-slo-ttft-ms", "x-request-id", "accept-encoding"}


async def test_remote_servers_without_a_model_are_warming_up_then_unavailable_when_gone(
    sim_cluster: Any,
    gateway: GatewayFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    trainer = TrainingServer(TrainServerOptions())  # nothing to train on: no model
    await trainer.start("127.0.0.1", 0)
    predictor = PredictionServer(PredictServerOptions(f"http://127.0.0.1:{trainer.port}"))
    await predictor.start("127.0.0.1", 0)
    try:
        cluster = await sim_cluster(replicas=2)
        remote = {"predictionUrls": [f"http://127.0.0.1:{predictor.port}"], "timeoutMs": 1000}
        gw = await gateway(
            cluster, preset="predicted-latency", settings={"latencyPredictor": remote}
        )
        url = f"http://127.0.0.1:{gw.port}"
        await stream_completion(http, url, 1)  # the server answers 503: no model yet
        text = await scrape(http, url)
        assert value(text, "sluicegate_predictor_fallbacks_total", reason="warming-up") == 1
        assert value(text, "sluicegate_predictor_fallbacks_total", reason="unavailable") == 0
    finally:
        await predictor.stop()
        await trainer.stop()
    # Gone: once its back-off (0.5 s) is over the next call finds nobody there.
    caplog.set_level("INFO", logger="sluicegate.latency")
    for i in range(40):
        await asyncio.sleep(0.1)
        await stream_completion(http, url, 2 + i)
        text = await scrape(http, url)
        if value(text, "sluicegate_predictor_fallbacks_total", reason="unavailable"):
            break
    assert value(text, "sluicegate_predictor_fallbacks_total", reason="unavailable") >= 1
    warnings = [r for r in caplog.records if "no prediction server reachable" in r.message]
    assert len(warnings) == 1  # rate-limited: once per 30 s while it lasts
    assert warnings[0].levelname == "WARNING"
