"""Fixtures for the latency predictor tests: running training and prediction servers.

- ``train_server(**options)`` starts a :class:`TrainingServer` on a free port of 127.0.0.1
  (small models, short intervals unless told otherwise);
- ``predict_server(training_url, **options)`` starts a :class:`PredictionServer`;
- ``http``: an ``aiohttp.ClientSession``.

Everything started is stopped at teardown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from lat_support import FAST, TrainServerFactory

from sluicegate.latency.predictserver import PredictionServer, PredictServerOptions
from sluicegate.latency.trainserver import TrainingServer, TrainServerOptions


@pytest.fixture
async def train_server() -> AsyncIterator[TrainServerFactory]:
    started: list[TrainingServer] = []

    async def make(**options: Any) -> TrainingServer:
        base = TrainServerOptions(retrain_interval_s=0.1, min_samples=50, train=FAST)
        server = TrainingServer(replace(base, **options))
        await server.start("127.0.0.1", 0)
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        await server.stop()


@pytest.fixture
async def predict_server() -> AsyncIterator[Callable[..., Awaitable[PredictionServer]]]:
    started: list[PredictionServer] = []

    async def make(training_url: str, **options: Any) -> PredictionServer:
        server = PredictionServer(
            PredictServerOptions(
                training_server=training_url, **{"sync_interval_s": 0.1, **options}
            )
        )
        await server.start("127.0.0.1", 0)
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        await server.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
