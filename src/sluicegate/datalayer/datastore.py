"""The endpoint set: pools and their endpoints, as discovery reports them.

Discovery (a config file, Kubernetes) calls :meth:`Datastore.set_endpoints` with the full
list for a pool; the datastore keeps endpoints that stayed (and their state), adds new
ones and removes the rest, telling listeners so scrapers start and stop and plugins drop
state kept for departed endpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sluicegate.datalayer.endpoint import Endpoint, Hardware


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """What discovery knows of an endpoint: identity and labels, no state."""

    name: str
    host: str
    port: int
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    engine_type: str = "vllm"
    scheme: str = "http"
    hardware: Hardware = field(default_factory=Hardware)


Listener = Callable[[Endpoint], None]


@dataclass(slots=True)
class Pool:
    name: str
    endpoints: list[Endpoint] = field(default_factory=list)
    failure_mode: str = "FailClose"
    annotations: dict[str, str] = field(default_factory=dict)
    empty_hint: str = "no endpoint has been discovered for it"
    """Why the pool may have no endpoints and what fixes it (for the 503 it answers then)."""

    def get(self, name: str) -> Endpoint | None:
        for e in self.endpoints:
            if e.name == name:
                return e
        return None

    def by_address(self, address: str) -> Endpoint | None:
        for e in self.endpoints:
            if e.address == address:
                return e
        return None


class Datastore:
    """Pools by name. Single-threaded: call from the event loop only."""

    def __init__(self) -> None:
        self.pools: dict[str, Pool] = {}
        self._on_added: list[Listener] = []
        self._on_removed: list[Listener] = []
        self._next_index = 0

    def on_added(self, listener: Listener) -> None:
        self._on_added.append(listener)

    def on_removed(self, listener: Listener) -> None:
        self._on_removed.append(listener)

    def pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            pool = self.pools[name] = Pool(name)
        return pool

    def all_endpoints(self) -> list[Endpoint]:
        return [e for p in self.pools.values() for e in p.endpoints]

    def set_endpoints(self, pool_name: str, specs: Iterable[EndpointSpec]) -> None:
        """Make ``pool_name`` hold exactly ``specs`` (matched by name and address)."""
        pool = self.pool(pool_name)
        wanted = {(s.name, s.host, s.port): s for s in specs}
        kept: list[Endpoint] = []
        removed: list[Endpoint] = []
        for e in pool.endpoints:
            spec = wanted.pop((e.name, e.host, e.port), None)
            if spec is None:
                removed.append(e)
            else:
                e.labels = dict(spec.labels)
                e.engine_type = spec.engine_type
                e.hardware = spec.hardware
                kept.append(e)
        added = []
        for spec in wanted.values():
            e = Endpoint(
                scheme=spec.scheme,
                name=spec.name,
                host=spec.host,
                port=spec.port,
                pool=pool_name,
                labels=dict(spec.labels),
                engine_type=spec.engine_type,
                hardware=spec.hardware,
                index=self._next_index,
            )
            self._next_index += 1
            added.append(e)
        pool.endpoints = kept + added
        for e in removed:
            for listener in self._on_removed:
                listener(e)
        for e in added:
            for listener in self._on_added:
                listener(e)

    def remove_pool(self, pool_name: str) -> None:
        self.set_endpoints(pool_name, [])
        self.pools.pop(pool_name, None)
