"""The standalone gateway: an OpenAI-compatible HTTP server in front of a pool.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (public
model names), ``GET /metrics``, ``GET /health`` (alive), ``GET /ready`` (some endpoint can
take traffic). Everything the gateway decides itself is answered with an OpenAI-style error
body (see :mod:`sluicegate.errors`); an unexpected fault is logged and
answered 500 without taking the server down.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from sluicegate.api.loader import Config
from sluicegate.clock import Clock
from sluicegate.datalayer.collector import Collector
from sluicegate.errors import GatewayError
from sluicegate.gateway.proxy import Proxy, ProxySettings, upstream_headers
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.parse import CONTROL_HEADERS, RequestKind, parse_request
from sluicegate.runtime import Runtime, RuntimeOptions
from sluicegate.upstream import UpstreamPool

log = logging.getLogger("sluicegate.gateway")


REQUEST_ID = web.RequestKey("request_id", str)


def error_response(error: GatewayError, request_id: str | None = None) -> web.Response:
    """The client's answer for a decision the gateway made itself."""
    headers = error.headers()
    if request_id:
        headers["x-request-id"] = request_id
    return web.Response(
        status=error.status,
        body=error.body(),
        headers=headers,
        content_type="application/json",
    )


def bound_port(site: web.TCPSite) -> int:
    """The port a started site listens on (the chosen one when asked for port 0)."""
    server = site._server
    sockets = getattr(server, "sockets", None)
    if not sockets:
        raise RuntimeError("site is not listening")
    port: int = sockets[0].getsockname()[1]
    return port


access_log = logging.getLogger("sluicegate.access")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class GatewayOptions:
    """How the gateway runs, beyond what the configuration file says."""

    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    access_log: bool = False
    api_keys: list[str] = field(default_factory=list)
    """Accepted bearer tokens, in addition to the configuration's ``apiKeys``."""


class Gateway:
    """The standalone gateway: a :class:`~sluicegate.runtime.Runtime` behind HTTP."""

    def __init__(
        self, config: Config, options: GatewayOptions | None = None, clock: Clock | None = None
    ) -> None:
        self.options = options or GatewayOptions()
        self.runtime = Runtime(config, self.options.runtime, clock)
        self.clock = self.runtime.clock
        self.datastore = self.runtime.datastore
        self.director = self.runtime.director
        self.metrics = self.runtime.metrics
        self.upstream: UpstreamPool | None = None
        self.proxy: Proxy | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._max_body_bytes = config.gateway.max_body_bytes

    @property
    def config(self) -> Config:
        return self.runtime.config

    @property
    def collector(self) -> Collector | None:
        return self.runtime.collector

    @property
    def staleness_s(self) -> float:
        return self.runtime.staleness_s

    # ------------------------------------------------------------------ lifecycle

    def _api_keys(self) -> list[bytes]:
        return [k.encode() for k in (*self.config.gateway.api_keys, *self.options.api_keys)]

    async def start(self, host: str = "127.0.0.1", port: int = 8080) -> None:
        settings = self.config.gateway
        self.upstream = UpstreamPool(
            connect_timeout_s=settings.connect_timeout_ms / 1000.0,
            read_timeout_s=settings.request_timeout_ms / 1000.0,
        )
        try:
            await self._start(host, port)
        except BaseException:
            # A start that fails (a port in use, a bad latency trace) leaves nothing open.
            await self.stop()
            raise

    async def _start(self, host: str, port: int) -> None:
        assert self.upstream is not None
        settings = self.config.gateway
        await self.runtime.start(self.upstream)
        assert self.runtime.collector is not None
        self.proxy = Proxy(
            self.upstream,
            self.runtime.collector,
            self.metrics,
            ProxySettings(max_retries=settings.max_retries),
            self.clock,
        )
        app = self.build_app()
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = bound_port(site)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.runtime.stop()
        if self.upstream is not None:
            await self.upstream.close()

    def apply_config(self, config: Config) -> None:
        """Switch to ``config`` without dropping requests in flight (see
        :meth:`Runtime.apply_config <sluicegate.runtime.Runtime.apply_config>`)."""
        if config.gateway.max_body_bytes != self._max_body_bytes:
            log.warning("maxBodyBytes changes take effect at the next restart")
        self.runtime.apply_config(config)

    # ------------------------------------------------------------------ HTTP

    def build_app(self) -> web.Application:
        # The body limit is fixed for the application's life (a reload cannot change it).
        self._max_body_bytes = self.config.gateway.max_body_bytes
        app = web.Application(client_max_size=self._max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request.headers.get("x-request-id") or os.urandom(12).hex()
        request[REQUEST_ID] = request_id
        try:
            return await handler(request)
        except GatewayError as exc:
            return error_response(exc, request_id)
        except web.HTTPRequestEntityTooLarge:
            return error_response(
                GatewayError(
                    413,
                    f"request body is larger than {self._max_body_bytes} bytes",
                    code="body_too_large",
                    reason="body-too-large",
                ),
                request_id,
            )
        except web.HTTPException as exc:
            return error_response(
                GatewayError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_")),
                request_id,
            )
        except Exception:
            log.exception("unexpected error handling %s %s", request.method, request.path)
            return error_response(
                GatewayError(500, "internal error in the gateway", code="internal_error"),
                request_id,
            )

    def _check_auth(self, request: web.Request) -> None:
        keys = self._api_keys()
        if not keys:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
        if not any(hmac.compare_digest(token, key) for key in keys):
            raise GatewayError(
                401,
                "a valid API key is required (Authorization: Bearer ...)",
                code="invalid_api_key",
                reason="unauthorized",
            )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: RequestKind) -> web.StreamResponse:
        started = time.perf_counter()
        self._check_auth(request)
        raw = await request.read()
        headers = request.headers
        parsed = parse_request(kind, raw, headers)
        request_id = request[REQUEST_ID]
        dispatch = await self.runtime.acquire(parsed, request_id, headers, started)
        assert self.proxy is not None
        forward_headers = upstream_headers(
            headers, CONTROL_HEADERS, request_id, strip_authorization=bool(self._api_keys())
        )
        self.metrics.overhead.observe(time.perf_counter() - started)
        status = 0
        usage = None
        try:
            response, outcome = await self.proxy.forward(request, dispatch, raw, forward_headers)
            # A stream that broke after its first byte reached the client as 200 and an
            # error event: for the runtime it failed (no latency sample, an error metric).
            status = 502 if outcome.error else outcome.status
            usage = outcome.usage()
        except GatewayError as exc:
            status = exc.status
            raise
        finally:
            self.runtime.release(dispatch, status, usage)
            if self.options.access_log:
                self._log_access(dispatch, status, started)
        return response

    def _log_access(self, dispatch: Dispatch, status: int, started: float) -> None:
        access_log.info(
            "%s",
            orjson.dumps(
                {
                    "request_id": dispatch.request.request_id,
                    "model": dispatch.request.model,
                    "target_model": dispatch.request.target_model,
                    "endpoint": dispatch.endpoint.name,
                    "status": status,
                    "attempts": dispatch.attempts,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                    "ttft_ms": round((dispatch.first_byte_at - dispatch.request.arrival) * 1000, 3)
                    if dispatch.first_byte_at is not None
                    else None,
                }
            ).decode(),
        )

    async def _models(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        created = int(time.time())
        data = [
            {"id": n, "object": "model", "created": created, "owned_by": "sluicegate"}
            for n in self.runtime.model_names()
        ]
        return web.Response(
            body=orjson.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, request: web.Request) -> web.Response:
        ready = self.runtime.ready_endpoints()
        return web.json_response({"ready_endpoints": ready}, status=200 if ready else 503)
