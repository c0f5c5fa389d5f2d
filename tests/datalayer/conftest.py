"""Fixtures for the datalayer tests.

- ``vllm_scrape``: the text of a real vLLM 0.32 ``/metrics`` scrape (tests/sim/data).
- ``fake_server``: ``await fake_server()`` starts a :class:`FakeModelServer`, a small aiohttp
  server on 127.0.0.1 whose ``/metrics`` and ``/v1/models`` answers a test sets and changes
  at will (``server.set_metrics(body, status=200, delay=0.0)``, ``server.set_models(...)``,
  ``server.hits``), and stops it at teardown.
- ``upstream``: an :class:`~sluicegate.upstream.UpstreamPool` closed at teardown.
- ``gauges(waiting, running, kv)``: a minimal vLLM scrape with the three load gauges.
- ``models_payload(base, *adapters)``: a vLLM ``/v1/models`` body (adapters have ``parent``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from sluicegate.upstream import UpstreamPool

VLLM_FIXTURE = Path(__file__).parent.parent / "sim" / "data" / "vllm-0.32-metrics.txt"


@dataclass
class Reply:
    """What a fake route answers: a status and body, after an optional delay (s)."""

    body: bytes | str = b""
    status: int = 200
    delay: float = 0.0
    content_type: str = "text/plain"


def _gauges(waiting: float = 0, running: float = 0, kv: float = 0.0) -> str:
    """A minimal vLLM scrape with the three load gauges."""
    return (
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
    )


def _models_payload(base: str = "base", *adapters: str) -> bytes:
    data = [{"id": base, "object": "model", "root": base, "parent": None}]
    data += [
        {"id": a, "object": "model", "root": f"/adapters/{a}", "parent": base} for a in adapters
    ]
    return orjson.dumps({"object": "list", "data": data})


class FakeModelServer:
    """A model server stand-in with scripted ``/metrics`` and ``/v1/models`` replies."""

    def __init__(self) -> None:
        self.metrics = Reply(_gauges())
        self.models = Reply(_models_payload(), content_type="application/json")
        self.hits = {"/metrics": 0, "/v1/models": 0}
        self.port = 0
        self._runner: web.AppRunner | None = None

    def set_metrics(self, body: bytes | str, status: int = 200, delay: float = 0.0) -> None:
        self.metrics = Reply(body, status, delay)

    def set_models(self, body: bytes | str, status: int = 200, delay: float = 0.0) -> None:
        self.models = Reply(body, status, delay, "application/json")

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    async def _answer(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        reply = self.metrics if request.path == "/metrics" else self.models
        if reply.delay:
            await asyncio.sleep(reply.delay)
        body = reply.body.encode() if isinstance(reply.body, str) else reply.body
        return web.Response(body=body, status=reply.status, content_type=reply.content_type)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._answer)
        app.router.add_get("/v1/models", self._answer)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None)
        assert sockets
        self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


FakeServerFactory = Callable[[], Awaitable[FakeModelServer]]


@pytest.fixture
def vllm_scrape() -> str:
    return VLLM_FIXTURE.read_text()


@pytest.fixture
def gauges() -> Callable[..., str]:
    return _gauges


@pytest.fixture
def models_payload() -> Callable[..., bytes]:
    return _models_payload


@pytest.fixture
async def fake_server() -> AsyncIterator[FakeServerFactory]:
    servers: list[FakeModelServer] = []

    async def make() -> FakeModelServer:
        server = FakeModelServer()
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop()


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamPool]:
    pool = UpstreamPool()
    yield pool
    await pool.close()
