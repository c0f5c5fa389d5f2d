"""What the latency predictor's parts say in the log: prediction servers all unreachable
(rate-limited) and back, a server without a model (warming up, not unreachable), models
trained (the training server: every time; in process: the first), the first model a
prediction server loads."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from lat_support import FAST, PredictServerFactory, TrainServerFactory, random_rows, samples

from sluicegate.clock import ManualClock
from sluicegate.latency.client import UNREACHABLE_LOG_EVERY_S, RemotePredictor, RemoteSettings
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.service import site_port

LOGGER = "sluicegate.latency"


class Toggle:
    """A prediction server on a fixed port that can be stopped and started again, and
    told to answer 503 (no model yet)."""

    def __init__(self) -> None:
        self.port = 0
        self.ready = True
        self._runner: web.AppRunner | None = None

    async def predict(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503, text="models are not ready")
        rows = orjson.loads(await request.read())["requests"]
        predictions = [{"ttft_ms": 10.0, "tpot_ms": 1.0} for _ in rows]
        return web.Response(body=orjson.dumps({"predictions": predictions}))

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/predict/bulk/strict", self.predict)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site_port(site)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@pytest.fixture
async def toggle() -> AsyncIterator[Toggle]:
    server = Toggle()
    await server.start()
    yield server
    await server.stop()


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and text in r.getMessage()]


async def test_unreachable_servers_are_logged_rate_limited_and_their_return(
    toggle: Toggle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = ManualClock(100.0)
    client = RemotePredictor(
        RemoteSettings((f"http://127.0.0.1:{toggle.port}",), timeout_s=2.0, max_retry_after_s=1),
        clock=clock,
    )
    rows = random_rows(2)
    try:
        assert await client.predict_async(rows) is not None
        await toggle.stop()
        for _ in range(3):  # down, then skipped while backing off: one warning
            assert await client.predict_async(rows) is None
            clock.advance(2.0)
        assert not client.warming_up  # nobody answered: unavailable, not warming up
        (first,) = messages(caplog, "no prediction server reachable")
        assert first.levelno == logging.WARNING
        assert "1 configured" in first.getMessage()
        assert "ClientConnectorError" in first.getMessage()

        clock.advance(UNREACHABLE_LOG_EVERY_S)
        assert await client.predict_async(rows) is None
        assert len(messages(caplog, "no prediction server reachable")) == 2  # still down

        await toggle.start()  # same port
        clock.advance(2.0)
        assert await client.predict_async(rows) is not None
        (back,) = messages(caplog, "reachable again")
        assert back.levelno == logging.INFO
        assert f"127.0.0.1:{toggle.port}" in back.getMessage()
    finally:
        await client.close()


async def test_a_server_without_a_model_is_warming_up_not_unreachable(
    toggle: Toggle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    toggle.ready = False
    client = RemotePredictor(RemoteSettings((f"http://127.0.0.1:{toggle.port}",)))
    try:
        assert await client.predict_async(random_rows(1)) is None
        assert client.warming_up
        assert not messages(caplog, "no prediction server reachable")
        toggle.ready = True
        client._down_until.clear()  # skip the back-off
        assert await client.predict_async(random_rows(1)) is not None
        assert not client.warming_up
    finally:
        await client.close()


async def test_the_training_server_logs_every_training(
    train_server: TrainServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    trainer = await train_server()
    for s in samples(300, seed=2):
        trainer.predictor.observe(s)
    assert await trainer.predictor.retrain_async()
    for s in samples(100, seed=3):
        trainer.predictor.observe(s)
    assert await trainer.predictor.retrain_async()
    first, second = messages(caplog, "trained on")
    assert first.levelno == second.levelno == logging.INFO
    assert first.getMessage().startswith("first latency models v1 trained on")
    assert second.getMessage().startswith("latency models v2 trained on")
    assert "TTFT MAPE" in second.getMessage()
    assert "n/a" not in second.getMessage().split("TPOT")[0]  # the TTFT score is known


async def test_in_process_only_the_first_model_is_logged_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    predictor = InProcessPredictor(ManualClock(), PredictorSettings(min_samples=50, train=FAST))
    for seed in (4, 5):
        for s in samples(200, seed=seed):
            predictor.observe(s)
        assert await predictor.retrain_async()
    first, second = messages(caplog, "trained on")
    assert (first.levelno, second.levelno) == (logging.INFO, logging.DEBUG)


async def test_a_prediction_server_logs_its_first_model(
    train_server: TrainServerFactory,
    predict_server: PredictServerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    trainer = await train_server()
    for s in samples(300, seed=6):
        trainer.predictor.observe(s)
    assert await trainer.predictor.retrain_async()
    server = await predict_server(f"http://127.0.0.1:{trainer.port}")
    await server.sync()
    assert server.predictor.ready
    loaded = messages(caplog, "loaded from")
    assert loaded
    assert loaded[0].getMessage().startswith("first latency models v1 loaded from")
    assert loaded[0].getMessage().endswith(": predicting")
