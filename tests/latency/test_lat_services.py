"""The training and prediction servers end to end over HTTP."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import xgboost as xgb
from lat_support import PredictServerFactory, TrainServerFactory, random_rows, samples

from sluicegate.latency.predictserver import PredictionServer
from sluicegate.latency.trainserver import TrainingServer
from sluicegate.latency.wire import row_to_json, sample_to_json


def url(server: TrainingServer | PredictionServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


async def post(http: aiohttp.ClientSession, target: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(target, data=data) as resp:
        return resp.status, orjson.loads(await resp.read())


async def get(http: aiohttp.ClientSession, target: str) -> tuple[int, bytes]:
    async with http.get(target) as resp:
        return resp.status, await resp.read()


async def wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def trained(http: aiohttp.ClientSession, server: TrainingServer, n: int = 1000) -> None:
    entries = [sample_to_json(s) for s in samples(n, seed=1, sigma=0.1)]
    status, body = await post(http, url(server, "/add_training_data_bulk"), {"entries": entries})
    assert (status, body) == (202, {"accepted": n})

    async def ready() -> bool:
        return (await get(http, url(server, "/readyz")))[0] == 200

    await wait_for(ready)


async def test_training_server_collects_trains_and_serves_models(
    train_server: TrainServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await train_server()
    assert (await get(http, url(server, "/healthz")))[0] == 200
    assert (await get(http, url(server, "/readyz")))[0] == 503
    assert (await get(http, url(server, "/model/ttft/info")))[0] == 404
    status, body = await post(http, url(server, "/predict"), row_to_json(random_rows(1)[0]))
    assert status == 503
    assert body == {"error": "models are not ready"}

    await trained(http, server)
    assert server.predictor.trainings >= 1

    status, raw = await get(http, url(server, "/model/ttft/info"))
    assert status == 200
    info = orjson.loads(raw)
    status, model = await get(http, url(server, "/model/ttft/download"))
    assert status == 200
    assert len(model) == info["size_bytes"]
    assert hashlib.sha256(model).hexdigest() == info["sha256"]
    booster = xgb.Booster()
    booster.load_model(bytearray(model))
    assert booster.num_boosted_rounds() == 60
    meta = orjson.loads((await get(http, url(server, "/model/bundle/download")))[1])
    assert meta["targets"]["ttft"]["sha256"] == info["sha256"]
    assert (await get(http, url(server, "/model/nope/info")))[0] == 404

    row = random_rows(1, seed=3)[0]
    status, body = await post(http, url(server, "/predict"), row_to_json(row))
    assert status == 200
    local = server.predictor.predict([row])
    assert local is not None
    assert body["ttft_ms"] == float(local.ttft_ms[0])
    assert body["tpot_ms"] == float(local.tpot_ms[0])
    assert body["objective_type"] == "quantile"
    assert body["quantile"] == 0.9

    status, text = await get(http, url(server, "/metrics"))
    metrics = text.decode()
    assert 'sluicegate_predictor_samples{split="train",target="ttft"}' in metrics
    assert "sluicegate_predictor_bucket_samples{" in metrics
    assert 'sluicegate_predictor_model_score{score="coverage",target="ttft"}' in metrics
    assert "sluicegate_predictor_trainings_total" in metrics

    status, body = await post(http, url(server, "/flush"), {"flush_test_data": False})
    assert status == 200
    assert body["cleared"]["ttft_train"] > 800
    assert body["cleared"]["ttft_test"] == 0
    assert server.predictor.store.ttft.train_count == 0
    assert server.predictor.store.ttft.test_count > 0


async def test_training_server_rejects_bad_samples_naming_them(
    train_server: TrainServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await train_server()
    good = sample_to_json(samples(1)[0])
    target = url(server, "/add_training_data_bulk")
    cases = [
        ({"entries": [good, {**good, "ttft_ms": "fast"}]}, "entries[1].ttft_ms"),
        (
            {"entries": [{k: v for k, v in good.items() if k != "num_request_running"}]},
            "entries[0].num_request_running",
        ),
        ({"entries": []}, "entries"),
        ({"samples": [good]}, "entries"),
        ([good], "entries"),
    ]
    for body, field in cases:
        status, answer = await post(http, target, body)
        assert status == 400, body
        assert answer["field"] == field
        assert field.split(".")[-1] in answer["error"]
    status, answer = await post(http, target, b"{not json")
    assert status == 400
    assert "not JSON" in answer["error"]
    assert server.predictor.store.added == 0
    status, answer = await post(http, url(server, "/flush"), {"flush_test_data": "yes"})
    assert (status, answer["field"]) == (400, "flush_test_data")


async def test_prediction_server_syncs_and_answers_like_in_process(
    train_server: TrainServerFactory,
    predict_server: PredictServerFactory,
    http: aiohttp.ClientSession,
) -> None:
    trainer = await train_server()
    predictor = await predict_server(url(trainer, ""))
    assert (await get(http, url(predictor, "/readyz")))[0] == 503
    rows = random_rows(37, seed=5)
    body = {"requests": [row_to_json(r) for r in rows]}
    status, answer = await post(http, url(predictor, "/predict/bulk/strict"), body)
    assert status == 503

    await trained(http, trainer)

    async def synced() -> bool:
        return (await get(http, url(predictor, "/readyz")))[0] == 200

    await wait_for(synced)
    status, answer = await post(http, url(predictor, "/predict/bulk/strict"), body)
    assert status == 200
    expected = trainer.predictor.predict(rows)
    assert expected is not None
    assert [p["ttft_ms"] for p in answer["predictions"]] == expected.ttft_ms.tolist()
    assert [p["tpot_ms"] for p in answer["predictions"]] == expected.tpot_ms.tolist()
    assert answer["total_requests"] == answer["successful_predictions"] == 37
    assert answer["model_version"] == trainer.predictor.bundle.version  # type: ignore[union-attr]

    # A retraining reaches the prediction server at its next sync.
    version = answer["model_version"]
    entries = [sample_to_json(s) for s in samples(300, seed=2, sigma=0.1)]
    await post(http, url(trainer, "/add_training_data_bulk"), {"entries": entries})

    async def resynced() -> bool:
        bundle = predictor.predictor.bundle
        return bundle is not None and bundle.version > version

    await wait_for(resynced)
    status, raw = await get(http, url(predictor, "/status"))
    state = orjson.loads(raw)
    assert state["is_ready"]
    assert state["syncs"] >= 2
    status, answer = await post(http, url(predictor, "/reload"), b"")
    assert status == 200
    assert answer["is_ready"]
    assert (await get(http, url(predictor, "/metrics")))[0] == 200


async def test_prediction_server_errors_and_partial_bulk(
    train_server: TrainServerFactory,
    predict_server: PredictServerFactory,
    http: aiohttp.ClientSession,
) -> None:
    trainer = await train_server()
    await trained(http, trainer)
    predictor = await predict_server(url(trainer, ""))

    async def synced() -> bool:
        return predictor.predictor.ready

    await wait_for(synced)
    rows = [row_to_json(r) for r in random_rows(4, seed=6)]
    bad = {**rows[2], "kv_cache_percentage": 7}
    strict = url(predictor, "/predict/bulk/strict")
    status, answer = await post(http, strict, {"requests": [rows[0], rows[1], bad]})
    assert status == 400
    assert answer["field"] == "requests[2].kv_cache_percentage"
    assert "must be a fraction in [0, 1], got 7" in answer["error"]
    for body, field in [
        ({"requests": []}, "requests"),
        ({"requests": [rows[0]] * 10_001}, "requests"),
        ({"rows": rows}, "requests"),
    ]:
        status, answer = await post(http, strict, body)
        assert (status, answer["field"]) == (400, field)
    status, answer = await post(http, strict, b"[1,")
    assert status == 400
    assert "not JSON" in answer["error"]
    status, answer = await post(
        http,
        url(predictor, "/predict"),
        {k: v for k, v in rows[0].items() if k != "num_request_waiting"},
    )
    assert (status, answer["field"]) == (400, "num_request_waiting")

    status, answer = await post(
        http, url(predictor, "/predict/bulk"), {"requests": [rows[0], bad, rows[3], "x"]}
    )
    assert status == 200
    assert answer["successful_predictions"] == 2
    assert answer["failed_predictions"] == 2
    assert answer["predictions"][1] is None
    assert answer["predictions"][3] is None
    assert [e["index"] for e in answer["errors"]] == [1, 3]
    assert answer["errors"][0]["field"] == "requests[1].kv_cache_percentage"
    status, strict_answer = await post(http, strict, {"requests": [rows[0], rows[3]]})
    assert [answer["predictions"][0], answer["predictions"][2]] == strict_answer["predictions"]


async def test_prediction_server_keeps_its_models_when_the_trainer_goes(
    train_server: TrainServerFactory,
    predict_server: PredictServerFactory,
    http: aiohttp.ClientSession,
    tmp_path: Any,
) -> None:
    trainer = await train_server()
    await trained(http, trainer)
    predictor = await predict_server(url(trainer, ""), model_dir=str(tmp_path / "p"))

    async def synced() -> bool:
        return predictor.predictor.ready

    await wait_for(synced)
    await trainer.stop()
    assert not await predictor.sync()
    assert predictor.sync_failures >= 1
    assert predictor.last_sync_error
    assert predictor.predictor.ready
    # Warm start from its own copy, with the trainer gone.
    again = await predict_server(url(trainer, ""), model_dir=str(tmp_path / "p"))
    assert again.predictor.ready
    rows = random_rows(5, seed=8)
    a, b = predictor.predictor.predict(rows), again.predictor.predict(rows)
    assert a is not None
    assert b is not None
    assert np.array_equal(a.ttft_ms, b.ttft_ms)


def test_bulk_limit_matches_the_reference() -> None:
    from sluicegate.latency.service import MAX_BULK

    assert MAX_BULK == 10_000


@pytest.mark.parametrize("name", ["bundle", "ttft", "tpot"])
async def test_model_names(
    name: str, train_server: TrainServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await train_server()
    await trained(http, server, n=300)
    status, raw = await get(http, url(server, f"/model/{name}/info"))
    assert status == 200
    assert orjson.loads(raw)["model_name"] == name
