"""The training server (``sluicegate predictor train-server``), after the reference's.

Receives samples from gateways, keeps the stratified window, retrains every interval in a
worker thread once there are enough samples, saves each bundle to its model directory and
serves the files to prediction servers. Routes:

- ``POST /add_training_data_bulk`` — ``{"entries": [sample, ...]}`` (samples as
  :mod:`sluicegate.latency.wire`; 1–10,000) → 202 ``{"accepted": n}``; one bad entry fails
  the body (400 naming it, e.g. ``entries[2].ttft_ms``).
- ``POST /predict`` — one row (see :mod:`sluicegate.latency.service`).
- ``POST /flush`` — ``{"flush_training_data": true, "flush_test_data": true}`` (both
  default true) forgets samples → ``{"cleared": {...}}``.
- ``GET /healthz``; ``GET /readyz`` (503 until a model exists); ``GET /metrics``.
- ``GET /model/{name}/info`` — ``name`` ∈ ``bundle``, ``ttft``, ``tpot`` →
  ``{"model_name", "size_bytes", "last_modified", "sha256", "model_version"}``; 404 before
  the first training (or for ``tpot`` without TPOT samples).
- ``GET /model/{name}/download`` — the file (``bundle.json`` or XGBoost JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from sluicegate.clock import MonotonicClock
from sluicegate.latency.features import Sample
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.model import META_FILE, TrainConfig
from sluicegate.latency.service import (
    BadRequestError,
    PredictionRoutes,
    bulk_items,
    errors_middleware,
    healthz,
    json_response,
    metrics_handler,
    read_json,
    readyz_handler,
    site_port,
    wait_for_signal,
)
from sluicegate.latency.wire import FieldError, sample_from_json

log = logging.getLogger("sluicegate.latency")

MODEL_FILES: dict[str, str] = {"bundle": META_FILE, "ttft": "ttft.json", "tpot": "tpot.json"}
"""Model names served under ``/model/{name}/…`` and their files in the model directory."""


@dataclass(frozen=True, slots=True)
class TrainServerOptions:
    retrain_interval_s: float = 10.0
    min_samples: int = 100
    train: TrainConfig = field(default_factory=TrainConfig)
    model_dir: str | None = None
    """Where bundles are saved and loaded from at start (None: a temporary directory)."""


def file_info(path: Path) -> dict[str, Any]:
    """Size, modification time (ISO 8601, UTC) and SHA-256 of a model file."""
    data = path.read_bytes()
    stat = path.stat()
    return {
        "size_bytes": len(data),
        "last_modified": datetime.fromtimestamp(stat.st_mtime, tz=UTC).isoformat(),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


class TrainingServer:
    """The training server's state and aiohttp application."""

    def __init__(self, options: TrainServerOptions | None = None) -> None:
        self.options = options or TrainServerOptions()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.options.model_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sluicegate-models-")
            model_dir = self._tmp.name
        else:
            model_dir = self.options.model_dir
        self.model_dir = Path(model_dir)
        self.predictor = InProcessPredictor(
            MonotonicClock(),
            PredictorSettings(
                retrain_interval_s=self.options.retrain_interval_s,
                min_samples=self.options.min_samples,
                train=self.options.train,
                model_dir=str(self.model_dir),
            ),
            timer=time.perf_counter,
        )
        self.predictor.log_trainings = True
        if self.predictor.load(self.model_dir):
            log.info("loaded latency models from %s", self.model_dir)
        self._trainer: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[errors_middleware])
        app.router.add_post("/add_training_data_bulk", self.add_bulk)
        PredictionRoutes(self.predictor).add_to(app, bulk=False)
        app.router.add_post("/flush", self.flush)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz_handler(self.predictor))
        app.router.add_get("/metrics", metrics_handler(self.predictor))
        app.router.add_get("/model/{name}/info", self.model_info)
        app.router.add_get("/model/{name}/download", self.model_download)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        self._runner = web.AppRunner(self.build_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site_port(site)
        self._trainer = asyncio.create_task(self.predictor.run_trainer(), name="latency-trainer")

    async def stop(self) -> None:
        if self._trainer is not None:
            self._trainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._trainer
            self._trainer = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ------------------------------------------------------------------ routes

    async def add_bulk(self, request: web.Request) -> web.Response:
        entries = bulk_items(await read_json(request), "entries")
        samples: list[Sample] = []
        for i, entry in enumerate(entries):
            try:
                samples.append(sample_from_json(entry))
            except FieldError as exc:
                raise BadRequestError.from_field(exc.at(f"entries[{i}]")) from None
        for sample in samples:
            self.predictor.observe(sample)
        return json_response({"accepted": len(samples)}, status=202)

    async def flush(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body: Any = await read_json(request) if raw.strip() else {}
        if not isinstance(body, dict):
            raise BadRequestError("body must be an object")
        flags = {}
        for key in ("flush_training_data", "flush_test_data"):
            value = body.get(key, True)
            if not isinstance(value, bool):
                raise BadRequestError(f"{key}: must be true or false", key)
            flags[key] = value
        store = self.predictor.store
        cleared = {
            "ttft_train": store.ttft.train_count if flags["flush_training_data"] else 0,
            "tpot_train": store.tpot.train_count if flags["flush_training_data"] else 0,
            "ttft_test": store.ttft.test_count if flags["flush_test_data"] else 0,
            "tpot_test": store.tpot.test_count if flags["flush_test_data"] else 0,
        }
        store.clear(flags["flush_training_data"], flags["flush_test_data"])
        return json_response({"cleared": cleared})

    def _model_path(self, request: web.Request) -> tuple[str, Path]:
        name = request.match_info["name"]
        if name not in MODEL_FILES:
            raise web.HTTPNotFound(reason=f"unknown model {name!r} (bundle, ttft, tpot)")
        path = self.model_dir / MODEL_FILES[name]
        if not path.is_file():
            raise web.HTTPNotFound(reason=f"model {name!r} is not trained yet")
        return name, path

    async def model_info(self, request: web.Request) -> web.Response:
        name, path = self._model_path(request)
        try:
            info = file_info(path)
        except FileNotFoundError:  # replaced or removed meanwhile
            raise web.HTTPNotFound(reason=f"model {name!r} is not trained yet") from None
        bundle = self.predictor.bundle
        return json_response(
            {
                "model_name": name,
                **info,
                "model_version": bundle.version if bundle is not None else 0,
            }
        )

    async def model_download(self, request: web.Request) -> web.StreamResponse:
        name, path = self._model_path(request)
        try:
            data = path.read_bytes()  # one read: a consistent file even if replaced now
        except FileNotFoundError:
            raise web.HTTPNotFound(reason=f"model {name!r} is not trained yet") from None
        return web.Response(
            body=data,
            content_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{path.name}"'},
        )


async def serve_training(
    options: TrainServerOptions,
    host: str,
    port: int,
    on_ready: Callable[[TrainingServer], None] | None = None,
) -> None:
    """Run a training server until SIGINT or SIGTERM (or cancellation)."""
    server = TrainingServer(options)
    await server.start(host, port)
    log.info("training server on http://%s:%d (models in %s)", host, server.port, server.model_dir)
    if on_ready is not None:
        on_ready(server)
    try:
        await wait_for_signal()
    finally:
        await server.stop()
