"""Kubernetes discovery: watch pools, models, objectives, rewrites and pods; report changes.

:class:`KubernetesDiscovery` runs one :class:`~sluicegate.k8s.reflector.Reflector` per
collection (InferencePool v1 and v1alpha2, InferenceModel v1alpha2, InferenceObjective
v1alpha2, InferenceModelRewrite v1alpha2, Pod v1) in one namespace. After each burst of
changes (events closer together than ``debounce_s`` are coalesced) it assembles a
:class:`Snapshot` — a :class:`~sluicegate.api.loader.Config`, every pool's endpoints and
the problems found — and, if the Config or the endpoints differ from the last ones
delivered, calls ``on_change(config, endpoints_by_pool)``. Nothing is delivered before
every collection has been listed once (or found unavailable), so the first call already
carries the complete state.

Typical use (what ``sluicegate extproc --kubernetes`` does)::

    api = await load_api_client()
    discovery = KubernetesDiscovery(api, namespace, pool_name="llama3-8b",
                                    on_change=apply, base=file_config)
    await discovery.start()
    async with asyncio.timeout(30):
        await discovery.wait_synced()
    ...
    await discovery.stop()
    await api.close()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiClient

from sluicegate.api.loader import Config
from sluicegate.datalayer.datastore import EndpointSpec
from sluicegate.k8s.assemble import assemble
from sluicegate.k8s.kinds import (
    MODELS_V1ALPHA2,
    OBJECTIVES_V1ALPHA2,
    PODS,
    POOLS_V1,
    POOLS_V1ALPHA2,
    REWRITES_V1ALPHA2,
    ResourceKind,
)
from sluicegate.k8s.objects import CustomObject, PodInfo, project_custom, project_pod
from sluicegate.k8s.reflector import Reflector, ReflectorSettings

log = logging.getLogger("sluicegate.k8s")

EndpointsByPool = dict[str, list[EndpointSpec]]
OnChange = Callable[[Config, EndpointsByPool], Awaitable[None] | None]
"""``on_change(config, endpoints_by_pool)``; may be a plain function or a coroutine function."""


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """How the discovery watches and reports. Durations in seconds."""

    debounce_s: float = 0.1
    """Changes arriving within this window after the first one are delivered together."""
    max_problems: int = 100
    """Problems kept in :attr:`Snapshot.problems` (the rest are counted)."""
    reflector: ReflectorSettings = field(default_factory=ReflectorSettings)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One assembled state of the namespace."""

    config: Config
    endpoints: EndpointsByPool
    problems: tuple[str, ...]


class KubernetesDiscovery:
    """Watches one namespace (optionally one named InferencePool) and reports changes.

    ``api`` is a kubernetes-asyncio ``ApiClient``; the caller owns it (and closes it after
    :meth:`stop`). ``base`` supplies the EndpointPickerConfig and GatewayConfig of the
    emitted Config (pools, models, objectives and rewrites in ``base`` are not used: in Kubernetes
    they come from the API server).
    """

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        pool_name: str | None = None,
        on_change: OnChange | None = None,
        *,
        base: Config | None = None,
        settings: DiscoverySettings | None = None,
        seed: int | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.pool_name = pool_name
        self.on_change = on_change
        self.base = base
        self.settings = settings or DiscoverySettings()
        if base is not None and (base.pools or base.models or base.objectives or base.rewrites):
            log.warning(
                "kubernetes discovery: the pools, models, objectives and rewrites of the "
                "configuration file are ignored; they are read from the API server"
            )
        rng = random.Random(seed)
        rs = self.settings.reflector

        def custom(kind: ResourceKind) -> Reflector[CustomObject]:
            return Reflector(
                api,
                kind,
                namespace,
                lambda raw: project_custom(raw, kind),
                self._changed,
                rs,
                random.Random(rng.random()),
            )

        self.pools_v1 = custom(POOLS_V1)
        self.pools_v1alpha2 = custom(POOLS_V1ALPHA2)
        self.models = custom(MODELS_V1ALPHA2)
        self.objectives = custom(OBJECTIVES_V1ALPHA2)
        self.rewrites = custom(REWRITES_V1ALPHA2)
        self.pods: Reflector[PodInfo] = Reflector(
            api, PODS, namespace, project_pod, self._changed, rs, random.Random(rng.random())
        )
        self._dirty = asyncio.Event()
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._snapshot: Snapshot | None = None
        self._delivered: tuple[Config, Any] | None = None
        self.deliveries = 0
        """How many times ``on_change`` was called."""

    # ------------------------------------------------------------------ public API

    @property
    def reflectors(self) -> tuple[Reflector[Any], ...]:
        return (
            self.pools_v1,
            self.pools_v1alpha2,
            self.models,
            self.objectives,
            self.rewrites,
            self.pods,
        )

    @property
    def synced(self) -> bool:
        """Every collection has been listed (or found unavailable) at least once."""
        return all(r.synced for r in self.reflectors)

    @property
    def ready(self) -> bool:
        """Synced, and the ``pool_name`` pool (if one was given) exists and is valid: what
        the endpoint picker's readiness should report."""
        snapshot = self._snapshot
        if snapshot is None:
            return False
        return self.pool_name is None or self.pool_name in snapshot.config.pools

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    @property
    def snapshot(self) -> Snapshot | None:
        """The last assembled state (None before the first sync)."""
        return self._snapshot

    @property
    def problems(self) -> list[str]:
        """Invalid objects, unreadable collections and similar, as of the last assembly."""
        return list(self._snapshot.problems) if self._snapshot else []

    async def start(self) -> None:
        """Start watching (returns at once; see :meth:`wait_synced`)."""
        if self._tasks:
            return
        for reflector in self.reflectors:
            name = f"sluicegate-k8s-{reflector.kind.key}"
            self._tasks.append(asyncio.create_task(reflector.run(), name=name))
        self._tasks.append(asyncio.create_task(self._emit_loop(), name="sluicegate-k8s-emit"))

    async def wait_synced(self) -> Snapshot:
        """Wait for the first complete snapshot (bound it with ``asyncio.timeout``)."""
        await self._synced.wait()
        assert self._snapshot is not None
        return self._snapshot

    async def stop(self) -> None:
        """Cancel every task and wait for them; in-flight requests are closed."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, Exception):  # pragma: no cover - the loops never raise
                log.error("kubernetes discovery: task %s failed: %r", task.get_name(), result)

    def assemble(self) -> Snapshot:
        """Assemble the current state now (also used by the emit loop)."""
        result = assemble(
            self.namespace,
            [*self.pools_v1.store.values(), *self.pools_v1alpha2.store.values()],
            self.models.store.values(),
            self.objectives.store.values(),
            self.pods.store.values(),
            pool_name=self.pool_name,
            base=self.base,
            rewrites=self.rewrites.store.values(),
        )
        problems = [r.unavailable for r in self.reflectors if r.unavailable]
        for r in self.reflectors:
            if r.overflow:
                problems.append(
                    f"{r.kind} in namespace {self.namespace}: more than "
                    f"{r.settings.max_objects} objects; {r.overflow} ignored"
                )
        problems.extend(result.problems)
        limit = self.settings.max_problems
        if len(problems) > limit:
            problems = [*problems[:limit], f"... and {len(problems) - limit} more"]
        if self.pool_name is not None and self.pool_name not in result.config.pools:
            problems.insert(
                0, f"InferencePool {self.namespace}/{self.pool_name}: not found or invalid"
            )
        return Snapshot(result.config, result.endpoints, tuple(problems))

    # ------------------------------------------------------------------ internals

    def _changed(self) -> None:
        self._dirty.set()

    async def _emit_loop(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.debounce_s)
            self._dirty.clear()
            if not self.synced:
                continue
            try:
                snapshot = self.assemble()
            except Exception:  # a bug; keep the last good state
                log.exception("kubernetes discovery: assembling the state failed")
                continue
            self._log_new_problems(snapshot)
            self._snapshot = snapshot
            first = not self._synced.is_set()
            self._synced.set()
            current = (snapshot.config, _fingerprint(snapshot.endpoints))
            if not first and current == self._delivered:
                continue
            self._delivered = current
            await self._deliver(snapshot)

    def _log_new_problems(self, snapshot: Snapshot) -> None:
        old = set(self._snapshot.problems) if self._snapshot else set()
        for problem in snapshot.problems:
            if problem not in old:
                log.warning("kubernetes discovery: %s", problem)

    async def _deliver(self, snapshot: Snapshot) -> None:
        if self.on_change is None:
            return
        self.deliveries += 1
        try:
            result = self.on_change(snapshot.config, snapshot.endpoints)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("kubernetes discovery: on_change failed")


def _fingerprint(endpoints: EndpointsByPool) -> Any:
    """Everything about the endpoints a consumer sees (``EndpointSpec`` equality ignores
    labels; a label change must still be delivered)."""
    return {
        pool: [
            (e.name, e.host, e.port, sorted(e.labels.items()), e.engine_type, e.scheme)
            for e in specs
        ]
        for pool, specs in endpoints.items()
    }


def endpoints_by_pool(snapshot: Snapshot) -> Mapping[str, list[str]]:
    """``{pool: [endpoint name, ...]}``: a compact view for logs and tests."""
    return {pool: [e.name for e in specs] for pool, specs in snapshot.endpoints.items()}
