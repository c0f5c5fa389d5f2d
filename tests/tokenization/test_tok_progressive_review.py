"""Review findings on progressive encoding: the cold-prefix fallback
(``approximateWhenNoneHolds``) is as exact as the rest, and the deferred worker survives
a failing completion callback."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from test_tok_progressive import BS, EPS, conversation, producer
from tiny_tokenizer import corpus
from tokenizers import Encoding, Tokenizer

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
from sluicegate.framework import PREFIX_MATCH, CycleState, LLMRequest
from sluicegate.tokenization.local import LocalTokenizer
from sluicegate.tokenization.progressive import BlockKeying, Progress


def test_cold_prefix_fallback_matches_the_whole_encodings(tiny_dir: Path) -> None:
    settings = TokenizerSettings(source="local", path=str(tiny_dir))
    progressive = LocalTokenizer.load(settings)
    whole = LocalTokenizer.load(settings)
    rng = random.Random(5)
    lines = corpus(200, 3)
    eps = [
        Endpoint(f"ep-{i}", "127.0.0.1", 8000 + i, metrics=EngineMetrics(0.0)) for i in range(EPS)
    ]
    params = {"approximateWhenNoneHolds": True}
    compared = 0
    for _trial in range(30):
        subs = KVEventSubscribers(PreciseIndex(default_capacity=100_000), clock=ManualClock())
        kv = KVEventsService({"default": subs})
        for e in eps:
            subs.streams[e.name] = EndpointStream(view=View.SYNCED)
        p_fast = producer(kv, progressive, params)
        p_whole = producer(kv, whole, {**params, "encodeWholePrompt": True})
        messages = conversation(rng, lines)
        body = {"model": "m", "messages": messages}
        text = progressive.template.render(body) if progressive.template else ""
        # the bytes the approximate index keys: twice the text, as for a real vocabulary
        # with more characters per token than the approximate index assumes (its match
        # converted to blocks then exceeds the prompt's blocks)
        prompt = (text * 2).encode()
        request = LLMRequest("r", "m", "m", prompt, 3, 0.0, kind="chat", body=body)
        # the approximate index of both remembers the prompt on ep-0 (no server holds it)
        for plugin in (p_fast, p_whole):
            plugin.approximate.remember(eps[0], plugin.approximate.match(request, eps))
        s_fast, s_whole = CycleState(), CycleState()
        p_fast.produce(request, s_fast, eps)
        p_whole.produce(request, s_whole, eps)
        fast, full = s_fast.get(PREFIX_MATCH), s_whole.get(PREFIX_MATCH)
        assert fast is not None
        assert full is not None
        assert full.matched_blocks  # the cold fallback applied
        assert fast.matched_blocks == full.matched_blocks
        compared += 1
    assert compared == 30


def test_the_worker_survives_a_failing_callback(tiny_dir: Path) -> None:
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    keying = BlockKeying(BS)

    def decided(i: int) -> Progress:
        text = " ".join(corpus(40, 100 + i))
        body = {"model": "m", "prompt": text, "add_special_tokens": False}
        request = LLMRequest(str(i), "m", "m", b"x", 3, 0.0, kind="completions", body=body)
        p = tok.decide(request, keying, lambda keys: len(keys) >= 1)
        assert p is not None
        assert not p.whole
        return p

    def boom(keys: list[int]) -> None:
        raise RuntimeError("a callback bug")

    got: list[int] = []
    finished = threading.Event()

    def ok(keys: list[int]) -> None:
        got.append(len(keys))
        finished.set()

    tok.finish_later(decided(0), boom)
    tok.finish_later(decided(1), ok)
    # no event loop: the callbacks run on this thread once the worker has finished
    tok.deferred.drain()
    assert finished.is_set(), "the first prompt's failing callback stopped the second"
    assert tok.deferred.counters.finished == 2
    assert got
    assert got[0] > 1


def test_finishing_after_dispatch_stops_at_the_decisions_token_limit(tiny_dir: Path) -> None:
    # maxPrefixTokensToMatch bounds what a decision encodes; the worker must not then
    # encode a huge prompt whole (a client could keep it busy with one large body each)
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    text = " ".join(corpus(3000, 9))
    body = {"model": "m", "prompt": text, "add_special_tokens": False}
    request = LLMRequest("r", "m", "m", b"x", 3, 0.0, kind="completions", body=body)
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    whole = len(ref.encode(text, add_special_tokens=False).ids)
    limit = 256
    assert whole > 40 * limit
    p = tok.decide(request, BlockKeying(BS), lambda keys: False, limit)
    assert p is not None
    assert not p.whole
    tok.finish_later(p)
    tok.deferred.drain()
    assert tok.deferred.counters.finished == 1
    assert limit <= len(p.ids) < 8 * limit


def test_chunked_encoding_is_exact_on_unusual_texts(tiny_dir: Path) -> None:
    # the cut rule (before a space after a non-space) on texts that stress it: runs of
    # spaces and other whitespace, no spaces at all, very long words, non-Latin scripts,
    # no-break spaces, emoji, a chat template's special tokens
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    rng = random.Random(3)
    pieces = [" ", "  ", "\t", "\n", " \n ", "\u00a0", "\u3000", "word", "naïve", "中文字符",
              "😀", "x" * 300, "<|user|>", "12345", "!!", "\u2028", "\x1c"]  # fmt: skip
    texts = [
        "a" + " " * 5000 + "b c",
        "x" * 5000,
        "中文字符" * 800,
        " " * 3000,
        *("".join(rng.choice(pieces) for _ in range(rng.randint(50, 900))) for _ in range(40)),
    ]

    def decided(text: str, enough: Callable[[Sequence[int]], bool]) -> Progress:
        body = {"model": "m", "prompt": text, "add_special_tokens": False}
        request = LLMRequest("r", "m", "m", b"x", 3, 0.0, kind="completions", body=body)
        p = tok.decide(request, BlockKeying(BS), enough)
        assert p is not None
        return p

    for text in texts:
        # an earlier turn (a prefix), decided early and finished, then the whole text
        tok.finish_later(decided(text[: rng.randint(0, len(text))], lambda keys: len(keys) > 2))
        tok.deferred.drain()
        p = decided(text, lambda keys: False)
        assert p.whole
        assert list(p.ids) == ref.encode(text, add_special_tokens=False).ids, text[:80]


def test_a_completion_with_its_bos_matches_the_whole_encodings(tiny_dir: Path) -> None:
    # a completion's post-processor BOS leads the blocks (BlockKeying.lead); limits cut
    # the prompt at maxPrefixTokensToMatch
    settings = TokenizerSettings(source="local", path=str(tiny_dir))
    progressive, whole = LocalTokenizer.load(settings), LocalTokenizer.load(settings)
    assert progressive.prefix_ids
    rng = random.Random(11)
    words = corpus(300, 4)
    eps = [
        Endpoint(f"ep-{i}", "127.0.0.1", 8000 + i, metrics=EngineMetrics(0.0)) for i in range(EPS)
    ]
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    for trial in range(40):
        subs = KVEventSubscribers(PreciseIndex(default_capacity=100_000), clock=ManualClock())
        kv = KVEventsService({"default": subs})
        for e in eps:
            subs.streams[e.name] = EndpointStream(view=View.SYNCED)
        limit = rng.choice([0, 0, 64, 200, 1000])
        p_fast = producer(kv, progressive, {"maxPrefixTokensToMatch": limit})
        p_whole = producer(kv, whole, {"maxPrefixTokensToMatch": limit, "encodeWholePrompt": True})
        text = " ".join(rng.sample(words, rng.randint(1, 200)))
        body = {"model": "m", "prompt": text}
        request = LLMRequest("r", "m", "m", text.encode(), 3, 0.0, kind="completions", body=body)
        ids = ref.encode(text, add_special_tokens=True).ids
        n = len(ids) // BS
        for k, e in enumerate(eps):
            held = rng.randint(0, n)
            if held:
                start = trial * 10_000 + k * 1000
                subs.index.store(
                    e.name,
                    BlockStored(tuple(range(start, start + held)), None, ids[: held * BS], BS),
                )
        s_fast, s_whole = CycleState(), CycleState()
        p_fast.produce(request, s_fast, eps)
        p_whole.produce(request, s_whole, eps)
        fast, full = s_fast.get(PREFIX_MATCH), s_whole.get(PREFIX_MATCH)
        assert fast is not None
        assert full is not None
        assert fast.matched_blocks == full.matched_blocks, (trial, limit)
        assert fast.hashes == full.hashes[: len(fast.hashes)]


def test_the_deferred_queue_is_bounded_in_bytes(tiny_dir: Path) -> None:
    # 64 waiting prompts of a 16 MiB body each would pin ~2 GiB: the queue also bounds
    # the prompt bytes it holds
    tok = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tiny_dir)))
    deferred = tok.deferred
    deferred.max_bytes = 50_000
    gate = threading.Event()
    inner = deferred.encode

    def held(text: str) -> Encoding:
        gate.wait(30)
        return inner(text)

    deferred.encode = held
    texts = [" ".join(corpus(60, 200 + seed)) for seed in range(20)]  # ~4 KB each
    try:
        for i, text in enumerate(texts):
            body = {"model": "m", "prompt": text, "add_special_tokens": False}
            request = LLMRequest(str(i), "m", "m", b"x", 3, 0.0, kind="completions", body=body)
            p = tok.decide(request, BlockKeying(BS), lambda keys: len(keys) >= 1)
            assert p is not None
            tok.finish_later(p)
            assert deferred.pending_bytes <= 50_000
        assert deferred.counters.dropped >= 5
    finally:
        gate.set()
    deferred.drain()
    assert deferred.pending_bytes == 0
    assert deferred.counters.finished + deferred.counters.dropped == len(texts)
