"""What measured capacity keeps per endpoint: the previous scrape of each, released when
the endpoint leaves the pool (the capacity-aware scorers are endpoint observers the
director tells) and bounded, least recently scraped dropped first."""

from __future__ import annotations

import pytest

from sluicegate.api.loader import build_config
from sluicegate.api.picker import EndpointPickerConfig
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, Hardware
from sluicegate.framework import EndpointObserver, PluginContext
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.scheduling import capacity
from sluicegate.scheduling.capacity import ClassCapacity
from sluicegate.scheduling.config import build_scheduler

REGISTRY = default_registry()
H100 = "h100-80gb"
SCORERS = [
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "active-request-scorer",
    "latency-scorer",
    "cost-aware-scorer",
]


def scraped(e: Endpoint, t: float, waiting: int = 4) -> Endpoint:
    e.metrics = EngineMetrics(t, waiting=waiting, generation_tokens=1000.0 * t)
    return e


def test_the_director_releases_a_removed_endpoints_scrape() -> None:
    config = EndpointPickerConfig.model_validate(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [
                {"type": t, "name": t, "parameters": {"capacityNormalization": "measured"}}
                for t in SCORERS
            ],
            "schedulingProfiles": [
                {"name": "default", "plugins": [{"pluginRef": t} for t in SCORERS]}
            ],
        }
    )
    clock = ManualClock(0.0)
    built = build_scheduler(config, PluginContext(clock, 0), REGISTRY)
    scorers = [built.plugins[t] for t in SCORERS]
    assert all(isinstance(s, EndpointObserver) for s in scorers)
    assert all(s in built.observers for s in scorers)
    datastore = Datastore()
    specs = [EndpointSpec(f"ep-{i}", "10.0.0.1", 8000 + i) for i in range(3)]
    datastore.set_endpoints("pool", specs)
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {"targetPorts": [{"number": 8000}]},
    }
    Director(datastore, built, ModelTable(build_config([pool])), clock, 1.0)
    endpoints = datastore.all_endpoints()
    for e in endpoints:
        e.hardware = Hardware(H100, None)
        scraped(e, 1.0)
    for s in scorers:
        s.capacity.capacities(endpoints)
        assert s.capacity.endpoints_kept == 3
    datastore.set_endpoints("pool", specs[1:])  # ep-0 leaves
    for s in scorers:
        assert s.capacity.endpoints_kept == 2, s.type_name
    datastore.remove_pool("pool")
    assert [s.capacity.endpoints_kept for s in scorers] == [0] * len(scorers)


def test_beyond_the_bound_the_least_recently_scraped_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "MAX_ENDPOINTS", 3)
    state = ClassCapacity("measured", {})
    pool = [Endpoint(name=f"ep-{i}", host="10.0.0.1", port=8000 + i) for i in range(4)]
    for e in pool:
        e.hardware = Hardware(H100, None)
    state.capacities([scraped(e, 1.0) for e in pool[:3]])
    state.capacities([scraped(pool[0], 2.0)])  # ep-0 scraped again: now the most recent
    state.capacities([scraped(pool[3], 2.0)])  # a fourth: ep-1, the least recent, goes
    assert state.endpoints_kept == 3
    # ep-0 and ep-2 kept their previous scrape: their next saturated scrape measures.
    state.capacities([scraped(pool[0], 3.0), scraped(pool[2], 3.0)])
    assert state.measured == {H100: pytest.approx(1000.0)}
    assert state.endpoints_kept == 3
    state.forget("ep-0")
    state.forget("never-seen")  # unknown: nothing to do
    assert state.endpoints_kept == 2
