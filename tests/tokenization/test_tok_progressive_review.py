"""Review findings on progressive encoding: the cold-prefix fallback
(``approximateWhenNoneHolds``) is as exact as the rest, and the deferred worker survives
a failing completion callback."""

from __future__ import annotations

import threading
from pathlib import Path

from test_tok_progressive import BS
from tiny_tokenizer import corpus

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.framework import LLMRequest
from sluicegate.tokenization.local import LocalTokenizer
from sluicegate.tokenization.progressive import BlockKeying, Progress


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
