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
from tokenizers import Tokenizer

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.datalayer.kvevents import (
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
    assert finished.wait(10), "the worker died with the first prompt's callback"
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
