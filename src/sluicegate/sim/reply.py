"""Replies shared by the simulator's extra routes (:mod:`sluicegate.sim.routes`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from sluicegate.sim import api

if TYPE_CHECKING:
    from sluicegate.sim.server import Replica

Handler = Callable[[web.Request], Any]


def bind(handler: Callable[[Replica, web.Request], Any], replica: Replica) -> Handler:
    async def bound(request: web.Request) -> web.StreamResponse:
        response: web.StreamResponse = await handler(replica, request)
        return response

    return bound


async def inject_faults(replica: Replica) -> None:
    """The replica's request faults, as its completions route applies them: hang forever,
    add latency, or fail with ``error_status`` at ``error_rate``."""
    faults = replica.faults
    if faults.hang:
        await asyncio.Event().wait()
    if faults.latency_ms > 0:
        await asyncio.sleep(faults.latency_ms / 1000.0)
    if faults.error_rate > 0 and replica.rng.random() < faults.error_rate:
        raise api.ApiError(faults.error_status, "injected fault")


def json_reply(replica: Replica, payload: object) -> web.Response:
    return web.Response(
        body=orjson.dumps(payload),
        content_type="application/json",
        headers=replica_headers(replica),
    )


def replica_headers(replica: Replica) -> dict[str, str]:
    return {
        "x-inference-pod": replica.pod_name,
        "x-inference-port": str(replica.port),
        "x-inference-namespace": replica.options.namespace,
    }


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise api.ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise api.ApiError(400, "request body must be a JSON object")
    return body


def model_of(replica: Replica, body: dict[str, Any]) -> tuple[str, str | None]:
    """The request's model and the adapter it names (None: the base model); a 404 for a
    model this replica does not serve, as vLLM answers."""
    model = body.get("model", replica.model_name)
    if not isinstance(model, str) or not model:
        raise api.ApiError(400, "'model' must be a non-empty string", "model")
    if model == replica.model_name:
        return model, None
    if model in replica.loras:
        return model, model
    raise api.ApiError(404, f"The model `{model}` does not exist.", "model")


__all__ = ["bind", "inject_faults", "json_body", "json_reply", "model_of", "replica_headers"]
