"""Progressive encoding across threads: the prefix cache's counters lose no counts, a
decision made while a worker holds the cache is still finished, callbacks of a host
without an event loop run on its thread, and speculation's walk considers only the
candidates and the cold fallback's catch-up stays in the prefetch's thread."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from test_tok_progressive import BS, producer
from tiny_tokenizer import corpus
from tokenizers import Tokenizer

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.datalayer.kvevents import (
    BlockStored,
    EndpointStream,
    KVEventsService,
    KVEventSubscribers,
    PreciseIndex,
    View,
)
from sluicegate.datalayer.kvevents.index import block_keys
from sluicegate.framework import PREFIX_MATCH, CycleState, LLMRequest
from sluicegate.scheduling.precise_frontier import Frontier
from sluicegate.scheduling.speculative import SpeculativeEntries
from sluicegate.tokenization.local import LocalTokenizer
from sluicegate.tokenization.progressive import BlockKeying


def _tok(tiny_dir: Path) -> LocalTokenizer:
    return LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))


def _request(text: str, rid: str = "r") -> LLMRequest:
    body = {"model": "m", "prompt": text, "add_special_tokens": False}
    return LLMRequest(rid, "m", "m", b"x", 3, 0.0, kind="completions", body=body)


def _whole_keys(tiny_dir: Path, text: str) -> list[int]:
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    return list(block_keys(ref.encode(text, add_special_tokens=False).ids, BS))


def test_counting_is_serialised_with_the_other_threads(tiny_dir: Path) -> None:
    # the loop and the workers add to the same totals, not always under the cache's
    # lock: a decision's counts go through the counters' own lock
    tok = _tok(tiny_dir)
    text = " ".join(corpus(200, 3))
    counters = tok.cache.counters
    made: list[int] = []

    def decide() -> None:
        p = tok.decide(_request(text), BlockKeying(BS), lambda keys: False)
        assert p is not None
        made.append(p.encoded_tokens)

    with counters._lock:
        worker = threading.Thread(target=decide)
        worker.start()
        worker.join(0.3)
        assert worker.is_alive(), "the decision counted without the counters' lock"
    worker.join(10)
    assert made
    assert made[0] > 0
    assert counters.tokens_encoded == made[0]
    assert counters.misses == 1


async def test_a_decision_on_a_busy_cache_is_still_finished(tiny_dir: Path) -> None:
    tok = _tok(tiny_dir)
    text = " ".join(corpus(400, 7))
    want = _whole_keys(tiny_dir, text)
    assert tok._lock.acquire(timeout=1)  # a worker encoding a long prompt holds the cache
    try:
        p = tok.decide(_request(text), BlockKeying(BS), lambda keys: len(keys) >= 1)
    finally:
        tok._lock.release()
    assert p is not None
    assert not p.whole
    got: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    tok.finish_later(p, got.set_result)
    assert await asyncio.wait_for(got, 10) == want
    again = tok.decide(_request(text, "r2"), BlockKeying(BS), lambda keys: False)
    assert again is not None
    assert again.whole  # the finished prompt was stored
    assert again.encoded_tokens == 0


def test_without_a_loop_callbacks_run_on_the_submitting_thread(tiny_dir: Path) -> None:
    tok = _tok(tiny_dir)
    text = " ".join(corpus(400, 11))
    p = tok.decide(_request(text), BlockKeying(BS), lambda keys: len(keys) >= 1)
    assert p is not None
    assert not p.whole
    ran: list[tuple[int, int]] = []
    tok.finish_later(p, lambda keys: ran.append((threading.get_ident(), len(keys))))
    deadline = time.monotonic() + 10
    while tok.deferred.counters.finished == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tok.deferred.counters.finished == 1
    tok.deferred.drain()
    assert ran == [(threading.get_ident(), len(_whole_keys(tiny_dir, text)))]
    # a later submit runs what became ready before it, on its own thread
    p2 = tok.decide(_request(text + " more", "r2"), BlockKeying(BS), lambda keys: len(keys) >= 1)
    assert p2 is not None
    assert not p2.whole
    tok.finish_later(p2, lambda keys: ran.append((threading.get_ident(), len(keys))))
    deadline = time.monotonic() + 10
    while tok.deferred.counters.finished < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ran) == 1  # not run by the worker
    tok.finish_later(p, lambda keys: None)  # whole by now: nothing queued
    tok.deferred.drain()
    assert [who for who, _ in ran] == [threading.get_ident()] * 2


def test_speculation_walks_only_the_candidates() -> None:
    index = PreciseIndex(default_capacity=1000)
    tokens = list(range(4 * BS))
    keys = list(block_keys(tokens, BS))
    index.store("other", BlockStored(tuple(range(4)), None, tokens, BS))
    spec = SpeculativeEntries(2.0, 100)
    # the only candidate holds nothing: a server that is not one does not matter
    assert Frontier(index, ["cand"], spec, 0)(keys[:1])
    # with a guess for its first two blocks the walk goes on to the third
    spec.insert("cand", keys[:2], 0.0)
    frontier = Frontier(index, ["cand"], spec, 0)
    assert not frontier(keys[:1])
    assert not frontier(keys[:2])
    assert frontier(keys[:3])
    # a candidate the index knows, holding the blocks there, keeps it going as before
    both = Frontier(index, ["cand", "other"], spec, 0)
    assert not both(keys)


async def test_the_cold_fallbacks_catch_up_is_encoded_in_the_prefetch(tiny_dir: Path) -> None:
    # approximateWhenNoneHolds keys a cold prompt as far as the approximate match reaches;
    # for a prompt the prefetch encodes in its thread, that reach is known there, so the
    # pass on the event loop after it encodes nothing more
    fast = _tok(tiny_dir)
    whole = _tok(tiny_dir)
    eps = [Endpoint(f"ep-{i}", "127.0.0.1", 8000 + i, metrics=EngineMetrics(0.0)) for i in range(3)]
    subs = KVEventSubscribers(PreciseIndex(default_capacity=100_000), clock=ManualClock())
    kv = KVEventsService({"default": subs})
    for e in eps:
        subs.streams[e.name] = EndpointStream(view=View.SYNCED)
    params = {"approximateWhenNoneHolds": True}
    p_fast = producer(kv, fast, params)
    p_whole = producer(kv, whole, {**params, "encodeWholePrompt": True})
    text = " ".join(corpus(3000, 21))
    body = {"model": "m", "prompt": text, "add_special_tokens": False}
    request = LLMRequest("r", "m", "m", text.encode(), 3, 0.0, kind="completions", body=body)
    assert p_fast.fetches_for(request, "default")  # long: tokenized in the prefetch
    for plugin in (p_fast, p_whole):
        plugin.approximate.remember(eps[0], plugin.approximate.match(request, eps))
    on_loop: list[int] = []
    decide = fast.decide

    def spy(*args: Any, **kwargs: Any) -> Any:
        before = fast.cache.counters.tokens_encoded
        out = decide(*args, **kwargs)
        if threading.current_thread() is threading.main_thread():
            on_loop.append(fast.cache.counters.tokens_encoded - before)
        return out

    fast.decide = spy  # type: ignore[method-assign]
    s_fast, s_whole = CycleState(), CycleState()
    await p_fast.prefetch(request, s_fast, eps)
    p_fast.produce(request, s_fast, eps)
    await p_whole.prefetch(request, s_whole, eps)
    p_whole.produce(request, s_whole, eps)
    got, want = s_fast.get(PREFIX_MATCH), s_whole.get(PREFIX_MATCH)
    assert got is not None
    assert want is not None
    assert want.matched_blocks  # the cold fallback applied
    assert got.matched_blocks == want.matched_blocks
    assert sum(on_loop) == 0, f"tokens encoded on the event loop: {on_loop}"
