"""The gateway's own latency predictor: trained in process on live traffic, used by the
``predicted-latency`` preset once ready, exported on ``/metrics``, saved and reloaded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gw_support import GatewayFactory

from sluicegate.api.resources import LatencyPredictorSettings
from sluicegate.clock import MonotonicClock
from sluicegate.latency.host import PredictorHost, remote_urls
from sluicegate.scheduling.plugins.predicted_latency import PredictedLatencyProducer

MODEL = "tiny-llama"


async def stream_completion(http: aiohttp.ClientSession, url: str, i: int) -> None:
    body = {
        "model": MODEL,
        "prompt": f"request {i}: " + "words " * (20 + 7 * (i % 9)),
        "max_tokens": 6 + i % 5,
        "ignore_eos": True,
        "stream": True,
    }
    async with http.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200
        await response.read()


def producer(gw: Any) -> PredictedLatencyProducer:
    (plugin,) = [
        p for p in gw.runtime.built.plugins.values() if isinstance(p, PredictedLatencyProducer)
    ]
    return plugin


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
    fallbacks = producer(gw).fallbacks
    await stream_completion(http, url, 999)
    assert producer(gw).fallbacks == fallbacks  # scheduled on predictions
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
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
