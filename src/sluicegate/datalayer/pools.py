"""From configuration to endpoint set: static endpoint lists and applying them.

Discovery — the configuration file's explicit ``endpoints`` lists, or Kubernetes pods —
produces :class:`~sluicegate.datalayer.datastore.EndpointSpec` lists by pool;
:func:`sync_pools` makes a :class:`~sluicegate.datalayer.datastore.Datastore` hold exactly
those, keeping the state of endpoints that stayed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sluicegate.api.loader import Config
from sluicegate.api.resources import InferencePool
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.hardware import resolve_hardware

EndpointsByPool = Mapping[str, Iterable[EndpointSpec]]


def static_endpoints(config: Config) -> dict[str, list[EndpointSpec]]:
    """Every pool's explicit endpoint list, each named by ``name`` or by its address, with
    its hardware from its entry or the pool's ``hardware`` defaults."""
    out: dict[str, list[EndpointSpec]] = {}
    for pool_name, pool in config.pools.items():
        specs = []
        for static in pool.spec.endpoints:
            scheme = "https" if static.address.startswith("https://") else "http"
            address = static.address.removeprefix("http://").removeprefix("https://")
            host, _, port = address.rstrip("/").rpartition(":")
            specs.append(
                EndpointSpec(
                    static.name or address,
                    host.strip("[]"),
                    int(port),
                    dict(static.labels),
                    static.engine_type,
                    scheme,
                    resolve_hardware(static.accelerator, static.cost_per_hour, pool.spec.hardware),
                )
            )
        out[pool_name] = specs
    return out


def empty_pool_hint(pool: InferencePool, discovered: bool) -> str:
    """What a pool without endpoints lacks, and the fix, in a few words: its endpoints
    come from Kubernetes (``discovered``) or from its ``spec.endpoints`` list. Clients and
    the open ``/health`` are told it, so it names no label, address or other detail of
    the deployment (the start-up log line does)."""
    selects = bool(pool.spec.match_labels)
    if discovered:
        if not selects:
            return "its selector is empty, so it selects no pod"
        return "no Ready pod with an IP carries its selector's labels"
    listed = "list the model servers under spec.endpoints (address: host:port)"
    if selects:
        return (
            f"its selector is read only with --kubernetes; {listed}, "
            "or run `sluicegate extproc --kubernetes` to find pods by its selector"
        )
    return f"{listed}, or give it a selector and run `sluicegate extproc --kubernetes`"


def sync_pools(
    datastore: Datastore, config: Config, endpoints: EndpointsByPool, *, discovered: bool = False
) -> None:
    """Make ``datastore`` hold exactly the pools of ``endpoints`` and their endpoints.

    Endpoints that stay (same name, host and port) keep their state (metrics, in-flight
    counts); pools that vanished are removed. Each pool's annotations, failure mode and
    empty-pool hint come from ``config`` (``discovered``: the endpoints are Kubernetes
    pods, not the file's lists). Call it from the event loop (the datastore is
    single-threaded).
    """
    for name in list(datastore.pools):
        if name not in endpoints:
            datastore.remove_pool(name)
    for name, specs in endpoints.items():
        datastore.set_endpoints(name, specs)
        resource = config.pools.get(name)
        if resource is not None:
            pool = datastore.pools[name]
            pool.annotations = dict(resource.metadata.annotations)
            pool.failure_mode = resource.spec.failure_mode
            pool.empty_hint = empty_pool_hint(resource, discovered)
