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
from sluicegate.scheduling.capacity import CapacityScorer, ClassCapacity
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
    # One shared piece sets capacity up and releases it: every such scorer is one.
    assert all(isinstance(s, CapacityScorer) for s in scorers)
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
        assert len(s.capacity.endpoints_kept) == 3
    datastore.set_endpoints("pool", specs[1:])  # ep-0 leaves
    for s in scorers:
        assert names(s.capacity) == ["ep-1", "ep-2"], s.type_name
    datastore.remove_pool("pool")
    assert [s.capacity.endpoints_kept for s in scorers] == [[]] * len(scorers)


def names(state: ClassCapacity) -> list[str]:
    """The names of the endpoints ``state`` keeps a scrape of, least recent first."""
    return [name for _, name, _ in state.endpoints_kept]


def test_beyond_the_bound_the_least_recently_scraped_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capacity, "MAX_ENDPOINTS", 3)
    state = ClassCapacity("measured", {})
    pool = [Endpoint(name=f"ep-{i}", host="10.0.0.1", port=8000 + i) for i in range(4)]
    for e in pool:
        e.hardware = Hardware(H100, None)
    state.capacities([scraped(e, 1.0, waiting=0) for e in pool[:3]])  # not saturated
    assert names(state) == ["ep-0", "ep-1", "ep-2"]
    state.capacities([scraped(pool[0], 2.0, waiting=0)])  # ep-0 again: now the most recent
    assert names(state) == ["ep-1", "ep-2", "ep-0"]
    state.capacities([scraped(pool[3], 2.0)])  # a fourth: ep-1, the least recent, goes
    assert names(state) == ["ep-2", "ep-0", "ep-3"]
    # ep-1 lost its previous scrape: its next saturated one measures nothing.
    state.capacities([scraped(pool[1], 3.0)])
    assert state.measured == {}
    assert names(state) == ["ep-0", "ep-3", "ep-1"]  # ep-2 went to make room
    # ep-3 kept its previous (saturated) scrape: its next measures 1000 tokens/s.
    state.capacities([scraped(pool[3], 3.0)])
    assert state.measured == {H100: pytest.approx(1000.0)}
    state.forget(pool[0])
    state.forget(Endpoint(name="never-seen", host="10.0.0.9", port=1))  # nothing to do
    assert names(state) == ["ep-1", "ep-3"]


def test_two_pools_with_the_same_pod_keep_one_scrape_each() -> None:
    """A name is unique only within its pool: the same pod in two pools is two entries."""
    state = ClassCapacity("measured", {})
    a, b = (Endpoint(name="pod-0", host="10.0.0.1", port=8000, pool=p) for p in ("a", "b"))
    for e in (a, b):
        e.hardware = Hardware(H100, None)
    state.capacities([scraped(a, 1.0), scraped(b, 1.0)])
    assert state.endpoints_kept == [
        ("a", "pod-0", "10.0.0.1:8000"),
        ("b", "pod-0", "10.0.0.1:8000"),
    ]
    # b's scrape did not overwrite a's: a's next saturated scrape measures its own rate.
    a.metrics = EngineMetrics(2.0, waiting=4, generation_tokens=1000.0 + 500.0)
    state.capacities([a])
    assert state.measured == {H100: pytest.approx(500.0)}
    state.forget(a)  # a's pool dropped the pod; b's still has it
    assert state.endpoints_kept == [("b", "pod-0", "10.0.0.1:8000")]
