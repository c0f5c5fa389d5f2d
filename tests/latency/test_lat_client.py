"""RemotePredictor: coalescing, spreading, deadlines, failures and sample flushing."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from aiohttp import web
from lat_support import PredictServerFactory, TrainServerFactory, random_rows, samples

from sluicegate.latency.client import RemotePredictor, RemoteSettings
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.latency.predictserver import PredictionServer
from sluicegate.latency.trainserver import TrainingServer


def base(server: TrainingServer | PredictionServer) -> str:
    return f"http://127.0.0.1:{server.port}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., RemotePredictor]]:
    made: list[RemotePredictor] = []

    def make(urls: list[str], **options: object) -> RemotePredictor:
        client = RemotePredictor(RemoteSettings(tuple(urls), **options))  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def serving(
    train_server: TrainServerFactory, predict_server: PredictServerFactory
) -> tuple[TrainingServer, list[PredictionServer]]:
    trainer = await train_server()
    for s in samples(800, seed=1, sigma=0.1):
        trainer.predictor.observe(s)
    assert await trainer.predictor.retrain_async()
    servers = [await predict_server(base(trainer)) for _ in range(2)]
    for server in servers:
        await server.sync()  # (its loop may have synced already)
        assert server.predictor.ready
    return trainer, servers


async def test_predictions_equal_the_in_process_ones(
    serving: tuple[TrainingServer, list[PredictionServer]],
    clients: Callable[..., RemotePredictor],
) -> None:
    trainer, servers = serving
    client = clients([base(servers[0])], timeout_s=2.0)
    assert isinstance(client, LatencyPredictor)
    assert client.needs_io  # the producer awaits it before scheduling
    assert not client.ready
    rows = random_rows(23, seed=4)
    out = await client.predict_async(rows)
    expected = trainer.predictor.predict(rows)
    assert out is not None
    assert expected is not None
    assert np.array_equal(out.ttft_ms, expected.ttft_ms)
    assert np.array_equal(out.tpot_ms, expected.tpot_ms)
    assert client.ready
    empty = await client.predict_async([])
    assert empty is not None
    assert len(empty.ttft_ms) == 0


async def test_concurrent_calls_coalesce_into_few_http_requests(
    serving: tuple[TrainingServer, list[PredictionServer]],
    clients: Callable[..., RemotePredictor],
) -> None:
    trainer, servers = serving
    client = clients([base(servers[0])], timeout_s=2.0)
    batches = [random_rows(10, seed=i) for i in range(50)]
    results = await asyncio.gather(*(client.predict_async(rows) for rows in batches))
    assert client.http_requests == 1  # all 50 within one 1 ms window
    for rows, out in zip(batches, results, strict=True):
        expected = trainer.predictor.predict(rows)
        assert out is not None
        assert expected is not None
        assert np.array_equal(out.ttft_ms, expected.ttft_ms)  # each gets its own rows back
    # Bounded batches: 100 rows per request at most, calls never split.
    small = clients([base(servers[0])], timeout_s=2.0, max_bulk_rows=100)
    results = await asyncio.gather(*(small.predict_async(rows) for rows in batches))
    assert all(r is not None for r in results)
    assert small.http_requests == 5
    # Calls far apart are not held together.
    apart = clients([base(servers[0])], timeout_s=2.0)
    for rows in batches[:3]:
        assert await apart.predict_async(rows) is not None
    assert apart.http_requests == 3


async def test_requests_spread_over_prediction_servers(
    serving: tuple[TrainingServer, list[PredictionServer]],
    clients: Callable[..., RemotePredictor],
) -> None:
    _, servers = serving
    client = clients([base(s) for s in servers], timeout_s=2.0)
    for i in range(30):
        assert await client.predict_async(random_rows(2, seed=i)) is not None
    calls = [s.predictor.prediction_calls for s in servers]
    assert sum(calls) == 30
    assert min(calls) >= 5, calls


async def test_server_down_answers_none_quickly_then_backs_off(
    clients: Callable[..., RemotePredictor],
) -> None:
    client = clients([f"http://127.0.0.1:{closed_port()}"])
    started = time.perf_counter()
    assert await client.predict_async(random_rows(3)) is None
    assert time.perf_counter() - started < 0.2
    assert client.failures == 1
    assert client.timeouts == 0  # refused at once, not waited out
    started = time.perf_counter()
    assert await client.predict_async(random_rows(3)) is None
    assert time.perf_counter() - started < 0.05
    assert client.no_server == 1  # skipped while backing off
    assert not client.ready


async def test_a_down_server_is_skipped_for_a_live_one(
    serving: tuple[TrainingServer, list[PredictionServer]],
    clients: Callable[..., RemotePredictor],
) -> None:
    _, servers = serving
    client = clients([f"http://127.0.0.1:{closed_port()}", base(servers[0])], timeout_s=2.0)
    results = [await client.predict_async(random_rows(2, seed=i)) for i in range(20)]
    failed = sum(r is None for r in results)
    assert failed == 1  # the dead one, once; then backed off for 0.5 s
    assert results[-1] is not None


async def test_slow_server_times_out_at_the_deadline(
    clients: Callable[..., RemotePredictor],
) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2.0)
        return web.json_response({"predictions": []})

    app = web.Application()
    app.router.add_post("/predict/bulk/strict", slow)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        client = clients([f"http://127.0.0.1:{port}"], timeout_s=0.1)
        started = time.perf_counter()
        results = await asyncio.gather(*(client.predict_async(random_rows(2)) for _ in range(5)))
        elapsed = time.perf_counter() - started
        assert results == [None] * 5
        assert 0.09 <= elapsed < 0.6
        assert client.timeouts + client.failures == 5
    finally:
        await runner.cleanup()


async def test_garbage_answers_are_failures(clients: Callable[..., RemotePredictor]) -> None:
    async def garbage(request: web.Request) -> web.Response:
        return web.json_response({"predictions": [{"ttft_ms": 1.0, "tpot_ms": 1.0}]})

    app = web.Application()
    app.router.add_post("/predict/bulk/strict", garbage)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        client = clients([f"http://127.0.0.1:{runner.addresses[0][1]}"], timeout_s=1.0)
        assert await client.predict_async(random_rows(3)) is None  # 1 prediction for 3 rows
        assert client.failures == 1
    finally:
        await runner.cleanup()


async def test_samples_are_buffered_and_flushed_to_the_training_server(
    train_server: TrainServerFactory, clients: Callable[..., RemotePredictor]
) -> None:
    trainer = await train_server(min_samples=10_000)
    client = clients(
        ["http://127.0.0.1:1"],
        training_url=base(trainer),
        flush_interval_s=0.05,
        max_flush_samples=64,
    )
    await client.start()
    for s in samples(300, seed=2):
        client.observe(s)
    assert client.buffered_samples == 300
    for _ in range(100):
        if trainer.predictor.store.ttft.added == 300:
            break
        await asyncio.sleep(0.02)
    assert trainer.predictor.store.ttft.added == 300
    assert client.samples_sent == 300
    assert client.buffered_samples == 0


async def test_sample_buffer_is_bounded_and_failures_are_counted(
    clients: Callable[..., RemotePredictor],
) -> None:
    client = clients(
        ["http://127.0.0.1:1"],
        training_url=f"http://127.0.0.1:{closed_port()}",
        max_buffered_samples=10,
    )
    for s in samples(25, seed=3):
        client.observe(s)
    assert client.buffered_samples == 10
    assert client.samples_dropped == 15
    assert await client.flush() == 0
    assert client.flush_failures == 1
    assert client.samples_dropped == 25
    # Without a training server, samples go nowhere (and cost nothing).
    quiet = clients(["http://127.0.0.1:1"])
    quiet.observe(samples(1)[0])
    assert quiet.buffered_samples == 0


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="prediction server"):
        RemoteSettings(())
    with pytest.raises(ValueError, match="timeout_s"):
        RemoteSettings(("http://x",), timeout_s=0)
