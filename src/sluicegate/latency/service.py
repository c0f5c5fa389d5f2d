"""What the training and prediction servers share: prediction routes, errors, metrics.

Bodies are JSON (orjson). Rows carry the :class:`~sluicegate.latency.features.FeatureRow`
fields by name (:mod:`sluicegate.latency.wire`). Errors are ``{"error": message, "field":
name}`` with status 400 naming the offending field (``requests[3].kv_cache_percentage``),
503 while no model exists.

Prediction routes (both servers serve ``POST /predict``; the prediction server all three):

- ``POST /predict`` — one row → ``{"ttft_ms", "tpot_ms", "model_type", "objective_type",
  "quantile", "model_version"}``.
- ``POST /predict/bulk/strict`` — ``{"requests": [row, ...]}`` (1–10,000 rows) →
  ``{"predictions": [{"ttft_ms", "tpot_ms"}, ...], "total_requests", ...}``; any bad row
  fails the whole request (400). The fast path the gateway's client uses.
- ``POST /predict/bulk`` — the same, but bad rows get ``null`` predictions and an entry in
  ``"errors": [{"index", "field", "error"}]`` while the others are predicted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from sluicegate.latency.batching import TurnBatcher
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.metrics import PredictorCollector
from sluicegate.latency.model import ModelBundle
from sluicegate.latency.wire import FieldError, matrix_from_json, row_values

log = logging.getLogger("sluicegate.latency")

MAX_BULK = 10_000
"""Most rows one bulk prediction may carry (as the reference)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def site_port(site: web.TCPSite) -> int:
    """The port a started site listens on (the chosen one when asked for port 0)."""
    server = site._server
    sockets = getattr(server, "sockets", None)
    if not sockets:
        raise RuntimeError("site is not listening")
    port: int = sockets[0].getsockname()[1]
    return port


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def error_response(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return json_response(body, status)


class BadRequestError(Exception):
    """A client error to answer 400 with (raised by the parsing helpers)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    @classmethod
    def from_field(cls, exc: FieldError) -> BadRequestError:
        return cls(str(exc), exc.field)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """400 for :class:`BadRequestError`, JSON for HTTP errors, 500 (logged) for the rest."""
    try:
        return await handler(request)
    except BadRequestError as exc:
        return error_response(400, exc.message, exc.field)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except Exception:
        log.exception("unexpected error handling %s %s", request.method, request.path)
        return error_response(500, "internal error")


async def read_json(request: web.Request) -> Any:
    """The request's JSON body (400 when it is not JSON)."""
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"body is not JSON: {exc}") from None


def bulk_items(body: Any, key: str = "requests") -> list[Any]:
    """``body[key]``: a list of 1–MAX_BULK items (400 otherwise)."""
    if not isinstance(body, dict):
        raise BadRequestError(f"body must be an object with a {key!r} list", key)
    items = body.get(key)
    if not isinstance(items, list):
        raise BadRequestError(f"{key}: a list is required", key)
    if not 1 <= len(items) <= MAX_BULK:
        raise BadRequestError(f"{key}: 1 to {MAX_BULK} items, got {len(items)}", key)
    return items


def model_fields(bundle: ModelBundle) -> dict[str, Any]:
    return {
        "model_type": "xgboost",
        "objective_type": bundle.objective,
        "quantile": bundle.alpha,
        "model_version": bundle.version,
    }


class PredictionRoutes:
    """``/predict``, ``/predict/bulk`` and ``/predict/bulk/strict`` over a predictor."""

    def __init__(self, predictor: InProcessPredictor) -> None:
        self.predictor = predictor
        self.batcher = TurnBatcher(predictor)
        """Requests handled in the same loop turn share one booster call per target."""

    def add_to(self, app: web.Application, bulk: bool = True) -> None:
        app.router.add_post("/predict", self.predict)
        if bulk:
            app.router.add_post("/predict/bulk", self.predict_bulk)
            app.router.add_post("/predict/bulk/strict", self.predict_bulk_strict)

    def _bundle(self) -> ModelBundle:
        bundle = self.predictor.bundle
        if bundle is None:
            raise web.HTTPServiceUnavailable(reason="models are not ready")
        return bundle

    async def predict(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        bundle = self._bundle()
        try:
            row_values(body)
        except FieldError as exc:
            raise BadRequestError.from_field(exc) from None
        out = await self.batcher.predict(bundle, matrix_from_json([body]))
        return json_response(
            {
                "ttft_ms": float(out.ttft_ms[0]),
                "tpot_ms": float(out.tpot_ms[0]),
                **model_fields(bundle),
            }
        )

    async def predict_bulk_strict(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        items = bulk_items(await read_json(request))
        bundle = self._bundle()
        try:
            x = matrix_from_json(items)
        except FieldError as exc:
            raise BadRequestError.from_field(exc) from None
        out = await self.batcher.predict(bundle, x)
        n = len(items)
        predictions = [
            {"ttft_ms": t, "tpot_ms": p}
            for t, p in zip(out.ttft_ms.tolist(), out.tpot_ms.tolist(), strict=True)
        ]
        return json_response(
            {
                "predictions": predictions,
                "total_requests": n,
                "successful_predictions": n,
                "failed_predictions": 0,
                "processing_time_ms": (time.perf_counter() - started) * 1000.0,
                **model_fields(bundle),
            }
        )

    async def predict_bulk(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        items = bulk_items(await read_json(request))
        bundle = self._bundle()
        good: list[Any] = []
        where: list[int] = []
        errors: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            try:
                row_values(item)
            except FieldError as exc:
                located = exc.at(f"requests[{i}]")
                errors.append({"index": i, "field": located.field, "error": str(located)})
                continue
            good.append(item)
            where.append(i)
        predictions: list[dict[str, float] | None] = [None] * len(items)
        if good:
            out = await self.batcher.predict(bundle, matrix_from_json(good))
            for i, t, p in zip(where, out.ttft_ms.tolist(), out.tpot_ms.tolist(), strict=True):
                predictions[i] = {"ttft_ms": t, "tpot_ms": p}
        return json_response(
            {
                "predictions": predictions,
                "errors": errors,
                "total_requests": len(items),
                "successful_predictions": len(good),
                "failed_predictions": len(errors),
                "processing_time_ms": (time.perf_counter() - started) * 1000.0,
                **model_fields(bundle),
            }
        )


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


def readyz_handler(predictor: InProcessPredictor) -> Handler:
    async def readyz(request: web.Request) -> web.Response:
        if predictor.bundle is None:
            return error_response(503, "models are not ready")
        return json_response({"status": "ready", "model_version": predictor.bundle.version})

    return readyz


def metrics_text(predictor: InProcessPredictor, buckets: bool = True) -> str:
    """Prometheus text of a predictor's state (see
    :class:`~sluicegate.latency.metrics.PredictorCollector`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PredictorCollector(predictor, buckets))
    return generate_latest(registry).decode()


def metrics_handler(predictor: InProcessPredictor, buckets: bool = True) -> Handler:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            text=metrics_text(predictor, buckets), content_type="text/plain", charset="utf-8"
        )

    return metrics


async def wait_for_signal() -> None:
    """Wait until SIGINT or SIGTERM (the servers' main loop; their ``finally`` cleans up)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
