"""JSON as bytes: the one nesting limit, and exact top-level ``model`` replacement."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from sluicegate.errors import GatewayError
from sluicegate.requestcontrol import jsonbytes
from sluicegate.requestcontrol.jsonbytes import (
    MAX_JSON_DEPTH,
    replace_top_level_string,
    top_level_string_spans,
    within_depth,
)
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.requestcontrol.responses import restore_model_name


def nested(depth: int, kinds: str = "[{") -> Any:
    """A value of exactly ``depth`` levels, alternating arrays and objects."""
    value: Any = 1
    for level in range(depth):
        value = [value] if kinds[level % len(kinds)] == "[" else {"k": value}
    return value


# --------------------------------------------------------------------------- depth


@pytest.mark.parametrize("kinds", ["[", "{", "[{"])
def test_depth_limit_is_exact(kinds: str) -> None:
    assert within_depth(nested(MAX_JSON_DEPTH, kinds))
    assert not within_depth(nested(MAX_JSON_DEPTH + 1, kinds))
    assert not within_depth(nested(1000, kinds))
    assert within_depth("a string")
    assert within_depth(7)
    assert within_depth({})


def test_the_walk_for_encoders_without_a_limit_agrees() -> None:
    for depth in (0, 1, 127, 128, 129, 500):
        value = nested(depth)
        assert (jsonbytes._walk_depth(value) <= MAX_JSON_DEPTH) == within_depth(value)
    assert jsonbytes._walk_depth(nested(5)) == 5


def body_nested(depth: int) -> bytes:
    """A completion body whose deepest point is ``depth`` levels (the body is one)."""
    inner = b'[{"k":' * ((depth - 1) // 2) + b"[" * ((depth - 1) % 2)
    close = b"]" * ((depth - 1) % 2) + b"}]" * ((depth - 1) // 2)
    return b'{"model":"m","prompt":"x","extra":' + inner + b"1" + close + b"}"


@pytest.mark.parametrize("depth", [129, 254, 255, 600, 1024, 1025, 5000])
def test_parse_refuses_deep_bodies_with_one_message(depth: int) -> None:
    raw = body_nested(depth)
    with pytest.raises(GatewayError) as info:
        parse_request("completions", raw, {})
    assert info.value.status == 400
    assert f"deeper than {MAX_JSON_DEPTH} levels" in info.value.message


def test_parse_accepts_the_limit_and_chat_prompts_encode() -> None:
    for depth in (2, 3, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH):
        assert parse_request("completions", body_nested(depth), {}).body_bytes > 0
        assert orjson.loads(body_nested(depth))  # the helper nests as stated
    assert within_depth(orjson.loads(body_nested(MAX_JSON_DEPTH)))
    assert not within_depth(orjson.loads(body_nested(MAX_JSON_DEPTH + 1)))
    messages = [{"role": "user", "content": nested(MAX_JSON_DEPTH - 3)}]
    raw = orjson.dumps({"model": "m", "messages": messages})
    assert parse_request("chat", raw, {}).prompt == orjson.dumps(messages)
    content = b"[" * 300 + b"]" * 300
    deep = b'{"model":"m","messages":[{"role":"u","content":' + content + b"}]}"
    with pytest.raises(GatewayError, match="deeper than"):
        parse_request("chat", deep, {})


# --------------------------------------------------------------------------- replace

BIG = 10**23
SEED = 2**70


def rewrite(raw: bytes, value: str = "target") -> Any:
    out = replace_top_level_string(raw, "model", value)
    # Python's json keeps big integers exact: what an upstream server would read.
    return json.loads(out), out


def test_big_integers_survive_exactly() -> None:
    raw = (
        b'{"model": "public", "prompt": "x", "max_tokens": 100000000000000000000000, '
        b'"seed": 1180591620717411303424, "temperature": 0.1000000000000000055511151231}'
    )
    decoded, out = rewrite(raw)
    assert decoded["max_tokens"] == BIG
    assert decoded["seed"] == SEED
    assert out == raw.replace(b'"public"', b'"target"')  # every other byte as sent


def test_only_the_top_level_model_changes() -> None:
    body = {
        "messages": [{"role": "user", "content": "hi", "model": "public"}],
        "tools": [{"function": {"parameters": {"model": {"type": "string"}}}}],
        "model": "public",
        "metadata": {"model": "public"},
    }
    decoded, _ = rewrite(orjson.dumps(body))
    assert decoded["model"] == "target"
    assert decoded["messages"][0]["model"] == "public"
    assert decoded["metadata"] == {"model": "public"}
    assert decoded["tools"] == body["tools"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"public"}',
        b' \n{ \t"model" \r\n :\t "public" } \n',
        b'{"prompt":"x","model":"public"}',
        b'{"prompt":"say \\"model\\": \\"public\\"","model":"public"}',
        b'{"a \\"model":"x","model":"public"}',
        b'{"x":"model","model":"public"}',
        b'{"p":"\\\\","model":"public","q":["model","\\"model\\""]}',
        b'{"mod\\u0065l":"public","prompt":"x"}',
        b'{"prompt":"caf\\u00e9","model":"public"}',
    ],
)
def test_spellings_and_whitespace(raw: bytes) -> None:
    before = json.loads(raw)
    decoded, _ = rewrite(raw)
    assert decoded == {**before, "model": "target"}


def test_a_duplicate_key_is_replaced_wherever_it_is() -> None:
    # Decoders keep the last duplicate; replacing every one leaves none with the old name.
    for raw in (
        b'{"model":"a","prompt":"x","model":"public"}',
        b'{"model":"a","mod\\u0065l":"public"}',
    ):
        _, out = rewrite(raw)
        assert b'"a"' not in out
        assert b"public" not in out
        assert orjson.loads(out)["model"] == "target"


@pytest.mark.parametrize(
    "name", ['lora/"quoted"', "back\\slash", "naïve-模型", "tab\tand\nline", "emoji-🦙"]
)
def test_unicode_and_escaped_names(name: str) -> None:
    raw = json.dumps({"model": name, "prompt": "x", "max_tokens": BIG}, ensure_ascii=False)
    decoded, _ = rewrite(raw.encode(), name + "-target")
    assert decoded["model"] == name + "-target"
    assert decoded["max_tokens"] == BIG
    escaped = json.dumps({"model": name, "max_tokens": BIG}).encode()  # \uXXXX escapes
    decoded, _ = rewrite(escaped, "t")
    assert decoded == {"model": "t", "max_tokens": BIG}


def test_spans() -> None:
    raw = b'{"x":{"model":"n"},"model":"p"}'
    assert top_level_string_spans(raw, "model") == [(len(raw) - 4, len(raw) - 1)]
    with pytest.raises(ValueError, match="no top-level"):
        replace_top_level_string(b'{"model":5,"x":{"model":"n"}}', "model", "t")


def test_restore_model_name_is_exact_with_the_bytes() -> None:
    data = (
        b'{"id":"c1","object":"text_completion","model":"target-v1","choices":[{"index":0,'
        b'"text":"hi","logprobs":null,"model":"target-v1"}],"usage":{"n":100000000000000000000000}}'
    )
    payload = orjson.loads(data)
    out = restore_model_name(payload, data, "target-v1", "public")
    assert out == data.replace(b'"model":"target-v1","choices"', b'"model":"public","choices"')
    assert json.loads(out)["usage"]["n"] == BIG
    assert restore_model_name(orjson.loads(data), data, "other", "public") is None
    # Nested deeper than the encoder goes: still restored, the rest untouched.
    deep = b'{"model":"target-v1","x":' + b"[" * 400 + b"]" * 400 + b"}"
    out = restore_model_name(orjson.loads(deep), deep, "target-v1", "public")
    assert out == deep.replace(b"target-v1", b"public")
