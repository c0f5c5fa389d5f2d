"""The precise producer with a pool tokenizer: block keys from the model's own template and
tokenizer (``source: local``) or from the servers' ``/tokenize`` (``source: server``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from tokenizers import Tokenizer

from sluicegate.api.tokenizer import TokenizerSettings
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
    block_keys,
)
from sluicegate.framework import (
    PREFETCH_PASS,
    PREFIX_MATCH,
    AsyncDataProducer,
    CycleState,
    LLMRequest,
    PluginContext,
)
from sluicegate.scheduling.config import _fetch_order
from sluicegate.scheduling.plugins.precise_prefix_cache import PrecisePrefixCacheProducer
from sluicegate.tokenization.base import TOKENIZER_SERVICE, TokenizerService
from sluicegate.tokenization.local import LocalTokenizer
from sluicegate.tokenization.remote import ServerTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tokenization"))
from tiny_tokenizer import build

BS = 16
MESSAGES = [
    {"role": "system", "content": "Kalo mine ru sa ti vo ze pa. " * 60},
    {"role": "user", "content": "Qu de fi go ha ji, don't 12345? " * 6},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
async def kv() -> AsyncIterator[KVEventsService]:
    subs = KVEventSubscribers(PreciseIndex(default_capacity=10_000), clock=ManualClock())
    yield KVEventsService({"default": subs})
    await subs.close()


def producer(kv: KVEventsService, tokenizers: TokenizerService) -> PrecisePrefixCacheProducer:
    ctx = PluginContext(
        ManualClock(), services={KV_EVENTS_SERVICE: kv, TOKENIZER_SERVICE: tokenizers}
    )
    plugin = default_registry().create("precise-prefix-cache-producer", "p", {}, ctx)
    assert isinstance(plugin, PrecisePrefixCacheProducer)
    return plugin


def chat(messages: list[dict[str, Any]]) -> LLMRequest:
    body = {"model": "m", "messages": messages}
    return LLMRequest("r", "m", "m", b"serialised", 3, 0.0, kind="chat", body=body)


def hold(kv: KVEventsService, name: str, ids: list[int], blocks: int) -> None:
    subs = kv.pools["default"]
    subs.streams[name] = EndpointStream(view=View.SYNCED)
    subs.index.store(name, BlockStored(tuple(range(1, blocks + 1)), None, ids[: blocks * BS], BS))


def endpoints(n: int) -> list[Endpoint]:
    return [
        Endpoint(f"ep-{i}", "127.0.0.1", 8000 + i, metrics=EngineMetrics(0.0)) for i in range(n)
    ]


async def test_keys_are_those_of_the_real_template_and_tokenizer(
    kv: KVEventsService, tiny_dir: Path
) -> None:
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    plugin = producer(kv, TokenizerService({"default": tok}))
    # what the server computes: its template rendered, then tokenized without specials
    assert tok.template is not None
    text = tok.template.template.render(
        messages=MESSAGES, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    ids = ref.encode(text, add_special_tokens=False).ids
    n = len(ids) // BS
    assert n >= 8
    hold(kv, "ep-0", ids, n - 2)  # as the server's BlockStored events would say
    hold(kv, "ep-1", ids, 3)
    eps = endpoints(3)
    kv.pools["default"].streams["ep-2"] = EndpointStream(view=View.SYNCED)
    state = CycleState()
    plugin.produce(chat(MESSAGES), state, eps)
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.hashes == block_keys(ids, BS)
    assert match.matched_blocks == {"ep-0": n - 2, "ep-1": 3}
    # the next turn: its keys extend the first turn's, its new part encoded only
    turn2 = [*MESSAGES, {"role": "assistant", "content": "Sol pre tra."}, MESSAGES[1]]
    state2 = CycleState()
    plugin.produce(chat(turn2), state2, eps)
    match2 = state2.get(PREFIX_MATCH)
    assert match2 is not None
    assert match2.hashes[: n - 2] == match.hashes[: n - 2]
    assert tok.cache.counters.prefix_hits == 1


async def test_a_rejected_template_routes_approximately(
    kv: KVEventsService, tiny_dir: Path
) -> None:
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    plugin = producer(kv, TokenizerService({"default": tok}))
    kv.pools["default"].streams["ep-0"] = EndpointStream(view=View.SYNCED)
    state = CycleState()
    plugin.produce(chat([{"role": "narrator", "content": "x"}]), state, endpoints(2))
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.block_tokens == 64  # the approximate producer's blocks
    assert tok.counters.fallbacks["template"] == 1
    assert kv.lookups.fallbacks == 2


async def test_builtin_when_the_pool_has_no_tokenizer(kv: KVEventsService, tiny_dir: Path) -> None:
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    plugin = producer(kv, TokenizerService({"other-pool": tok}))
    kv.pools["default"].streams["ep-0"] = EndpointStream(view=View.SYNCED)
    state = CycleState()
    prompt = b"k" * (BS * 4 * 3)
    plugin.produce(LLMRequest("r", "m", "m", prompt, 48, 0.0), state, endpoints(1))
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.block_tokens == BS
    assert match.total_blocks == 3  # built-in: 4 bytes per token
    assert tok.counters.tokenized == 0


class SlowTokenize:
    """A /tokenize route answering fixed ids after ``delay`` seconds."""

    def __init__(self, ids: list[int], delay: float = 0.0) -> None:
        self.ids, self.delay, self.bodies = ids, delay, list[dict[str, Any]]()

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        await asyncio.sleep(self.delay)
        return web.json_response({"count": len(self.ids), "max_model_len": 1, "tokens": self.ids})


async def serve(route: SlowTokenize) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post("/tokenize", route.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


async def test_server_source_prefetches_ids_from_tokenize(kv: KVEventsService) -> None:
    ids = list(range(100, 100 + 5 * BS))
    route = SlowTokenize(ids)
    runner, port = await serve(route)
    tok = ServerTokenizer(TokenizerSettings(source="server", timeout=1.0))
    try:
        plugin = producer(kv, TokenizerService({"default": tok}))
        assert plugin.fetches
        hold(kv, "ep-0", ids, 4)
        eps = [Endpoint("ep-0", "127.0.0.1", port, metrics=EngineMetrics(0.0))]
        request = chat(MESSAGES)
        state = CycleState()
        plugin.produce(request, state, eps)  # the host's pass ahead of the prefetch
        assert kv.lookups.fallbacks == 0  # not a fallback: the ids are still to come
        await plugin.prefetch(request, state, eps)
        plugin.produce(request, state, eps)
        match = state.get(PREFIX_MATCH)
        assert match is not None
        assert match.matched_blocks == {"ep-0": 4}
        assert route.bodies == [{"model": "m", "messages": MESSAGES}]
        assert tok.counters.tokenized == 1
    finally:
        await tok.close()
        await runner.cleanup()


async def test_server_timeouts_and_busy_slots_route_approximately(kv: KVEventsService) -> None:
    route = SlowTokenize([1, 2, 3], delay=0.5)
    runner, port = await serve(route)
    tok = ServerTokenizer(TokenizerSettings(source="server", timeout=0.1, max_concurrency=1))
    try:
        eps = [Endpoint("ep-0", "127.0.0.1", port, metrics=EngineMetrics(0.0))]
        first, second = await asyncio.gather(
            tok.fetch(chat(MESSAGES), eps), tok.fetch(chat(MESSAGES), eps)
        )
        assert (first, second) == (None, None)
        assert tok.counters.fallbacks["timeout"] == 1
        assert tok.counters.fallbacks["busy"] == 1
        assert tok.in_flight == 0
    finally:
        await tok.close()
        await runner.cleanup()


async def test_server_source_does_not_forward_images_to_tokenize(kv: KVEventsService) -> None:
    route = SlowTokenize([1, 2, 3])
    runner, port = await serve(route)
    tok = ServerTokenizer(TokenizerSettings(source="server", timeout=1.0))
    try:
        eps = [Endpoint("ep-0", "127.0.0.1", port, metrics=EngineMetrics(0.0))]
        image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}
        parts = [{"type": "text", "text": "What is it?"}, image]
        assert await tok.fetch(chat([{"role": "user", "content": parts}]), eps) is None
        assert tok.counters.fallbacks["unsupported"] == 1
        assert route.bodies == []  # never sent: the server would fetch the image again
        text = [{"type": "text", "text": "What is it?"}, "plain"]
        assert await tok.fetch(chat([{"role": "user", "content": text}]), eps) is not None
        assert len(route.bodies) == 1
    finally:
        await tok.close()
        await runner.cleanup()


async def test_the_pass_ahead_of_the_prefetch_counts_nothing(
    kv: KVEventsService, tiny_dir: Path
) -> None:
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    plugin = producer(kv, TokenizerService({"default": tok}))
    eps = endpoints(2)
    kv.pools["default"].streams["ep-0"] = EndpointStream(view=View.SYNCED)
    request = chat(MESSAGES)
    assert not plugin.fetches_for(request, "default")  # a short prompt: no prefetch
    # another fetcher (a remote predictor) makes the host run the producers ahead
    state = CycleState()
    state.put(PREFETCH_PASS, True)
    plugin.produce(request, state, eps)
    await plugin.prefetch(request, state, eps)
    assert state.get(PREFIX_MATCH) is not None  # the fetchers see a match
    assert kv.lookups.requests == 0
    assert kv.lookups.fallbacks == 0
    state.discard(PREFETCH_PASS)
    plugin.produce(request, state, eps)  # submit's pass: counted once, ids reused
    assert kv.lookups.requests == 1
    assert kv.lookups.fallbacks == 1  # ep-1 has no synced view
    assert tok.counters.tokenized == 1
    assert tok.cache.counters.misses + tok.cache.counters.hits == 1


async def test_a_long_prompt_is_tokenized_in_the_prefetch(
    kv: KVEventsService, tiny_dir: Path
) -> None:
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    plugin = producer(kv, TokenizerService({"default": tok}))
    eps = endpoints(1)
    kv.pools["default"].streams["ep-0"] = EndpointStream(view=View.SYNCED)
    long = [{"role": "user", "content": "Kalo mine ru sa ti vo. " * 1000}]
    request = chat(long)
    request.prompt = str(long).encode()
    assert plugin.fetches_for(request, "default")
    state = CycleState()
    state.put(PREFETCH_PASS, True)
    plugin.produce(request, state, eps)  # ahead of the prefetch: not tokenized here
    assert tok.counters.tokenized == 0
    await plugin.prefetch(request, state, eps)
    assert tok.counters.tokenized == 1
    ahead = state.get(PREFIX_MATCH)  # what fetchers after this one see: the precise match
    assert ahead is not None
    assert ahead.block_tokens == BS
    assert kv.lookups.requests == 0
    state.discard(PREFETCH_PASS)
    plugin.produce(request, state, eps)
    match = state.get(PREFIX_MATCH)
    assert match is not None
    assert match.block_tokens == BS  # the precise match, from the fetched ids
    assert tok.counters.tokenized == 1
    assert kv.lookups.requests == 1


def test_the_precise_prefetch_runs_before_the_fetchers_that_read_its_match(
    kv: KVEventsService,
) -> None:
    ctx = PluginContext(ManualClock(), services={KV_EVENTS_SERVICE: kv})
    registry = default_registry()
    latency = registry.create("predicted-latency-producer", "l", {}, ctx)
    precise = registry.create("precise-prefix-cache-producer", "p", {}, ctx)
    assert isinstance(latency, AsyncDataProducer)
    assert isinstance(precise, AsyncDataProducer)
    assert _fetch_order([latency, precise]) == [precise, latency]
    assert _fetch_order([precise, latency]) == [precise, latency]
