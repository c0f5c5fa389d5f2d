"""The prediction server (``sluicegate predictor predict-server``), after the reference's.

Serves predictions from the latest models of a training server. Routes:
``POST /predict``, ``POST /predict/bulk``, ``POST /predict/bulk/strict`` (see
:mod:`sluicegate.latency.service`), ``POST /reload`` (sync now), ``GET /healthz``,
``GET /readyz`` (503 until a model is loaded), ``GET /status``, ``GET /metrics``.

**Model sync**, at start and then every ``sync_interval_s``: ask the training server for
``/model/{bundle,ttft,tpot}/info``; when a checksum differs from the local file's,
download the files (``/model/{name}/download``) into a staging directory, check each byte
count against Content-Length and that the bundle loads (the metadata's checksums must
match the boosters: no mixing files of two trainings), then rename them into the model
directory (atomic per file; the metadata last) and swap the bundle in use. Any failure
keeps the current models and is retried at the next sync. Models found in the model
directory at start are used until then (warm start).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from sluicegate.clock import MonotonicClock
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.model import META_FILE, ModelBundle
from sluicegate.latency.service import (
    PredictionRoutes,
    errors_middleware,
    healthz,
    json_response,
    metrics_handler,
    model_fields,
    readyz_handler,
    site_port,
    wait_for_signal,
)
from sluicegate.latency.trainserver import MODEL_FILES

log = logging.getLogger("sluicegate.latency")

_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class PredictServerOptions:
    training_server: str
    """Base URL of the training server, e.g. ``http://127.0.0.1:8000``."""
    sync_interval_s: float = 10.0
    sync_timeout_s: float = 10.0
    """Per HTTP request of a sync."""
    model_dir: str | None = None
    """Local copy of the models (None: a temporary directory)."""


class SyncError(Exception):
    """A sync step that failed (the current models stay)."""


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


class PredictionServer:
    """The prediction server's state and aiohttp application."""

    def __init__(self, options: PredictServerOptions) -> None:
        self.options = options
        self.base_url = options.training_server.rstrip("/")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if options.model_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sluicegate-predict-")
            model_dir = self._tmp.name
        else:
            model_dir = options.model_dir
        self.model_dir = Path(model_dir)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.predictor = InProcessPredictor(MonotonicClock(), timer=time.perf_counter)
        if self.predictor.load(self.model_dir):
            log.info("loaded latency models from %s", self.model_dir)
        self.syncs = 0
        """Syncs that brought new models."""
        self.sync_failures = 0
        self.last_sync_error: str | None = None
        self.last_load: float | None = None
        """Wall time (``time.time()``) the models in use were loaded."""
        self._session: aiohttp.ClientSession | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._sync_lock = asyncio.Lock()
        self.routes = PredictionRoutes(self.predictor)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[errors_middleware])
        self.routes.add_to(app)
        app.router.add_post("/reload", self.reload)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz_handler(self.predictor))
        app.router.add_get("/status", self.status)
        app.router.add_get("/metrics", metrics_handler(self.predictor, buckets=False))
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 8001) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.options.sync_timeout_s)
        )
        self._runner = web.AppRunner(self.build_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site_port(site)
        self._sync_task = asyncio.create_task(self._sync_loop(), name="latency-model-sync")

    async def stop(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync_task
            self._sync_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ------------------------------------------------------------------ sync

    async def _sync_loop(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.options.sync_interval_s)

    async def sync(self) -> bool:
        """Fetch newer models if there are any; True when new ones are in use."""
        async with self._sync_lock:
            try:
                updated = await self._sync_once()
            except SyncError as exc:
                self.sync_failures += 1
                self.last_sync_error = str(exc)
                log.warning("model sync from %s failed: %s", self.base_url, exc)
                return False
            self.last_sync_error = None
            return updated

    async def _get(self, path: str) -> tuple[int, bytes, int | None]:
        assert self._session is not None, "start() first"
        try:
            async with self._session.get(f"{self.base_url}{path}") as resp:
                chunks = [chunk async for chunk in resp.content.iter_chunked(_CHUNK)]
                return resp.status, b"".join(chunks), resp.content_length
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SyncError(f"GET {path}: {type(exc).__name__}: {exc}") from None

    async def _sync_once(self) -> bool:
        remote: dict[str, str | None] = {}
        for name in MODEL_FILES:
            status, body, _ = await self._get(f"/model/{name}/info")
            if status == 404:
                remote[name] = None
                continue
            if status != 200:
                raise SyncError(f"/model/{name}/info answered {status}")
            try:
                info: Any = orjson.loads(body)
                remote[name] = str(info["sha256"])
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise SyncError(f"/model/{name}/info: unexpected answer ({exc})") from None
        if remote["bundle"] is None or remote["ttft"] is None:
            return False  # nothing trained yet
        local = {name: _sha256(self.model_dir / file) for name, file in MODEL_FILES.items()}
        if local == remote and self.predictor.bundle is not None:
            return False
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.model_dir))
        try:
            for name, file in MODEL_FILES.items():
                if remote[name] is None:
                    continue
                status, body, length = await self._get(f"/model/{name}/download")
                if status != 200:
                    raise SyncError(f"/model/{name}/download answered {status}")
                if length is not None and len(body) != length:
                    raise SyncError(f"{name}: got {len(body)} bytes of {length}")
                (staging / file).write_bytes(body)
            try:
                bundle = ModelBundle.load(staging)
            except (OSError, ValueError) as exc:  # e.g. a training in between: next time
                raise SyncError(f"downloaded models do not load: {exc}") from None
            for name, file in MODEL_FILES.items():
                if name != "bundle" and (staging / file).exists():
                    os.replace(staging / file, self.model_dir / file)
                elif name != "bundle":
                    (self.model_dir / file).unlink(missing_ok=True)
            os.replace(staging / META_FILE, self.model_dir / META_FILE)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        first = self.predictor.bundle is None
        self.predictor.swap(bundle)
        self.syncs += 1
        self.last_load = time.time()
        log.info(
            "%slatency models v%d loaded from %s%s",
            "first " if first else "",
            bundle.version,
            self.base_url,
            ": predicting" if first else "",
        )
        return True

    # ------------------------------------------------------------------ routes

    async def reload(self, request: web.Request) -> web.Response:
        synced = await self.sync()
        return json_response({"synced": synced, **self._state()})

    async def status(self, request: web.Request) -> web.Response:
        return json_response(self._state())

    def _state(self) -> dict[str, Any]:
        bundle = self.predictor.bundle
        return {
            "is_ready": bundle is not None,
            **(model_fields(bundle) if bundle is not None else {}),
            "last_model_load": self.last_load,
            "training_server_url": self.base_url,
            "syncs": self.syncs,
            "sync_failures": self.sync_failures,
            "predicted_rows": self.predictor.predicted_rows,
            "booster_calls": self.routes.batcher.merged_calls,
            "last_sync_error": self.last_sync_error,
        }


async def serve_prediction(
    options: PredictServerOptions,
    host: str,
    port: int,
    on_ready: Callable[[PredictionServer], None] | None = None,
) -> None:
    """Run a prediction server until SIGINT or SIGTERM (or cancellation)."""
    server = PredictionServer(options)
    await server.start(host, port)
    log.info(
        "prediction server on http://%s:%d (models from %s)", host, server.port, server.base_url
    )
    if on_ready is not None:
        on_ready(server)
    try:
        await wait_for_signal()
    finally:
        await server.stop()
