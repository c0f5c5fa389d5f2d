"""The standalone gateway: an OpenAI-compatible HTTP server in front of a pool.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (parsed, scheduled and
proxied), ``GET /v1/models`` and ``GET /v1/models/{id}`` (the fleet's own list,
:mod:`sluicegate.requestcontrol.models_list`), ``GET /metrics``, ``GET /health`` (alive),
``GET /ready`` (some endpoint can take traffic); ``HEAD`` wherever ``GET`` is. Every other
path the servers' API namespaces hold (embeddings, the Responses API, tokenize, rerank,
audio...) is passed through — the same scheduling, retries, metrics and streaming as
completions, to the pool serving the body's ``model`` — unless it is one of the servers'
administrative routes (:mod:`sluicegate.requestcontrol.routes` says which). The route table
is one dict lookup; only a miss looks further. Everything the gateway decides itself is
answered with an OpenAI-style error body (see :mod:`sluicegate.errors`); an unexpected
fault is logged and answered 500 without taking the server down.

API keys are checked on the request head, before the body is read
(:meth:`Gateway._check_head`); when keys are configured every path needs one, except
``/health``, ``/ready`` and — unless ``metricsAuth`` — ``/metrics``. The routing-control
headers are honoured only from trusted clients (``trustControlHeaders``,
``trustedApiKeys``); they are never forwarded upstream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import orjson

from sluicegate.api.keys import check_keys
from sluicegate.api.loader import Config
from sluicegate.clock import Clock
from sluicegate.datalayer.collector import Collector
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.errors import GatewayError
from sluicegate.gateway.app_answers import _StatusRoutes, send_error
from sluicegate.gateway.app_keys import _KeyCheck
from sluicegate.gateway.http import HttpServer, Refusal, Request, Responder
from sluicegate.gateway.proxy import Proxy, ProxySettings, upstream_headers
from sluicegate.live_metrics import ClientConnections
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.ids import request_id_from
from sluicegate.requestcontrol.models_list import MODEL_PREFIX, MODELS_PATH
from sluicegate.requestcontrol.parse import (
    CONTROL_HEADERS,
    ROUTING_HEADERS,
    RequestKind,
    parse_other,
    parse_request,
    without_routing_headers,
)
from sluicegate.requestcontrol.routes import GENERATION_ROUTES, check_passed, generates
from sluicegate.runtime import Runtime, RuntimeOptions
from sluicegate.upstream import UpstreamPool

log = logging.getLogger("sluicegate.gateway")
access_log = logging.getLogger("sluicegate.access")

Route = Callable[[Request, Responder, str], Awaitable[None]]


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


@dataclass(slots=True)
class GatewayOptions:
    """How the gateway runs, beyond what the configuration file says."""

    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    access_log: bool = False
    api_keys: list[str] = field(default_factory=list)
    """Accepted bearer tokens, in addition to the configuration's ``apiKeys``."""
    shutdown_grace_s: float = 5.0
    """How long requests in progress may take to finish when the gateway stops (s)."""
    drain_delay_s: float = 0.0
    """On :meth:`Gateway.drain`: how long the gateway keeps serving, not ready, before it
    stops listening (s): the time a load balancer takes to see ``/ready`` fail."""


class Gateway(_StatusRoutes):
    """The standalone gateway: a :class:`~sluicegate.runtime.Runtime` behind HTTP."""

    def __init__(
        self, config: Config, options: GatewayOptions | None = None, clock: Clock | None = None
    ) -> None:
        self.options = options or GatewayOptions()
        if problems := check_keys(self.options.api_keys, "GatewayOptions.api_keys"):
            raise ValueError("; ".join(problems))  # never the keys themselves
        self.runtime = Runtime(config, self.options.runtime, clock)
        self.draining = False
        """Set by :meth:`drain`: ``/ready`` fails from then on."""
        self.clock = self.runtime.clock
        self.datastore = self.runtime.datastore
        self.director = self.runtime.director
        self.metrics = self.runtime.metrics
        self.upstream: UpstreamPool | None = None
        self.proxy: Proxy | None = None
        self._server: HttpServer | None = None
        self.port = 0
        self._max_body_bytes = config.gateway.max_body_bytes
        self._server_limits = _server_limits(config)
        self._key_check = _KeyCheck(self.options.api_keys)
        self._routes: dict[str, tuple[str, Route]] = {
            **{
                path: ("POST", partial(self._generate, kind=kind))
                for path, kind in GENERATION_ROUTES.items()
            },
            MODELS_PATH: ("GET", self._models),
            "/metrics": ("GET", self._metrics),
            "/health": ("GET", self._health),
            "/ready": ("GET", self._ready),
        }
        self._pass_through: Route = partial(self._generate, kind="other")

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
        if self.runtime.outlier is not None:
            # The requests are this pool's exchanges: a stalled endpoint's are aborted, and
            # the proxy retries each one elsewhere (see datalayer.stall).
            self.runtime.outlier.on_stall.append(self._abort_stalled)
            self.runtime.outlier.waiting_on = self._waiting_on
        self.proxy = Proxy(
            self.upstream,
            self.runtime.report,
            self.metrics,
            ProxySettings(
                max_retries=settings.max_retries,
                first_byte_timeout_s=_seconds(settings.first_byte_timeout_ms),
                non_streaming_first_byte_timeout_s=_seconds(
                    settings.non_streaming_first_byte_timeout_ms
                ),
            ),
            self.clock,
        )
        # The client limits are fixed for the server's life (a reload cannot change them).
        self._max_body_bytes = settings.max_body_bytes
        self._server_limits = _server_limits(self.config)
        self._server = HttpServer(
            self._handle,
            self._too_large,
            self._max_body_bytes,
            on_head=self._check_head,
            max_connections=settings.max_connections,
            max_buffered_body_bytes=settings.max_buffered_body_bytes,
            body_timeout_s=settings.body_timeout_ms / 1000.0,
        )
        server = self._server
        self.metrics.watch_client_connections(
            lambda: ClientConnections(
                server.open_connections,
                server.connections_refused,
                server.buffered_body_bytes,
                server.body_timeouts,
            )
        )
        self.port = await server.start(host, port)

    def _waiting_on(self, endpoint: Endpoint) -> bool:
        """Whether a request's exchange with ``endpoint`` waits for its bytes now."""
        upstream = self.upstream
        return (
            upstream is not None
            and upstream.waiting(endpoint.scheme, endpoint.host, endpoint.port) > 0
        )

    def _abort_stalled(self, endpoint: Endpoint) -> None:
        if self.upstream is None:
            return
        aborted = self.upstream.abort(
            endpoint.scheme, endpoint.host, endpoint.port, "the endpoint stalled"
        )
        log.warning(
            "endpoint %s (%s) stalled: %d exchange(s) in progress aborted, to be retried",
            endpoint.name,
            endpoint.address,
            aborted,
        )

    async def drain(self) -> None:
        """Leave gracefully (SIGTERM): ``/ready`` answers 503 at once, answers close their
        connections, and requests keep being served for ``drain_delay_s``; then
        :meth:`stop` stops listening and gives requests in progress (streams included)
        ``shutdown_grace_s`` to finish."""
        self.draining = True
        if self._server is not None:
            self._server.drain()
        log.info(
            "draining: not ready; serving %.1f s more, then up to %.1f s for requests in progress",
            self.options.drain_delay_s,
            self.options.shutdown_grace_s,
        )
        if self.options.drain_delay_s > 0:
            await asyncio.sleep(self.options.drain_delay_s)
        await self.stop()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop listening; requests in progress get ``grace_s`` seconds (default
        ``shutdown_grace_s``; 0: cut off now)."""
        if self._server is not None:
            grace = self.options.shutdown_grace_s if grace_s is None else grace_s
            await self._server.stop(grace)
            self._server = None
        await self.runtime.stop()
        if self.upstream is not None:
            await self.upstream.close()

    def apply_config(self, config: Config) -> None:
        """Switch to ``config`` without dropping requests in flight (see
        :meth:`Runtime.apply_config <sluicegate.runtime.Runtime.apply_config>`)."""
        self._warn_restart(config)
        self.runtime.apply_config(config)

    async def reload(self, config: Config) -> None:
        """:meth:`apply_config`, the pools' tokenizers loaded in a worker thread first
        (:meth:`Runtime.reload <sluicegate.runtime.Runtime.reload>`)."""
        self._warn_restart(config)
        await self.runtime.reload(config)

    def _warn_restart(self, config: Config) -> None:
        new_limits = _server_limits(config)
        for name, old, new in zip(_SERVER_LIMITS, self._server_limits, new_limits, strict=True):
            if old != new:
                log.warning("%s changes take effect at the next restart", name)

    # ------------------------------------------------------------------ HTTP

    def _check_head(self, request: Request) -> Refusal | None:
        """The API-key check, on the request head (before its body is read): a 401, or
        None to go on. This is the only place keys are checked."""
        return self._key_check.refusal(request, self.config)

    async def _handle(self, request: Request, responder: Responder) -> None:
        request_id = request_id_from(request.headers.get("x-request-id"))
        try:
            route = self._routes.get(request.path)
            if route is None:
                route = self._other_route(request)
            method, handler = route
            if request.method != method and (request.method != "HEAD" or method != "GET"):
                raise GatewayError(
                    405,
                    f"{request.path} takes {method}, not {request.method}",
                    code="method_not_allowed",
                )
            await handler(request, responder, request_id)
        except GatewayError as exc:
            if responder.started:
                raise
            send_error(responder, exc, request_id)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("unexpected error handling %s %s", request.method, request.path)
            if responder.started:
                raise
            error = GatewayError(500, "internal error in the gateway", code="internal_error")
            send_error(responder, error, request_id)

    def _other_route(self, request: Request) -> tuple[str, Route]:
        """The route of a path outside the table: one model's entry, or a pass-through
        (any method) if :func:`~sluicegate.requestcontrol.routes.check_passed` allows it."""
        path = request.path
        if path.startswith(MODEL_PREFIX):
            return "GET", self._model
        check_passed(request.method, path)
        return request.method, self._pass_through

    def _too_large(self, request: Request, responder: Responder) -> None:
        error = GatewayError(
            413,
            f"request body is larger than {self._max_body_bytes} bytes",
            code="body_too_large",
            reason="body-too-large",
        )
        send_error(responder, error, request_id_from(request.headers.get("x-request-id")))

    # The entry for front servers other than the gateway's own (the lab's library-server
    # adapters): the same checks and handler, in the order the own server applies them.

    async def handle_request(self, request: Request, responder: Responder) -> None:
        """Answer one request whose body has been read in full, as the gateway's own server
        does: the API-key check (a 401 without running the route), then the route. Errors
        are answered as OpenAI-style bodies; a ConnectionError (the client left mid-answer)
        and cancellation propagate."""
        refusal = self._check_head(request)
        if refusal is not None:
            responder.send(refusal.status, refusal.headers, refusal.body)
            return
        await self._handle(request, responder)

    def refuse_too_large(self, request: Request, responder: Responder) -> None:
        """Answer 413 to a request whose body is over ``maxBodyBytes`` (call it before
        reading the body: the gateway's own server never reads one that large)."""
        self._too_large(request, responder)

    async def _generate(
        self, request: Request, responder: Responder, request_id: str, kind: RequestKind
    ) -> None:
        started = time.perf_counter()
        raw = request.body
        headers: Mapping[str, str] = request.headers
        trusted = self._key_check.trusted
        if not ROUTING_HEADERS.isdisjoint(headers) and not trusted(headers, self.config):
            headers = without_routing_headers(headers)  # ignored (and never forwarded)
        if kind == "other":
            parsed = parse_other(raw, headers, generates(request.path))
        else:
            parsed = parse_request(kind, raw, headers)
        dispatch = await self.runtime.acquire(parsed, request_id, headers, started)
        assert self.proxy is not None
        forward_headers = upstream_headers(
            request.headers,
            CONTROL_HEADERS,
            request_id,
            strip_authorization=bool(self._key_check.keys(self.config).accepted),
        )
        self.metrics.overhead.observe(time.perf_counter() - started)
        status = 0
        usage = None
        try:
            outcome = await self.proxy.forward(
                request.target, responder, dispatch, raw, forward_headers, request.method
            )
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


_SERVER_LIMITS = ("maxBodyBytes", "maxConnections", "maxBufferedBodyBytes", "bodyTimeoutMs")


def _server_limits(config: Config) -> tuple[float, ...]:
    """The settings the HTTP server is built with, in the order of ``_SERVER_LIMITS``."""
    s = config.gateway
    return (s.max_body_bytes, s.max_connections, s.max_buffered_body_bytes, s.body_timeout_ms)
