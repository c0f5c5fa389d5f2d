"""Reading and rewriting response bodies, without a server: the pieces shared with the
standalone gateway (``requestcontrol/responses.py``) and the picker's ``ResponseRelay``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.extproc.response import ResponseRelay
from sluicegate.requestcontrol.responses import (
    EventRewriter,
    ModelNameRewriter,
    ResponseStats,
    restore_model_name,
)

EVENTS = [
    {"model": "target", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"model": "target", "choices": [{"index": 0, "delta": {"content": "a"}}]},
    {"model": "target", "choices": [{"index": 0, "delta": {"content": "b"}}]},
    {"model": "target", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
]
STREAM = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in EVENTS) + b"data: [DONE]\n\n"


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(points)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_stream_read_the_same_however_it_is_cut(points: list[int]) -> None:
    stats = ResponseStats()
    rewriter = EventRewriter(ModelNameRewriter("target", "public"))
    out = b""
    for chunk in cut(STREAM, points):
        stats.observe_stream_chunk(chunk)
        out += rewriter.feed(chunk)
    stats.end_stream()
    out += rewriter.flush()
    assert out == STREAM.replace(b'"model":"target"', b'"model":"public"')
    assert (stats.prompt_tokens, stats.completion_tokens) == (5, 2)
    assert stats.chunks == 2  # the role event is not a token
    assert stats.usage().output_tokens == 2


def test_stream_without_usage_counts_token_events() -> None:
    stats = ResponseStats()
    for event in EVENTS[:3]:
        stats.observe_stream_chunk(b"data: " + orjson.dumps(event) + b"\n\n")
    stats.end_stream()
    assert stats.usage().output_tokens == 2
    assert stats.usage().prompt_tokens is None


def test_rewriter_leaves_other_fields_and_escapes_names() -> None:
    rewrite = ModelNameRewriter("target", 'pub"lic\\')
    data = b'{"model": "target", "text": "the model target", "other": {"model":"target2"}}'
    out = orjson.loads(rewrite(data))
    assert out == {"model": 'pub"lic\\', "text": "the model target", "other": {"model": "target2"}}


def test_restore_model_name_only_for_the_target() -> None:
    assert restore_model_name({"model": "other"}, b'{"model":"other"}', "target", "public") is None
    assert restore_model_name(["not", "a", "dict"], b'["not","a","dict"]', "t", "p") is None
    data = b'{"model": "target"}'
    assert orjson.loads(
        restore_model_name({"model": "target"}, data, "target", "public") or b""
    ) == {"model": "public"}


@dataclass
class _Request:
    model: str
    target_model: str


@dataclass
class _Dispatch:
    request: _Request

    @property
    def rewrites_model(self) -> bool:
        return self.request.model != self.request.target_model


def relay(streaming: bool, rewrite: bool, limit: int = 1 << 20) -> ResponseRelay:
    request = _Request("public" if rewrite else "target", "target")
    return ResponseRelay(_Dispatch(request), streaming, limit)  # a duck-typed Dispatch


ANSWER = orjson.dumps({"model": "target", "usage": {"prompt_tokens": 3, "completion_tokens": 9}})


def test_whole_answer_passes_at_once_without_rewrite() -> None:
    r = relay(streaming=False, rewrite=False)
    first, second = ANSWER[:10], ANSWER[10:]
    assert r.feed(first, False) is first  # passed on as it arrives
    assert r.feed(second, True) is second
    assert r.stats.usage().output_tokens == 9


def test_whole_answer_held_and_restored_with_rewrite() -> None:
    r = relay(streaming=False, rewrite=True)
    assert r.holds_body
    assert r.feed(ANSWER[:10], False) == b""
    out = r.feed(ANSWER[10:], True)
    assert orjson.loads(out)["model"] == "public"
    assert r.stats.usage().prompt_tokens == 3


def test_whole_answer_over_the_buffer_limit_passes_by_pattern() -> None:
    big = orjson.dumps({"model": "target", "text": "x" * 5000})
    r = relay(streaming=False, rewrite=True, limit=1000)
    out = r.feed(big[:600], False)
    assert out == b""
    out += r.feed(big[600:1200], False)  # over the limit: what was held goes, rewritten
    out += r.feed(big[1200:], True)
    assert orjson.loads(out) == {"model": "public", "text": "x" * 5000}
    assert r.stats.usage().output_tokens == 0  # unknown


def test_abort_returns_what_was_held() -> None:
    r = relay(streaming=False, rewrite=True)
    r.feed(ANSWER[:10], False)
    assert r.abort() == ANSWER[:10]
    assert r.feed(ANSWER[10:], True) == ANSWER[10:]  # unchanged from now on


def test_an_event_without_end_is_not_held_forever() -> None:
    from sluicegate.requestcontrol.responses import MAX_EVENT_BYTES

    rewriter = EventRewriter(ModelNameRewriter("target", "public"))
    stats = ResponseStats()
    head = b'data: {"model":"target","text":"'
    out = rewriter.feed(head)
    stats.observe_stream_chunk(head)
    assert out == b""
    filler = b"x" * MAX_EVENT_BYTES
    out = rewriter.feed(filler)  # past the bound: passed on, rewritten
    stats.observe_stream_chunk(filler)
    assert out == b'data: {"model":"public","text":"' + filler
    assert rewriter.flush() == b""
    assert stats._tail == b""  # the scan dropped it too
