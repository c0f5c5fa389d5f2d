"""parse_other: the bodies of passed-through routes → ParsedRequest, or a 400."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sluicegate.errors import GatewayError
from sluicegate.requestcontrol.parse import MODEL_REWRITE_HEADER, parse_other
from sluicegate.tokens import count_bytes_tokens

JSON = {"content-type": "application/json"}


def other(body: Any, headers: dict[str, str] | None = None, generates: bool = True) -> Any:
    return parse_other(orjson.dumps(body), headers if headers is not None else JSON, generates)


def test_an_embeddings_body() -> None:
    body = {"model": "e", "input": "hello there", "encoding_format": "base64"}
    parsed = other(body, generates=False)
    assert (parsed.kind, parsed.model, parsed.stream) == ("other", "e", False)
    assert parsed.prompt == b"hello there"
    assert parsed.prompt_tokens == count_bytes_tokens(b"hello there")
    assert parsed.max_tokens == 1  # embeddings generate nothing
    assert parsed.raw == orjson.dumps(body)


def test_a_responses_body() -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    parsed = other({"model": "m", "input": items, "stream": "true", "max_output_tokens": "7"})
    assert parsed.stream is True
    assert parsed.max_tokens == 7
    assert parsed.prompt == orjson.dumps(items)  # prefix-stable across turns


@pytest.mark.parametrize(
    ("body", "prompt"),
    [
        ({"model": "m", "input": ["a", "b"]}, b"ab"),
        ({"model": "m", "input": [1, 2]}, b"\x01\0\0\0\x02\0\0\0"),
        ({"model": "m", "prompt": "p"}, b"p"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, None),
        ({"model": "m", "text": "t", "query": "q"}, b"t"),
        ({"model": "m", "query": "q", "documents": ["d"]}, b"q"),
        ({"model": "m"}, b""),
        ({"model": "m", "input": {"odd": True}}, b'{"odd":true}'),
    ],
)
def test_the_prompt_for_affinity(body: dict[str, Any], prompt: bytes | None) -> None:
    parsed = other(body)
    expected = orjson.dumps(body["messages"]) if prompt is None else prompt
    assert parsed.prompt == expected


@pytest.mark.parametrize(
    ("raw", "headers"),
    [
        (b"", {}),
        (b"", JSON),
        (
            b"--boundary\r\ncontent-disposition: form-data",
            {"content-type": "multipart/form-data; boundary=boundary"},
        ),
        (b'{"tokens": [1, 2]}', JSON),
        (b'{"tokens": [1]}', {}),  # no content type, but an object: still read
    ],
)
def test_model_less_requests(raw: bytes, headers: dict[str, str]) -> None:
    parsed = parse_other(raw, headers, True)
    assert parsed.model == ""
    assert parsed.body_bytes == len(raw)


def test_a_model_less_request_ignores_the_rewrite_header() -> None:
    parsed = parse_other(b'{"tokens": [1]}', {**JSON, MODEL_REWRITE_HEADER: "x"}, False)
    assert parsed.model_rewrite is None
    parsed = parse_other(b'{"model": "a"}', {**JSON, MODEL_REWRITE_HEADER: "x"}, False)
    assert parsed.model_rewrite == "x"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": 3}', "model"),
        (b'{"model": ""}', "model"),
        (b'{"model": "m", "stream": "maybe"}', "stream"),
        (b'{"model": "m", "max_output_tokens": 0}', "max_output_tokens"),
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"[" * 200 + b"]" * 200, None),
    ],
)
def test_bad_bodies_are_400_naming_the_field(raw: bytes, param: str | None) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_other(raw, JSON, True)
    assert caught.value.status == 400
    assert caught.value.param == param
