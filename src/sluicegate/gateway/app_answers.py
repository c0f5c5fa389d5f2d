"""What the standalone gateway answers itself (part of :mod:`sluicegate.gateway.app`): its
error bodies (:func:`send_error`) and the routes that read the gateway's own state —
``/v1/models`` and ``/v1/models/{id}``, ``/metrics``, ``/health``, ``/ready``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from sluicegate.gateway.http import JSON_CONTENT_TYPE
from sluicegate.requestcontrol.models_list import model_entries, model_entry

if TYPE_CHECKING:
    from sluicegate.datalayer.datastore import Datastore
    from sluicegate.errors import GatewayError
    from sluicegate.gateway.http import Request, Responder
    from sluicegate.metrics import GatewayMetrics
    from sluicegate.requestcontrol.director import Director
    from sluicegate.runtime import Runtime


def send_error(responder: Responder, error: GatewayError, request_id: str | None = None) -> None:
    """The client's answer for a decision the gateway made itself."""
    headers = error.headers()
    if request_id:
        headers["x-request-id"] = request_id
    responder.send(error.status, [JSON_CONTENT_TYPE, *headers.items()], error.body())


class _StatusRoutes:
    """The :class:`~sluicegate.gateway.app.Gateway`'s routes answered from its own state."""

    runtime: Runtime
    datastore: Datastore
    director: Director
    metrics: GatewayMetrics
    draining: bool

    async def _models(self, request: Request, responder: Responder, request_id: str) -> None:
        data = model_entries(self.datastore.all_endpoints(), self.director.models.routes)
        responder.send(200, [JSON_CONTENT_TYPE], orjson.dumps({"object": "list", "data": data}))

    async def _model(self, request: Request, responder: Responder, request_id: str) -> None:
        endpoints, routes = self.datastore.all_endpoints(), self.director.models.routes
        entry = model_entry(request.path, endpoints, routes)
        responder.send(200, [JSON_CONTENT_TYPE], orjson.dumps(entry))

    async def _metrics(self, request: Request, responder: Responder, request_id: str) -> None:
        headers = [("content-type", "text/plain; version=0.0.4; charset=utf-8")]
        responder.send(200, headers, self.metrics.render())

    async def _health(self, request: Request, responder: Responder, request_id: str) -> None:
        # Liveness: 200 while the process serves, whatever the pools hold (a restart
        # would not add endpoints); the body names pools nothing can be routed to.
        empty = self.runtime.empty_pools()
        unknown = self.runtime.kv_events.unknown_views() if self.runtime.kv_events.active else []
        mixed = self.runtime.mixed_hardware()
        if not empty and not unknown and not mixed:
            responder.send(200, [JSON_CONTENT_TYPE], b'{"status":"ok"}')
            return
        pools = self.runtime.datastore.pools
        body: dict[str, object] = {"status": "degraded"}
        if empty:
            body["empty_pools"] = [{"pool": name, "fix": pools[name].empty_hint} for name in empty]
        if unknown:  # precise prefix routing falls back to the approximate index there
            body["kv_events_unknown"] = unknown
        if mixed:  # hardware-blind routing on a mixed pool: serves, but badly balanced
            body["mixed_hardware"] = mixed
        responder.send(200, [JSON_CONTENT_TYPE], orjson.dumps(body))

    async def _ready(self, request: Request, responder: Responder, request_id: str) -> None:
        if self.draining:  # first to fail on SIGTERM: the load balancer moves away
            responder.send(503, [JSON_CONTENT_TYPE], b'{"ready_endpoints":0,"draining":true}')
            return
        ready = self.runtime.ready_endpoints()
        body = orjson.dumps({"ready_endpoints": ready})
        responder.send(200 if ready else 503, [JSON_CONTENT_TYPE], body)


__all__ = ["send_error"]
