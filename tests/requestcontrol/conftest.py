"""Fixtures for the request-control tests.

``route_env(docs, endpoints=3, seed=0)`` builds a :class:`RouteEnv`: a configuration from
``docs`` (dicts; ``pool_doc``/``model_doc``/``objective_doc`` make the usual ones), a
hand-built :class:`Datastore` with ``endpoints`` endpoints ``ep-0``… in pool ``pool``
(``10.0.0.1:8000+i``, never scraped), and a :class:`Director` using the ``default``
scheduling preset, all on one :class:`ManualClock` (starting at 1000 s). Its helpers:

- ``env.ep(i)``: endpoint ``ep-i``;
- ``env.scrape(i, waiting=…, running=…, kv_usage=…, age=0.0)``: give it fresh metrics;
- ``env.serve(i, base=…, adapters=…)``: set what its ``/v1/models`` listed;
- ``env.route(body, headers)``: parse and route a completions request (dict body);
- ``env.inflight()``: ``{name: (requests, prompt_tokens, decode_tokens)}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
import pytest

from sluicegate.api.loader import build_config
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, ServedModels
from sluicegate.framework import PluginContext
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import RequestKind, parse_request
from sluicegate.scheduling.config import build_scheduler, load_preset

REGISTRY = default_registry()

POOL = "pool"


def _pool_doc(name: str = POOL) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {"targetPorts": [{"number": 8000}]},
    }


def _model_doc(
    public: str,
    targets: Mapping[str, int | None] | Sequence[str] = (),
    criticality: str | None = None,
    pool: str = POOL,
) -> dict[str, Any]:
    if isinstance(targets, Mapping):
        target_models = [
            {"name": n} if w is None else {"name": n, "weight": w} for n, w in targets.items()
        ]
    else:
        target_models = [{"name": n} for n in targets]
    spec: dict[str, Any] = {
        "modelName": public,
        "poolRef": {"name": pool},
        "targetModels": target_models,
    }
    if criticality is not None:
        spec["criticality"] = criticality
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": public},
        "spec": spec,
    }


def _objective_doc(name: str, priority: int | None, pool: str = POOL) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name},
        "spec": spec,
    }


class RouteEnv:
    def __init__(self, docs: Iterable[dict[str, Any]], endpoints: int, seed: int) -> None:
        self.config = build_config(list(docs))
        self.clock = ManualClock(1000.0)
        self.datastore = Datastore()
        self.datastore.set_endpoints(
            POOL, [EndpointSpec(f"ep-{i}", "10.0.0.1", 8000 + i) for i in range(endpoints)]
        )
        self.built = build_scheduler(
            load_preset("default"), PluginContext(self.clock, seed), REGISTRY
        )
        self.models = ModelTable(self.config)
        self.director = Director(self.datastore, self.built, self.models, self.clock, 1.0)
        self._ids = 0

    def ep(self, i: int) -> Endpoint:
        endpoint = self.datastore.pools[POOL].get(f"ep-{i}")
        assert endpoint is not None
        return endpoint

    def scrape(self, i: int, age: float = 0.0, **fields: Any) -> Endpoint:
        endpoint = self.ep(i)
        endpoint.metrics = EngineMetrics(scraped_at=self.clock.now() - age, **fields)
        endpoint.inflight.scraped()
        return endpoint

    def scrape_all(self, **fields: Any) -> None:
        for endpoint in self.datastore.pools[POOL].endpoints:
            self.scrape(int(endpoint.name.removeprefix("ep-")), **fields)

    def serve(self, i: int, base: Iterable[str] = ("base",), adapters: Iterable[str] = ()) -> None:
        self.ep(i).models = ServedModels(frozenset(base), frozenset(adapters), self.clock.now())

    def route(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        kind: RequestKind = "completions",
    ) -> Dispatch:
        headers = dict(headers or {})
        parsed = parse_request(kind, orjson.dumps(body), headers)
        self._ids += 1
        return self.director.route(parsed, f"req-{self._ids}", headers)

    def inflight(self) -> dict[str, tuple[int, int, int]]:
        return {
            e.name: (e.inflight.requests, e.inflight.prompt_tokens, e.inflight.decode_tokens)
            for e in self.datastore.all_endpoints()
        }


RouteEnvFactory = Callable[..., RouteEnv]


@pytest.fixture
def route_env() -> RouteEnvFactory:
    def make(
        docs: Iterable[dict[str, Any]] | None = None, endpoints: int = 3, seed: int = 0
    ) -> RouteEnv:
        return RouteEnv(docs if docs is not None else [_pool_doc()], endpoints, seed)

    return make


@pytest.fixture
def pool_doc() -> Callable[..., dict[str, Any]]:
    return _pool_doc


@pytest.fixture
def model_doc() -> Callable[..., dict[str, Any]]:
    return _model_doc


@pytest.fixture
def objective_doc() -> Callable[..., dict[str, Any]]:
    return _objective_doc
