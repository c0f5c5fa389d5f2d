"""The ``gie-v0.3`` preset: Gateway API Inference Extension v0.3.0's filter tree as data.

Each case is a hand-built fleet state whose expected survivors were worked out by hand
from pkg/epp/scheduling/filter.go at tag v0.3.0 (the comments show the arithmetic); the
random pick must land on every survivor and nowhere else.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sched_support import REGISTRY, new_endpoint, new_request

from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, Filter, LLMRequest, PluginContext, SchedulingError
from sluicegate.framework.plugin import PluginConfigError
from sluicegate.scheduling.config import BuiltScheduler, build_scheduler, load_preset

CRITICAL, STANDARD, SHEDDABLE = 100, 0, -10


def built(seed: int = 0) -> BuiltScheduler:
    return build_scheduler(load_preset("gie-v0.3"), PluginContext(ManualClock(), seed), REGISTRY)


def fleet(*states: dict[str, Any]) -> list[Endpoint]:
    return [new_endpoint(i, **state) for i, state in enumerate(states)]


def survivors(endpoints: list[Endpoint], request: LLMRequest, seed: int = 0) -> list[str]:
    tree = built(seed).plugins["v03-filter-tree"]
    assert isinstance(tree, Filter)
    return [e.name for e in tree.filter(request, CycleState(), endpoints)]


def picks(endpoints: list[Endpoint], request: LLMRequest, n: int = 200) -> Counter[str]:
    scheduler = built().scheduler
    return Counter(
        scheduler.schedule(request, CycleState(), endpoints).targets[0].name for _ in range(n)
    )


def test_critical_low_queue_goes_least_queue_then_least_kv_then_random() -> None:
    # LoRA off (max_lora 0): the affinity node fails and passes its input on.
    # queues 1, 2, 2, 9 (n = 4): keep q ≤ 1 + (9 − 1) // 4 = 3 → ep-0..2;
    # their KV .5, .2, .3: keep kv ≤ .2 + (.5 − .2) / 3 = .3 → ep-1, ep-2.
    endpoints = fleet(
        {"waiting": 1, "kv_usage": 0.5},
        {"waiting": 2, "kv_usage": 0.2},
        {"waiting": 2, "kv_usage": 0.3},
        {"waiting": 9, "kv_usage": 0.0},
    )
    request = new_request(priority=CRITICAL)
    assert survivors(endpoints, request) == ["ep-1", "ep-2"]
    chosen = picks(endpoints, request)
    assert set(chosen) == {"ep-1", "ep-2"}
    assert min(chosen.values()) > 60  # uniform between the two: ~100 each of 200


def test_the_queue_band_uses_integer_division_as_the_source() -> None:
    # queues 3, 4 (n = 2): 3 + (4 − 3) // 2 = 3 → only ep-0, although the KV says ep-1.
    endpoints = fleet({"waiting": 3, "kv_usage": 0.9}, {"waiting": 4, "kv_usage": 0.1})
    assert survivors(endpoints, new_request(priority=CRITICAL)) == ["ep-0"]


def test_critical_when_every_queue_is_long_still_picks_the_least_queued() -> None:
    # No queue < 128: the low-queueing node fails, the whole fleet goes to least queue:
    # 130, 200, 400 (n = 3) → q ≤ 130 + 270 // 3 = 220 → ep-0, ep-1; KV .7, .9 (n = 2)
    # → kv ≤ .7 + .2 / 2 = .8 → ep-0.
    endpoints = fleet(
        {"waiting": 130, "kv_usage": 0.7},
        {"waiting": 200, "kv_usage": 0.9},
        {"waiting": 400, "kv_usage": 0.1},
    )
    assert survivors(endpoints, new_request(priority=CRITICAL)) == ["ep-0"]


def test_low_queueing_keeps_only_short_queues_before_the_bands() -> None:
    # ep-2's queue of 128 fails < 128; of ep-0, ep-1 (queues 0, 100: 0 + 100 // 2 = 50)
    # only ep-0 stays, though ep-2's KV is the lowest.
    endpoints = fleet(
        {"waiting": 0, "kv_usage": 0.6},
        {"waiting": 100, "kv_usage": 0.1},
        {"waiting": 128, "kv_usage": 0.0},
    )
    assert survivors(endpoints, new_request(priority=CRITICAL)) == ["ep-0"]


def test_non_critical_requests_go_to_endpoints_with_room_or_are_dropped() -> None:
    # Standard is not Critical in v0.3.0: room means queue ≤ 5 and KV ≤ 0.8 → ep-1, ep-2;
    # least queue over them: 3, 4 → 3 + 1 // 2 = 3 → ep-1 (ep-3, idle in queue, has KV .95).
    endpoints = fleet(
        {"waiting": 9, "kv_usage": 0.1},
        {"waiting": 3, "kv_usage": 0.5},
        {"waiting": 4, "kv_usage": 0.8},
        {"waiting": 0, "kv_usage": 0.95},
    )
    for priority in (STANDARD, SHEDDABLE):
        assert survivors(endpoints, new_request(priority=priority)) == ["ep-1"]
    full = fleet({"waiting": 6, "kv_usage": 0.1}, {"waiting": 0, "kv_usage": 0.81})
    assert survivors(full, new_request(priority=STANDARD)) == []
    with pytest.raises(SchedulingError):
        built().scheduler.schedule(new_request(priority=STANDARD), CycleState(), full)
    # The same fleet serves a Critical request (least queue: 0 + 6 // 2 = 3 → ep-1).
    assert survivors(full, new_request(priority=CRITICAL)) == ["ep-1"]


def test_lora_affinity_prefers_the_endpoint_running_the_adapter() -> None:
    # ep-0 runs the adapter, ep-1 has a free slot, ep-2's slots are all taken by others.
    lora: dict[str, Any] = {"max_loras": 2, "waiting": 1, "kv_usage": 0.5}
    endpoints = fleet(
        {**lora, "running_loras": frozenset({"sql"})},
        {**lora, "running_loras": frozenset({"chat"})},
        {**lora, "running_loras": frozenset({"chat", "poem"})},
    )
    request = new_request(priority=CRITICAL, target_model="sql", is_adapter=True)
    # Affinity wins with probability 0.999; over 50 seeds every draw is ep-0's group.
    assert all(survivors(endpoints, request, seed) == ["ep-0"] for seed in range(50))
    # An adapter no one runs: the endpoints with a free slot (ep-0, ep-1), never ep-2.
    other = new_request(priority=CRITICAL, target_model="new", is_adapter=True)
    assert survivors(endpoints, other) == ["ep-0", "ep-1"]


def test_a_zero_affinity_threshold_always_takes_the_available_group(
    ctx: PluginContext,
) -> None:
    plugin = REGISTRY.create("lora-soft-affinity-filter", "f", {"affinityThreshold": 0.0}, ctx)
    assert isinstance(plugin, Filter)
    endpoints = fleet(
        {"max_loras": 2, "running_loras": frozenset({"sql"})},
        {"max_loras": 2},
        {"max_loras": 1, "waiting_loras": frozenset({"x"})},
    )
    request = new_request(target_model="sql", is_adapter=True)
    assert [e.name for e in plugin.filter(request, CycleState(), endpoints)] == ["ep-1"]
    # Neither group: the filter fails (nothing kept).
    assert plugin.filter(request, CycleState(), fleet({}, {})) == []


def tree_config(tree: dict[str, Any], extra: list[dict[str, Any]]) -> EndpointPickerConfig:
    return EndpointPickerConfig.model_validate(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [
                *extra,
                {"name": "tree", "type": "decision-tree-filter", "parameters": {"tree": tree}},
            ],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "tree"}]}],
        }
    )


def test_a_tree_names_only_filters_declared_before_it(ctx: PluginContext) -> None:
    with pytest.raises(PluginConfigError, match="'missing' is not a filter plugin declared"):
        build_scheduler(tree_config({"filter": "missing"}, []), ctx, REGISTRY)
    scorer = [{"name": "q", "type": "queue-scorer"}]
    with pytest.raises(PluginConfigError, match="'q' is not a filter plugin"):
        build_scheduler(tree_config({"filter": "q"}, scorer), ctx, REGISTRY)
    with pytest.raises(PluginConfigError, match="nextOnSucess"):
        build_scheduler(tree_config({"filter": "q", "nextOnSucess": {}}, scorer), ctx, REGISTRY)


def test_a_failed_node_hands_its_input_to_the_failure_branch(ctx: PluginContext) -> None:
    # short-queue fails on both (queues 9, 10), so kv-room sees both again and keeps ep-1.
    extra = [
        {"name": "short", "type": "load-threshold-filter", "parameters": {"maxWaitingQueue": 2}},
        {"name": "room", "type": "load-threshold-filter", "parameters": {"maxKvCacheUsage": 0.5}},
    ]
    tree = {
        "filter": "short",
        "nextOnSuccess": {"filter": "room"},
        "nextOnFailure": {"filter": "room"},
    }
    scheduler = build_scheduler(tree_config(tree, extra), ctx, REGISTRY)
    endpoints = fleet({"waiting": 9, "kv_usage": 0.9}, {"waiting": 10, "kv_usage": 0.4})
    result = scheduler.scheduler.schedule(new_request(), CycleState(), endpoints)
    assert result.targets[0].name == "ep-1"
