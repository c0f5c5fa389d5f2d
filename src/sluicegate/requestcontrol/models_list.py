"""The fleet's own model list: ``GET /v1/models`` and ``GET /v1/models/{id}``.

The entries are the servers' own, as each wrote them in its ``/v1/models`` (vLLM's
``id``, ``object``, ``created``, ``owned_by``, ``root``, ``parent``, ``max_model_len``,
``permission``: an adapter is told from a base model by its ``parent``). The collector
lists every endpoint's models in the background every ``modelsRefreshIntervalMs``, each
within ``scrapeTimeoutMs`` (:mod:`sluicegate.datalayer.collector`), so answering never
waits on a server: a slow or broken one just keeps its last list (or has none yet). Memory
is bounded there (``MAX_LISTED_MODELS`` entries per endpoint).

Entries are de-duplicated by ``id`` (the first endpoint by name wins: replicas list the
same models). Every public name of an InferenceModel that no server lists under that name
is added, pointing at its target: ``parent`` is the target model (the heaviest of a
weighted split), ``root`` the target's own ``root``, and ``owned_by``, ``created`` and
``max_model_len`` are the target's when a server lists it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.errors import unknown_model
from sluicegate.requestcontrol.models import ModelRoute

MODELS_PATH = "/v1/models"
MODEL_PREFIX = "/v1/models/"

Entry = Mapping[str, object]


def model_entries(endpoints: Iterable[Endpoint], routes: Mapping[str, ModelRoute]) -> list[Entry]:
    """The merged list (see the module docstring), sorted by id."""
    served: dict[str, Entry] = {}
    for endpoint in sorted(endpoints, key=lambda e: e.name):
        for entry in endpoint.models.entries:
            model_id = entry["id"]
            if isinstance(model_id, str) and model_id not in served:
                served[model_id] = entry
    merged = dict(served)
    for public, route in routes.items():
        if public not in merged:
            merged[public] = _public_entry(public, route, served)
    return [merged[name] for name in sorted(merged)]


def model_entry(
    path: str, endpoints: Iterable[Endpoint], routes: Mapping[str, ModelRoute]
) -> Entry:
    """The entry of ``GET /v1/models/{id}`` (``path`` starts with :data:`MODEL_PREFIX`);
    the id may contain ``/`` as it is or percent-encoded (the OpenAI SDK encodes it).
    Raises the 404 of an unknown model."""
    model_id = unquote(path[len(MODEL_PREFIX) :])
    for entry in model_entries(endpoints, routes):
        if entry["id"] == model_id:
            return entry
    raise unknown_model(model_id)


def _public_entry(public: str, route: ModelRoute, served: Mapping[str, Entry]) -> Entry:
    target = max(zip(route.weights, route.targets, strict=True), key=lambda wt: wt[0])[1]
    base = served.get(target, {})
    root = base.get("root")
    entry: dict[str, object] = {
        "id": public,
        "object": "model",
        "created": base.get("created", int(time.time())),
        "owned_by": base.get("owned_by", "sluicegate"),
        "root": root if isinstance(root, str) else target,
        "parent": target,
    }
    if "max_model_len" in base:
        entry["max_model_len"] = base["max_model_len"]
    return entry


__all__ = ["MODELS_PATH", "MODEL_PREFIX", "model_entries", "model_entry"]
