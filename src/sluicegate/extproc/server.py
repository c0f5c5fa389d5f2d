"""The endpoint picker's servers: ext_proc gRPC, gRPC health, Prometheus ``/metrics``.

Ports are the reference endpoint picker's (GIE's, source below): ext_proc on
9002, gRPC health on 9003 (also answered on the ext_proc port, for proxies that health
check the ext_proc cluster), ``/metrics`` over HTTP on 9090 (with ``/healthz`` and
``/readyz`` for plain HTTP probes). Plain-text gRPC (HTTP/2 without TLS): run it inside
the cluster network, or put TLS in front.

:class:`ExtProcServer` owns the runtime's lifecycle (metric scraping starts and stops with
it) and refreshes readiness every ``readiness_interval_s`` seconds. :meth:`stop` drains:

1. readiness (and ``accepting``) go NOT_SERVING at once; the health servers keep answering
   until the very end, so probes see NOT_SERVING rather than a refused connection;
2. for ``drain_delay_s`` seconds new streams are still served: the time a Kubernetes
   Service needs to drop the pod from its endpoints and a proxy's health checks need to see
   NOT_SERVING (Envoy: ``unhealthy_threshold`` × ``interval``), so that no stream is sent
   to a port that already refuses;
3. new streams are refused, streams in flight get ``grace_period_s`` seconds to finish,
   then are cancelled (which releases their requests).

Ports: https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/server/options.go
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2_grpc

from sluicegate.extproc.health import PickerHealth
from sluicegate.extproc.metrics import ExtProcMetrics
from sluicegate.extproc.servicer import PickerServicer
from sluicegate.extproc.stream import StreamSettings
from sluicegate.runtime import Runtime
from sluicegate.upstream import UpstreamPool

log = logging.getLogger("sluicegate.extproc")

_MIN_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class ExtProcOptions:
    """Where the servers listen and how they run. Ports 0 = any free port."""

    host: str = "0.0.0.0"
    grpc_port: int = 9002
    health_port: int | None = 9003
    """gRPC health port; None to answer health on the ext_proc port only."""
    metrics_port: int | None = 9090
    """Prometheus port; None for no HTTP server."""
    stream: StreamSettings = field(default_factory=StreamSettings)
    readiness_interval_s: float = 0.5
    grace_period_s: float = 120.0
    """Seconds streams in flight may take to finish at shutdown."""
    drain_delay_s: float = 0.0
    """Seconds between readiness going NOT_SERVING and new streams being refused."""


class ExtProcServer:
    """Serves ``runtime`` as an Envoy ext_proc endpoint picker."""

    def __init__(
        self,
        runtime: Runtime,
        options: ExtProcOptions | None = None,
        synced: Callable[[], bool] | None = None,
    ) -> None:
        """``synced`` tells whether the endpoint source is complete (Kubernetes discovery
        has listed everything and the pool exists); until it is, requests are refused (503)
        and readiness is NOT_SERVING. None: endpoints from the configuration file."""
        self.runtime = runtime
        self.options = options or ExtProcOptions()
        self.synced = synced
        self.metrics = ExtProcMetrics.of(runtime.metrics.registry)
        self.health = PickerHealth()
        if synced is not None:
            self.options.stream.accepting = synced
        self.servicer = PickerServicer(runtime, self.options.stream, self.metrics)
        self.grpc_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._upstream: UpstreamPool | None = None
        self._servers: list[grpc.aio.Server] = []
        self._health_server: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._readiness: asyncio.Task[None] | None = None

    def ready(self) -> bool:
        """With a ``synced`` source (Kubernetes): synced, as the reference endpoint picker
        reports readiness (a pool whose pods are all down is answered with 503s, not by
        vanishing from its Service). Without one: some endpoint can take traffic (not
        ejected, fresh metrics)."""
        if self.synced is not None:
            return self.synced()
        return self.runtime.ready_endpoints() > 0

    async def start(self) -> None:
        options = self.options
        self._upstream = UpstreamPool()  # metric scrapes; Envoy carries the requests
        await self.runtime.start(self._upstream)
        await self.health.start()
        max_message = max(_MIN_MESSAGE_BYTES, self.runtime.config.gateway.max_body_bytes + 65536)
        main = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message),
                ("grpc.max_send_message_length", max_message),
            ]
        )
        pb_grpc.add_ExternalProcessorServicer_to_server(self.servicer, main)
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, main)
        self.grpc_port = _listen(main, options.host, options.grpc_port, "ext_proc")
        self._servers.append(main)
        if options.health_port is not None:
            health = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, health)
            self.health_port = _listen(health, options.host, options.health_port, "health")
            self._health_server = health
        for server in self._servers:
            await server.start()
        if self._health_server is not None:
            await self._health_server.start()
        if options.metrics_port is not None:
            await self._start_http(options.host, options.metrics_port)
        await self.refresh_readiness()
        self._readiness = asyncio.create_task(self._readiness_loop(), name="extproc-readiness")

    async def stop(self, grace_period_s: float | None = None) -> None:
        """Drain (see the module docstring) and stop everything."""
        grace = self.options.grace_period_s if grace_period_s is None else grace_period_s
        if self._readiness is not None:
            self._readiness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._readiness
            self._readiness = None
        await self.health.shutting_down()
        if self.options.drain_delay_s > 0:
            log.info("draining: serving new streams %.1f s more", self.options.drain_delay_s)
            await asyncio.sleep(self.options.drain_delay_s)
        servers, self._servers = self._servers, []
        await asyncio.gather(*(s.stop(grace) for s in servers))
        if self._health_server is not None:  # last: probes saw NOT_SERVING until now
            await self._health_server.stop(0)
            self._health_server = None
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        await self.runtime.stop()
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None

    async def refresh_readiness(self) -> None:
        await self.health.set_ready(self.ready())

    async def _readiness_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.readiness_interval_s)
            try:
                await self.refresh_readiness()
            except Exception:  # the loop must outlive a fault
                log.exception("readiness refresh failed")

    async def _start_http(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._http = web.AppRunner(app, access_log=None)
        await self._http.setup()
        site = web.TCPSite(self._http, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.metrics_port = sockets[0].getsockname()[1] if sockets else port

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.runtime.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4"},
        )

    async def _healthz(self, request: web.Request) -> web.Response:
        kv_events = self.runtime.kv_events
        unknown = kv_events.unknown_views() if kv_events.active else []
        mixed = self.runtime.mixed_hardware()
        if not unknown and not mixed:
            return web.json_response({"status": "ok"})
        body: dict[str, object] = {"status": "degraded"}
        if unknown:  # alive; precise prefix routing is approximate for these endpoints
            body["kv_events_unknown"] = unknown
        if mixed:  # alive; hardware-blind routing on a mixed pool
            body["mixed_hardware"] = mixed
        return web.json_response(body)

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = bool(self.health.ready)
        return web.json_response(
            {"ready": ready, "ready_endpoints": self.runtime.ready_endpoints()},
            status=200 if ready else 503,
        )


def _listen(server: grpc.aio.Server, host: str, port: int, what: str) -> int:
    """Bind ``server`` to ``host:port``; the bound port (raises OSError if it failed)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound: int = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen for {what} on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen for {what} on {address}")
    return bound
