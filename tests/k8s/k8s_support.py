"""Helpers shared by the Kubernetes discovery tests (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluicegate.api.loader import Config
from sluicegate.datalayer.datastore import EndpointSpec
from sluicegate.k8s import KubernetesDiscovery, ReflectorSettings

WAIT_S = 10.0
"""Upper bound of every wait: tests wait for a condition, never for a fixed time."""

FAST = ReflectorSettings(
    watch_timeout_s=30.0,
    initial_backoff_s=0.02,
    max_backoff_s=0.2,
    unavailable_retry_s=0.2,
    min_watch_s=0.0,
    connect_timeout_s=2.0,
    list_timeout_s=5.0,
)


@dataclass
class Delivery:
    config: Config
    endpoints: dict[str, list[EndpointSpec]]

    def names(self, pool: str) -> list[str]:
        return [e.name for e in self.endpoints.get(pool, [])]


@dataclass
class Recorder:
    """The ``on_change`` callback: records every delivery and wakes waiters."""

    deliveries: list[Delivery] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, config: Config, endpoints: dict[str, list[EndpointSpec]]) -> None:
        self.deliveries.append(Delivery(config, endpoints))
        self.changed.set()

    @property
    def last(self) -> Delivery:
        assert self.deliveries, "nothing delivered yet"
        return self.deliveries[-1]

    async def wait_for(self, predicate: Callable[[Delivery], bool]) -> Delivery:
        """The first delivery (the latest one, or a later one) satisfying ``predicate``."""
        async with asyncio.timeout(WAIT_S):
            while True:
                if self.deliveries and predicate(self.deliveries[-1]):
                    return self.deliveries[-1]
                self.changed.clear()
                await self.changed.wait()


class DiscoveryFactory(Protocol):
    async def __call__(
        self,
        pool_name: str | None = None,
        *,
        debounce_s: float = 0.02,
        base: Config | None = None,
        wait: bool = True,
        **reflector: Any,
    ) -> tuple[KubernetesDiscovery, Recorder]: ...
