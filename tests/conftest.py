"""Fixtures shared by the whole test suite.

``sim_cluster`` starts simulated vLLM servers (:class:`sluicegate.sim.server.SimCluster`) on
free ports of 127.0.0.1 and stops them when the test ends::

    async def test_something(sim_cluster: SimClusterFactory) -> None:
        cluster = await sim_cluster(replicas=2, lora={"sql-lora": "/adapters/sql"})
        url = cluster.replicas[0].url  # http://127.0.0.1:<port>
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import pytest

from sluicegate.sim.faults import Faults
from sluicegate.sim.profiles import EngineProfile, get_profile
from sluicegate.sim.server import ReplicaOptions, SimCluster


class SimClusterFactory(Protocol):
    """Signature of the ``sim_cluster`` fixture's factory."""

    async def __call__(
        self,
        replicas: int = 2,
        profile: str | EngineProfile = "tiny",
        time_scale: float = 0.1,
        lora: Mapping[str, str] | Iterable[str] | None = None,
        faults: Faults | Mapping[int, Faults] | None = None,
        **options: Any,
    ) -> SimCluster: ...


@pytest.fixture
async def sim_cluster() -> AsyncIterator[SimClusterFactory]:
    """Factory starting a :class:`SimCluster`; every cluster it made is stopped at teardown.

    ``await sim_cluster(replicas=2, profile="tiny", time_scale=0.1, lora=..., faults=...)``

    - ``profile``: a built-in profile name or an :class:`EngineProfile`;
    - ``time_scale``: wall seconds per simulated second (0.1 runs ten times faster than real
      time; use ~1.0 when a test needs requests to stay in flight for a while);
    - ``lora``: adapters loaded at start, ``{name: path}`` or just names (also enables LoRA);
    - ``faults``: one :class:`Faults` for every replica (each gets its own copy) or
      ``{replica_index: Faults}``;
    - any other keyword is a :class:`ReplicaOptions` field (``enable_lora``,
      ``legacy_metric_names``, ``enable_prefix_caching``, ``served_model_name``, ``seed``...).
    """
    clusters: list[SimCluster] = []

    async def make(
        replicas: int = 2,
        profile: str | EngineProfile = "tiny",
        time_scale: float = 0.1,
        lora: Mapping[str, str] | Iterable[str] | None = None,
        faults: Faults | Mapping[int, Faults] | None = None,
        **options: Any,
    ) -> SimCluster:
        if isinstance(profile, str):
            profile = get_profile(profile)
        if lora is None:
            loras: dict[str, str] = {}
        elif isinstance(lora, Mapping):
            loras = dict(lora)
        else:
            loras = {name: f"/adapters/{name}" for name in lora}
        if loras:
            options.setdefault("enable_lora", True)
        if isinstance(faults, Faults):
            per_replica = {i: replace(faults) for i in range(replicas)}
        else:
            per_replica = dict(faults or {})
        replica_options = ReplicaOptions(
            profile=profile, time_scale=time_scale, lora_modules=loras, **options
        )
        cluster = SimCluster(replica_options, replicas, per_replica)
        clusters.append(cluster)
        await cluster.start("127.0.0.1", 0)
        return cluster

    yield make
    for cluster in reversed(clusters):
        await cluster.stop()
