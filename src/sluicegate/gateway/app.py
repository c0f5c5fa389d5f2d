"""The standalone gateway: an OpenAI-compatible HTTP server in front of a pool.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (public
model names), ``GET /metrics``, ``GET /health`` (alive), ``GET /ready`` (some endpoint can
take traffic). Everything the gateway decides itself is answered with an OpenAI-style error
body (see :mod:`sluicegate.errors`); an unexpected fault is logged and
answered 500 without taking the server down.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

from sluicegate.api.loader import Config
from sluicegate.clock import Clock, MonotonicClock
from sluicegate.datalayer.collector import Collector, CollectorSettings
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import FlowControlSetup, build_flow_control
from sluicegate.flowcontrol.types import QueueItem
from sluicegate.gateway.metrics import GatewayMetrics
from sluicegate.gateway.proxy import Proxy, ProxySettings, upstream_headers
from sluicegate.plugin import (
    PluginContext,
)
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import CONTROL_HEADERS, RequestKind, parse_request
from sluicegate.scheduling.config import BuiltScheduler, build_scheduler
from sluicegate.scheduling.plugins.prefix_cache import PREFIX_MATCH, ApproxPrefixCacheProducer

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

    seed: int = 0
    access_log: bool = False
    api_keys: list[str] = field(default_factory=list)
    """Accepted bearer tokens, in addition to the configuration's ``apiKeys``."""


def endpoint_specs(config: Config) -> dict[str, list[EndpointSpec]]:
    """Static endpoints of every pool, named by ``name`` or by address."""
    out: dict[str, list[EndpointSpec]] = {}
    for pool_name, pool in config.pools.items():
        specs = []
        for static in pool.spec.endpoints:
            scheme = "https" if static.address.startswith("https://") else "http"
            address = static.address.removeprefix("http://").removeprefix("https://")
            host, _, port = address.rstrip("/").rpartition(":")
            host = host.strip("[]")
            specs.append(
                EndpointSpec(
                    static.name or address,
                    host,
                    int(port),
                    dict(static.labels),
                    static.engine_type,
                    scheme,
                )
            )
        out[pool_name] = specs
    return out


class Gateway:
    """The gateway's state and its HTTP application."""

    def __init__(
        self, config: Config, options: GatewayOptions | None = None, clock: Clock | None = None
    ) -> None:
        self.options = options or GatewayOptions()
        self.clock = clock or MonotonicClock()
        self.config = config
        settings = config.gateway
        self.staleness_s = settings.metrics_staleness_ms / 1000.0
        self.datastore = Datastore()
        self.built = self._build_scheduler(config)
        self.director = Director(
            self.datastore,
            self.built,
            ModelTable(config),
            self.clock,
            self.staleness_s,
            flow=self._build_flow(config, self.built),
        )
        self.director.on_dispatch = self._on_dispatch
        self.director.on_reject = self._on_reject
        self._expiry: asyncio.TimerHandle | None = None
        self.metrics = GatewayMetrics(
            self.datastore,
            self.clock,
            self.staleness_s,
            self._prefix_index_size,
            self._flow_state,
        )
        self.session: aiohttp.ClientSession | None = None
        self.collector: Collector | None = None
        self.proxy: Proxy | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._max_body_bytes = config.gateway.max_body_bytes
        self._apply_pools(config)

    # ------------------------------------------------------------------ lifecycle

    def _build_scheduler(self, config: Config) -> BuiltScheduler:
        context = PluginContext(self.clock, self.options.seed)
        return build_scheduler(config.picker, context)

    def _build_flow(self, config: Config, built: BuiltScheduler) -> FlowControlSetup:
        return build_flow_control(
            config.picker, built.plugins, PluginContext(self.clock, self.options.seed)
        )

    def _apply_pools(self, config: Config) -> None:
        specs = endpoint_specs(config)
        for pool_name in list(self.datastore.pools):
            if pool_name not in specs:
                self.datastore.remove_pool(pool_name)
        for pool_name, pool_specs in specs.items():
            self.datastore.set_endpoints(pool_name, pool_specs)
            self.datastore.pools[pool_name].annotations = dict(
                config.pools[pool_name].metadata.annotations
            )

    def _prefix_index_size(self) -> int:
        return sum(
            len(p.index)
            for p in self.built.plugins.values()
            if isinstance(p, ApproxPrefixCacheProducer)
        )

    def _api_keys(self) -> list[bytes]:
        return [k.encode() for k in (*self.config.gateway.api_keys, *self.options.api_keys)]

    async def start(self, host: str = "127.0.0.1", port: int = 8080) -> None:
        settings = self.config.gateway
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self.collector = Collector(
            self.datastore,
            self.session,
            self.clock,
            CollectorSettings(
                scrape_interval_s=settings.scrape_interval_ms / 1000.0,
                scrape_timeout_s=settings.scrape_timeout_ms / 1000.0,
                models_interval_s=settings.models_refresh_interval_ms / 1000.0,
                eject_after=settings.eject_after_failures,
            ),
        )
        self.collector.on_scrape.append(self._on_scrape)
        self.collector.start()
        self.proxy = Proxy(
            self.session,
            self.collector,
            self.metrics,
            ProxySettings(
                max_retries=settings.max_retries,
                connect_timeout_s=settings.connect_timeout_ms / 1000.0,
                read_timeout_s=settings.request_timeout_ms / 1000.0,
            ),
            self.clock,
        )
        app = self.build_app()
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = bound_port(site)

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.collector is not None:
            await self.collector.stop()
        if self.session is not None:
            await self.session.close()

    def apply_config(self, config: Config) -> None:
        """Switch to ``config`` without dropping requests in flight.

        Endpoints that stay keep their state; the scheduler is rebuilt only when the
        EndpointPickerConfig changed (rebuilding starts its prefix index afresh).
        """
        old_picker = self.config.picker
        new_picker = config.picker
        same = (old_picker.model_dump() if old_picker else None) == (
            new_picker.model_dump() if new_picker else None
        )
        # Build everything that can fail before changing anything.
        built = self.built if same else self._build_scheduler(config)
        flow = self.director.flow if same else self._build_flow(config, built)
        models = ModelTable(config)
        if config.gateway.max_body_bytes != self._max_body_bytes:
            log.warning("maxBodyBytes changes take effect at the next restart")
        self.config = config
        self.director.models = models
        self._apply_pools(config)
        self.built = self.director.built = built
        self.director.set_flow(flow)
        log.info(
            "configuration applied: %d pool(s), %d model(s)%s",
            len(config.pools),
            len(config.models),
            "" if same else ", scheduler rebuilt",
        )

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
        metrics = self.metrics
        waiter: asyncio.Future[Dispatch] = asyncio.get_running_loop().create_future()
        try:
            admitted = self.director.admit(parsed, request_id, headers)
            result = self.director.submit(admitted, payload=waiter)
            if isinstance(result, QueueItem):
                dispatch = await self._wait(result, waiter)
            else:
                dispatch = result
                metrics.scheduler_duration.observe(time.perf_counter() - started)
        except GatewayError as exc:
            metrics.scheduler_attempts.labels("failure").inc()
            metrics.refused.labels(exc.reason).inc()
            metrics.errors.labels(parsed.model, "", str(exc.status)).inc()
            raise
        metrics.scheduler_attempts.labels("success").inc()
        match = dispatch.state.get(PREFIX_MATCH)
        if match is not None and match.hashes:
            metrics.prefix_hit_ratio.observe(match.score(dispatch.endpoint.name))
        model, target = parsed.model, dispatch.request.target_model
        metrics.requests.labels(model, target).inc()
        running = metrics.running.labels(model)
        running.inc()
        assert self.proxy is not None
        forward_headers = upstream_headers(
            headers, CONTROL_HEADERS, request_id, strip_authorization=bool(self._api_keys())
        )
        metrics.overhead.observe(time.perf_counter() - started)
        status = 0
        try:
            response, outcome = await self.proxy.forward(request, dispatch, raw, forward_headers)
            status = outcome.status
        except GatewayError as exc:
            status = exc.status
            metrics.errors.labels(model, target, str(exc.status)).inc()
            raise
        finally:
            dispatch.finish(self.clock.now())
            running.dec()
            if self.director.controllers():
                self.director.pump()  # its place may be someone else's now
                self._arm_expiry()
            if self.options.access_log:
                self._log_access(dispatch, status, started)
        if status >= 400:
            metrics.errors.labels(model, target, str(status)).inc()
        else:
            self._observe(
                dispatch,
                outcome.completion_tokens or outcome.chunks,
                outcome.prompt_tokens,
                outcome.cached_tokens,
            )
        return response

    # ------------------------------------------------------------------ flow control

    async def _wait(self, item: QueueItem, waiter: asyncio.Future[Dispatch]) -> Dispatch:
        """Wait for a queued request to be dispatched (or refused)."""
        self._arm_expiry()
        try:
            return await waiter
        except asyncio.CancelledError:
            # The client left: free its place in the queue. If it was dispatched just
            # before (the result set, this task not resumed yet), release the dispatch.
            if self.director.cancel(item):
                self._observe_wait(item, "cancelled")
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().finish(self.clock.now())
                self.director.pump()  # its place may be someone else's now
            raise

    def _on_dispatch(self, item: QueueItem, dispatch: Dispatch) -> None:
        waiter: asyncio.Future[Dispatch] = item.payload
        self._observe_wait(item, "dispatched")
        if waiter.done():  # its client left while it was being scheduled
            dispatch.finish(self.clock.now())
        else:
            waiter.set_result(dispatch)

    def _on_reject(self, item: QueueItem, error: GatewayError) -> None:
        waiter: asyncio.Future[Dispatch] = item.payload
        self._observe_wait(item, error.reason)
        if not waiter.done():
            waiter.set_exception(error)

    def _observe_wait(self, item: QueueItem, outcome: str) -> None:
        self.metrics.queue_wait.labels(str(item.priority), outcome).observe(
            self.clock.now() - item.enqueued_at
        )

    def _arm_expiry(self) -> None:
        """Make sure a timer fires at the next queue deadline."""
        if self._expiry is not None:
            return
        deadline = self.director.next_deadline()
        if deadline is None:
            return
        delay = max(0.0, deadline - self.clock.now())
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        self.director.expire()
        self._arm_expiry()

    def _flow_state(self) -> list[tuple[str, float, list[tuple[int, int, int]]]]:
        now = self.clock.now()
        out = []
        for name, controller in self.director.controllers().items():
            pool = self.datastore.pools.get(name)
            endpoints = [e for e in pool.endpoints if not e.health.ejected] if pool else []
            out.append(
                (
                    name,
                    self.director.flow.detector.saturation(endpoints, now),
                    [(b.priority, b.requests, b.bytes) for b in controller.bands()],
                )
            )
        return out

    def _on_scrape(self, endpoint: Endpoint) -> None:
        """Fresh metrics may show room for waiting requests."""
        if self.director.controllers():
            self.director.pump()

    def _observe(
        self,
        dispatch: Dispatch,
        output_tokens: int,
        prompt_tokens: int | None,
        cached_tokens: int | None,
    ) -> None:
        m = self.metrics
        labels = (dispatch.request.model, dispatch.request.target_model)
        finished = dispatch.finished_at or self.clock.now()
        e2e = finished - dispatch.request.arrival
        m.duration.labels(*labels).observe(e2e)
        if dispatch.first_byte_at is not None and dispatch.request.stream:
            ttft = dispatch.first_byte_at - dispatch.request.arrival
            m.ttft.labels(*labels).observe(ttft)
            if output_tokens > 1:
                m.tpot.labels(*labels).observe((e2e - ttft) / (output_tokens - 1))
        if prompt_tokens is not None:
            m.input_tokens.labels(*labels).observe(prompt_tokens)
        if output_tokens:
            m.output_tokens.labels(*labels).observe(output_tokens)
        if cached_tokens is not None:
            m.cached_tokens.labels(*labels).observe(cached_tokens)

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
        names = set(self.director.models.public_names())
        for endpoint in self.datastore.all_endpoints():
            names |= endpoint.models.base_models | endpoint.models.adapters
        created = int(time.time())
        data = [
            {"id": n, "object": "model", "created": created, "owned_by": "sluicegate"}
            for n in sorted(names)
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
        now = self.clock.now()
        ready = sum(
            1
            for e in self.datastore.all_endpoints()
            if not e.health.ejected and not e.is_stale(now, self.staleness_s)
        )
        status = 200 if ready else 503
        return web.json_response({"ready_endpoints": ready}, status=status)
