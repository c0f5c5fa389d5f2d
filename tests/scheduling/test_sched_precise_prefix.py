"""The precise prefix-cache producer against a hand-filled precise index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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
    extra_key_bytes,
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
from sluicegate.scheduling.config import build_scheduler, load_preset
from sluicegate.scheduling.plugins.precise_prefix_cache import PrecisePrefixCacheProducer
from sluicegate.tokens import token_ids

REGISTRY = default_registry()
BS = 16
PROMPT = "".join(chr(97 + (i * 7) % 26) for i in range(BS * 4 * 8))  # 8 blocks of 16 tokens


def new_endpoint(i: int) -> Endpoint:
    return Endpoint(f"ep-{i}", "10.0.0.1", 8000 + i, metrics=EngineMetrics(scraped_at=0.0))


def new_request(prompt: str, **fields: Any) -> LLMRequest:
    data = prompt.encode()
    return LLMRequest(
        "r", "base", str(fields.pop("target_model", "base")), data, len(data) // 4, 0.0, **fields
    )


@pytest.fixture
async def service() -> AsyncIterator[KVEventsService]:
    subs = KVEventSubscribers(PreciseIndex(default_capacity=1000), clock=ManualClock())
    svc = KVEventsService({"default": subs})
    yield svc
    await subs.close()


def _producer(service: KVEventsService | None, **params: object) -> PrecisePrefixCacheProducer:
    services = {} if service is None else {KV_EVENTS_SERVICE: service}
    ctx = PluginContext(ManualClock(), services=services)
    plugin = REGISTRY.create("precise-prefix-cache-producer", "precise", params, ctx)
    assert isinstance(plugin, PrecisePrefixCacheProducer)
    return plugin


def _hold(
    service: KVEventsService,
    name: str,
    text: str,
    blocks: int,
    *,
    view: View = View.SYNCED,
    extras: tuple[bytes | None, ...] | None = None,
) -> None:
    """``name`` holds the first ``blocks`` blocks of ``text`` as its events would say."""
    subs = service.pools["default"]
    subs.streams[name] = EndpointStream(view=view)
    ids = token_ids(text.encode())[: blocks * BS]
    subs.index.store(
        name,
        BlockStored(tuple(range(1, blocks + 1)), None, ids, BS, extra_keys=extras),
    )


def _run(
    plugin: PrecisePrefixCacheProducer, endpoints: list[Endpoint], **fields: Any
) -> tuple[CycleState, dict[str, int]]:
    state = CycleState()
    request = new_request(PROMPT, **fields)
    plugin.produce(request, state, endpoints)
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.block_tokens == BS
    assert match.total_blocks == 8
    return state, match.matched_blocks


def _decide(
    plugin: PrecisePrefixCacheProducer, state: CycleState, target: Endpoint, **fields: Any
) -> None:
    result = SchedulingResult({"default": ProfileResult([target])}, "default")
    plugin.pre_request(new_request(PROMPT, **fields), state, result)


async def test_endpoint_holding_the_prefix_wins(service: KVEventsService) -> None:
    eps = [new_endpoint(i) for i in range(3)]
    _hold(service, "ep-0", PROMPT, 2)
    _hold(service, "ep-1", PROMPT, 6)
    service.pools["default"].streams["ep-2"] = EndpointStream(view=View.SYNCED)
    plugin = _producer(service)
    _, matched = _run(plugin, eps)
    assert matched == {"ep-0": 2, "ep-1": 6}
    assert service.lookups.requests == 1
    assert (service.lookups.hit_blocks, service.lookups.miss_blocks) == (6, 2)
    # another prompt sharing nothing: no match anywhere
    state = CycleState()
    plugin.produce(new_request("z" * 1024), state, eps)
    other = state.get(PREFIX_MATCH)
    assert other is not None
    assert other.matched_blocks == {}


async def test_lora_and_cache_salt_are_part_of_the_key(service: KVEventsService) -> None:
    eps = [new_endpoint(0), new_endpoint(1)]
    lora = extra_key_bytes(("food-v1",))
    first = extra_key_bytes(("food-v1", "s3cret"))
    _hold(service, "ep-0", PROMPT, 3, extras=(first, lora, lora))
    _hold(service, "ep-1", PROMPT, 3)  # the base model's blocks
    plugin = _producer(service)
    _, adapter = _run(plugin, eps, target_model="food-v1", is_adapter=True, cache_salt="s3cret")
    assert adapter == {"ep-0": 3}
    _, base = _run(plugin, eps)
    assert base == {"ep-1": 3}
    _, unsalted = _run(plugin, eps, target_model="food-v1", is_adapter=True)
    assert unsalted == {}


async def test_unknown_view_falls_back_to_the_approximate_match(
    service: KVEventsService,
) -> None:
    eps = [new_endpoint(0), new_endpoint(1)]
    _hold(service, "ep-0", PROMPT, 2)
    # ep-1's stream lost batches: its index entries are not to be believed
    _hold(service, "ep-1", PROMPT, 8, view=View.UNKNOWN)
    plugin = _producer(service)
    state, matched = _run(plugin, eps)
    assert matched == {"ep-0": 2}  # ep-1: the approximate index knows nothing yet
    _decide(plugin, state, eps[1])  # the approximate index learns the decision
    _, matched = _run(plugin, eps)
    # the whole prompt (2 approximate 64-token blocks) converted to 16-token blocks
    assert matched == {"ep-0": 2, "ep-1": 8}
    assert service.lookups.fallbacks == 2


async def test_without_the_service_every_endpoint_is_approximate() -> None:
    plugin = _producer(None)
    eps = [new_endpoint(0), new_endpoint(1)]
    state = CycleState()
    plugin.produce(new_request(PROMPT), state, eps)
    _decide(plugin, state, eps[0])
    state = CycleState()
    plugin.produce(new_request(PROMPT), state, eps)
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.block_tokens == 64
    assert match.matched_blocks["ep-0"] == 2
    assert plugin.indexed_blocks() == 2


def test_a_wrong_service_is_refused() -> None:
    ctx = PluginContext(ManualClock(), services={KV_EVENTS_SERVICE: object()})
    with pytest.raises(PluginConfigError, match="KVEventsService"):
        REGISTRY.create("precise-prefix-cache-producer", "p", None, ctx)


def test_preset_uses_the_precise_producer_instead_of_the_approximate() -> None:
    built = build_scheduler(load_preset("precise-prefix"), PluginContext(ManualClock()), REGISTRY)
    producers = [type(p).type_name for p in built.plugins.values()]
    assert "precise-prefix-cache-producer" in producers
    assert "approx-prefix-cache-producer" not in producers


async def test_the_approximate_index_learns_only_when_a_view_is_unknown(
    service: KVEventsService,
) -> None:
    """Every candidate synced: nothing is learned (unless asked); one unknown: learned."""
    eps = [new_endpoint(0), new_endpoint(1)]
    _hold(service, "ep-0", PROMPT, 2)
    _hold(service, "ep-1", PROMPT, 2)
    plugin = _producer(service)
    state, _ = _run(plugin, eps)
    _decide(plugin, state, eps[1])
    assert plugin.indexed_blocks() == 0
    learning = _producer(service, approximateLearnsWhenSynced=True)
    state, _ = _run(learning, eps)
    _decide(learning, state, eps[1])
    assert learning.indexed_blocks() == 2
    _hold(service, "ep-1", PROMPT, 8, view=View.UNKNOWN)
    state, _ = _run(plugin, eps)
    _decide(plugin, state, eps[1])
    assert plugin.indexed_blocks() == 2
    _, matched = _run(plugin, eps)
    assert matched == {"ep-0": 2, "ep-1": 8}
