"""The simulator's admin routes: what vLLM offers to manage a running server, and the
fault switches tests and the lab drive it with.

- ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: vLLM's runtime LoRA
  loading (``{"lora_name": ..., "lora_path": ...}``), answered in vLLM's words; a loaded
  adapter is served and listed until unloaded or the replica restarts;
- ``POST /reset_prefix_cache``: drops every cached prefix block;
- ``GET`` / ``POST /admin/faults``: the replica's :class:`~sluicegate.sim.faults.Faults`
  (read, or updated from a JSON object of fields to change).

vLLM's routes as in ``vllm/entrypoints/openai/api_server.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from sluicegate.sim import api
from sluicegate.sim.reply import bind, json_body, json_reply, replica_headers

if TYPE_CHECKING:
    from sluicegate.sim.server import Replica

log = logging.getLogger("sluicegate.sim")


def register(app: web.Application, replica: Replica) -> None:
    """Add this module's routes for ``replica`` to ``app``."""
    app.router.add_post("/v1/load_lora_adapter", bind(load_lora, replica))
    app.router.add_post("/v1/unload_lora_adapter", bind(unload_lora, replica))
    app.router.add_post("/reset_prefix_cache", bind(reset_prefix_cache, replica))
    app.router.add_get("/admin/faults", bind(get_faults, replica))
    app.router.add_post("/admin/faults", bind(set_faults, replica))


async def load_lora(replica: Replica, request: web.Request) -> web.Response:
    body = await json_body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name:
        raise api.ApiError(400, "'lora_name' must be a non-empty string", "lora_name")
    if name in replica.loras:
        raise api.ApiError(400, f"The lora adapter '{name}' has already been loaded.", "lora_name")
    replica.loras[name] = path if isinstance(path, str) and path else f"/adapters/{name}"
    replica.metrics.lora_enabled = True
    return web.Response(
        text=f"Success: LoRA adapter '{name}' added successfully.",
        headers=replica_headers(replica),
    )


async def unload_lora(replica: Replica, request: web.Request) -> web.Response:
    body = await json_body(request)
    name = body.get("lora_name")
    if not isinstance(name, str) or name not in replica.loras:
        raise api.ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
    del replica.loras[name]
    return web.Response(
        text=f"Success: LoRA adapter '{name}' removed successfully.",
        headers=replica_headers(replica),
    )


async def reset_prefix_cache(replica: Replica, request: web.Request) -> web.Response:
    replica.engine.reset_prefix_cache()
    replica.driver.flush_kv_events()  # AllBlocksCleared goes out now, not at the next step
    return web.Response(status=200, headers=replica_headers(replica))


async def get_faults(replica: Replica, request: web.Request) -> web.Response:
    return json_reply(replica, replica.faults.as_dict())


async def set_faults(replica: Replica, request: web.Request) -> web.Response:
    body = await json_body(request)
    was_frozen = replica.faults.freeze_metrics
    try:
        replica.faults.update(body)
    except ValueError as exc:
        raise api.ApiError(400, str(exc)) from None
    if replica.faults.freeze_metrics and not was_frozen:
        replica.freeze_metrics()  # frozen as it is now
    elif not replica.faults.freeze_metrics:
        replica.thaw_metrics()
    log.info("replica %d faults: %s", replica.index, replica.faults.as_dict())
    return json_reply(replica, replica.faults.as_dict())


__all__ = ["register"]
