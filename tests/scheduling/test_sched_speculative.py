"""Speculative prefix entries: the store on its own, and the precise producer using it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.datalayer.kvevents import (
    KV_EVENTS_SERVICE,
    BlockStored,
    EndpointStream,
    KVEventsService,
    KVEventSubscribers,
    PreciseIndex,
    View,
)
from sluicegate.framework import (
    PREFIX_MATCH,
    CycleState,
    LLMRequest,
    PluginConfigError,
    PluginContext,
    ProfileResult,
    SchedulingResult,
)
from sluicegate.scheduling.config import load_preset
from sluicegate.scheduling.plugins.precise_prefix_cache import PrecisePrefixCacheProducer
from sluicegate.scheduling.speculative import SpeculativeEntries
from sluicegate.tokens import token_ids

REGISTRY = default_registry()
BS = 16
PROMPT = "".join(chr(97 + (i * 5) % 26) for i in range(BS * 4 * 8))  # 8 blocks of 16 tokens


# ----------------------------------------------------------------------- the store


def test_entries_extend_a_held_prefix_until_they_expire() -> None:
    spec = SpeculativeEntries(ttl_s=2.0, max_entries=100)
    keys = [11, 12, 13, 14]
    spec.insert("a", keys[:3], now=10.0)
    assert spec.extend("a", keys, 0, now=10.5) == 3
    assert spec.extend("a", keys, 1, now=10.5) == 3  # the index held the first
    assert spec.extend("a", keys, 4, now=10.5) == 4  # the index held all: nothing to add
    assert spec.extend("b", keys, 0, now=10.5) == 0  # another endpoint's
    assert spec.extend("a", [99, *keys], 0, now=10.5) == 0  # leading block unknown
    assert spec.extend("a", keys, 0, now=12.0) == 0  # TTL over
    assert len(spec) == 0
    assert (spec.inserted, spec.expired) == (3, 3)


def test_reinsertion_renews_the_ttl() -> None:
    spec = SpeculativeEntries(ttl_s=1.0, max_entries=100)
    spec.insert("a", [1, 2], now=0.0)
    spec.insert("a", [1], now=0.8)
    assert spec.extend("a", [1, 2], 0, now=1.5) == 1  # block 2 lapsed, block 1 renewed
    assert spec.extend("a", [1, 2], 0, now=1.9) == 0


def test_entries_are_bounded_oldest_first() -> None:
    spec = SpeculativeEntries(ttl_s=60.0, max_entries=1000)
    for i in range(10_000):
        spec.insert(f"ep-{i % 7}", [i * 3, i * 3 + 1, i * 3 + 2], now=i * 0.001)
        assert len(spec) <= 1000
    assert spec.extend("ep-0", [0], 0, now=10.0) == 0  # the oldest went
    last = 9_999
    assert spec.extend(f"ep-{last % 7}", [last * 3, last * 3 + 1], 0, now=10.0) == 2


def test_forget_drops_one_endpoint() -> None:
    spec = SpeculativeEntries(ttl_s=5.0, max_entries=100)
    spec.insert("a", [1, 2], now=0.0)
    spec.insert("b", [1, 2], now=0.0)
    spec.forget("a")
    assert spec.extend("a", [1, 2], 0, now=0.1) == 0
    assert spec.extend("b", [1, 2], 0, now=0.1) == 2


@pytest.mark.parametrize(("ttl", "cap"), [(0.0, 10), (-1.0, 10), (1.0, 0)])
def test_bad_settings_are_refused(ttl: float, cap: int) -> None:
    with pytest.raises(ValueError, match="speculative"):
        SpeculativeEntries(ttl, cap)


# ----------------------------------------------------------------------- the producer


@pytest.fixture
async def service() -> AsyncIterator[KVEventsService]:
    subs = KVEventSubscribers(PreciseIndex(default_capacity=1000), clock=ManualClock())
    for i in range(3):
        subs.streams[f"ep-{i}"] = EndpointStream(view=View.SYNCED)
    svc = KVEventsService({"default": subs})
    yield svc
    await subs.close()


def endpoints() -> list[Endpoint]:
    return [
        Endpoint(f"ep-{i}", "10.0.0.1", 8000 + i, metrics=EngineMetrics(scraped_at=0.0))
        for i in range(3)
    ]


def request(prompt: str = PROMPT) -> LLMRequest:
    data = prompt.encode()
    return LLMRequest("r", "base", "base", data, len(data) // 4, 0.0)


def producer(
    service: KVEventsService, clock: ManualClock, **params: object
) -> PrecisePrefixCacheProducer:
    ctx = PluginContext(clock, services={KV_EVENTS_SERVICE: service})
    plugin = REGISTRY.create("precise-prefix-cache-producer", "precise", params, ctx)
    assert isinstance(plugin, PrecisePrefixCacheProducer)
    return plugin


def decide(plugin: PrecisePrefixCacheProducer, target: Endpoint, eps: list[Endpoint]) -> None:
    state = CycleState()
    plugin.produce(request(), state, eps)
    plugin.pre_request(
        request(), state, SchedulingResult({"default": ProfileResult([target])}, "default")
    )


def matched(plugin: PrecisePrefixCacheProducer, eps: list[Endpoint]) -> dict[str, int]:
    state = CycleState()
    plugin.produce(request(), state, eps)
    match = state.get(PREFIX_MATCH)
    assert match is not None
    return match.matched_blocks


async def test_off_by_default(service: KVEventsService) -> None:
    clock = ManualClock()
    plugin = producer(service, clock)
    assert plugin.speculative is None
    eps = endpoints()
    decide(plugin, eps[1], eps)
    assert matched(plugin, eps) == {}


async def test_a_dispatch_sticks_until_the_ttl(service: KVEventsService) -> None:
    clock = ManualClock()
    plugin = producer(service, clock, speculativeIndexing=True, speculativeTtlSeconds=2.0)
    eps = endpoints()
    decide(plugin, eps[1], eps)
    clock.advance(1.0)
    assert matched(plugin, eps) == {"ep-1": 8}
    clock.advance(1.5)
    assert matched(plugin, eps) == {}


async def test_real_events_take_over(service: KVEventsService) -> None:
    clock = ManualClock()
    plugin = producer(service, clock, speculativeIndexing=True, speculativeTtlSeconds=1.0)
    eps = endpoints()
    decide(plugin, eps[2], eps)
    # the server's events arrive: it stored 5 of the 8 blocks (say, the rest is pending)
    ids = token_ids(PROMPT.encode())[: 5 * BS]
    service.pools["default"].index.store("ep-2", BlockStored((1, 2, 3, 4, 5), None, ids, BS))
    assert matched(plugin, eps) == {"ep-2": 8}  # index 5, speculation the rest
    clock.advance(1.5)
    assert matched(plugin, eps) == {"ep-2": 5}  # the guesses lapsed, the events stay


async def test_no_speculation_for_an_unknown_view(service: KVEventsService) -> None:
    clock = ManualClock()
    plugin = producer(service, clock, speculativeIndexing=True)
    service.pools["default"].streams["ep-0"] = EndpointStream(view=View.UNKNOWN)
    eps = endpoints()
    decide(plugin, eps[0], eps)
    assert plugin.speculative is not None
    assert len(plugin.speculative) == 0


async def test_forgetting_an_endpoint_drops_its_guesses(service: KVEventsService) -> None:
    clock = ManualClock()
    plugin = producer(service, clock, speculativeIndexing=True)
    eps = endpoints()
    decide(plugin, eps[1], eps)
    plugin.forget_endpoint(eps[1])
    assert matched(plugin, eps) == {}


@pytest.mark.parametrize(
    "params",
    [{"speculativeTtlSeconds": 0}, {"maxSpeculativeEntries": 0}, {"speculativeIndexing": "x"}],
)
async def test_bad_parameters_are_refused(
    service: KVEventsService, params: dict[str, object]
) -> None:
    with pytest.raises(PluginConfigError):
        producer(service, ManualClock(), **params)


def test_the_speculative_preset_turns_it_on() -> None:
    config = load_preset("precise-prefix-speculative")
    (spec,) = [p for p in config.plugins if p.type == "precise-prefix-cache-producer"]
    assert spec.parameters["speculativeIndexing"] is True


async def test_a_cold_prefix_keeps_its_approximate_affinity(service: KVEventsService) -> None:
    """No synced endpoint holds the prompt: with approximateWhenNoneHolds the endpoint it
    was last sent to keeps the match the approximate index remembers; without, none."""
    clock = ManualClock()
    eps = endpoints()
    plain = producer(service, clock)
    cold = producer(service, clock, approximateWhenNoneHolds=True)
    for plugin in (plain, cold):
        decide(plugin, eps[2], eps)  # remembered by the approximate index only
    assert matched(plain, eps) == {}
    assert matched(cold, eps) == {"ep-2": 8}
    # once an endpoint's events say it holds the prefix, the precise match alone counts
    ids = token_ids(PROMPT.encode())[: 2 * BS]
    service.pools["default"].index.store("ep-0", BlockStored((1, 2), None, ids, BS))
    assert matched(cold, eps) == {"ep-0": 2}
