"""parse_request: OpenAI-style bodies and control headers → ParsedRequest, or a 400."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from sluicegate.errors import GatewayError
from sluicegate.requestcontrol.parse import (
    CONTROL_HEADERS,
    DEFAULT_FLOW,
    FAIRNESS_HEADERS,
    MAX_HEADER_ID_LENGTH,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADERS,
    PREDICTION_BASED_HEADER,
    PREDICTION_OFF_HEADER,
    SLO_TPOT_HEADERS,
    SLO_TTFT_HEADERS,
    ParsedRequest,
    RequestKind,
    parse_request,
)


def completions(headers: Mapping[str, str] | None = None, **body: Any) -> ParsedRequest:
    body.setdefault("model", "m")
    body.setdefault("prompt", "hello")
    return parse_request("completions", orjson.dumps(body), headers or {})


def chat(headers: Mapping[str, str] | None = None, **body: Any) -> ParsedRequest:
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return parse_request("chat", orjson.dumps(body), headers or {})


def bad(kind: RequestKind, raw: bytes, headers: Mapping[str, str] | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse_request(kind, raw, headers or {})
    err = info.value
    assert err.status == 400
    assert err.code == "invalid_request"
    assert err.reason == "bad-request"
    body = orjson.loads(err.body())["error"]
    assert body["type"] == "invalid_request_error"
    assert body["param"] == err.param
    assert body["message"] == err.message
    return err


def bad_body(kind: RequestKind = "completions", **body: Any) -> GatewayError:
    return bad(kind, orjson.dumps(body))


# --------------------------------------------------------------------------- basics


def test_minimal_completion() -> None:
    raw = b'{"model": "llama", "prompt": "Hello, world"}'
    p = parse_request("completions", raw, {})
    assert p.kind == "completions"
    assert p.model == "llama"
    assert p.body == {"model": "llama", "prompt": "Hello, world"}
    assert p.stream is False
    assert p.max_tokens is None
    assert p.prompt == b"Hello, world"
    assert p.prompt_tokens == 3  # 12 bytes / 4
    assert p.cache_salt == ""
    assert (p.slo_ttft_ms, p.slo_tpot_ms) == (None, None)
    assert p.objective is None
    assert p.fairness_id == DEFAULT_FLOW == "default-flow"
    assert p.model_rewrite is None
    assert p.body_bytes == len(raw)


def test_other_fields_pass_through() -> None:
    body = {
        "model": "m",
        "prompt": "x",
        "temperature": "0.5",
        "logit_bias": {"50256": -100},
        "n": 2,
        "extra": [1, {"a": None}],
    }
    assert completions(**body).body == body


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("é" * 4, 2), ("日本語", 3)],
)
def test_prompt_tokens_are_bytes_over_four(text: str, tokens: int) -> None:
    p = completions(prompt=text)
    assert p.prompt == text.encode()
    assert p.prompt_tokens == tokens


def test_body_bytes_counts_the_raw_body() -> None:
    raw = b'  {"model": "m",   "prompt": "x"}  \n'
    assert parse_request("completions", raw, {}).body_bytes == len(raw)


# --------------------------------------------------------------------------- lax values


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("True", True),
        (" yes ", True),
        ("1", True),
        (1, True),
        ("false", False),
        ("off", False),
        (0, False),
        ("0", False),
        (None, False),
    ],
)
def test_lax_stream(value: Any, expected: bool) -> None:
    assert completions(stream=value).stream is expected


@pytest.mark.parametrize("value", ["maybe", 2, -1, 0.5, [], {}, ""])
def test_bad_stream(value: Any) -> None:
    err = bad_body(model="m", prompt="x", stream=value)
    assert err.param == "stream"
    assert "'stream' must be a boolean" in err.message


@pytest.mark.parametrize(
    ("value", "expected"),
    [(16, 16), (16.0, 16), ("16", 16), (" 32 ", 32), ("1e2", 100), (None, None), (1, 1)],
)
def test_lax_max_tokens(value: Any, expected: int | None) -> None:
    assert completions(max_tokens=value).max_tokens == expected
    assert chat(max_completion_tokens=value).max_tokens == expected


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", ["ten", 1.5, "2.5", True, False, [], 0, -3, "0"])
def test_bad_max_tokens(field: str, value: Any) -> None:
    err = bad_body(**{"model": "m", "prompt": "x", field: value})
    assert err.param == field
    assert f"'{field}'" in err.message


def test_max_completion_tokens_takes_precedence() -> None:
    assert completions(max_tokens=10, max_completion_tokens=20).max_tokens == 20
    assert chat(max_tokens=10, max_completion_tokens=None).max_tokens == 10
    # Only the winning field is checked... and an invalid winner is reported by its name.
    err = bad_body(model="m", prompt="x", max_tokens=10, max_completion_tokens="lots")
    assert err.param == "max_completion_tokens"


# --------------------------------------------------------------------------- prompts


def test_prompt_list_of_strings_is_joined() -> None:
    p = completions(prompt=["Hello, ", "world"])
    assert p.prompt == b"Hello, world"
    assert p.prompt_tokens == 3


def test_prompt_token_ids() -> None:
    p = completions(prompt=[1, 2, 70000])
    assert p.prompt == (
        (1).to_bytes(4, "little") + (2).to_bytes(4, "little") + (70000).to_bytes(4, "little")
    )
    assert p.prompt_tokens == 3  # one built-in token per token id


def test_same_token_ids_give_same_prompt() -> None:
    assert completions(prompt=[5, 6]).prompt == completions(prompt=[5, 6]).prompt
    assert completions(prompt=[5, 6]).prompt != completions(prompt=[6, 5]).prompt


@pytest.mark.parametrize(
    "prompt",
    [
        None,
        42,
        [],
        [1, "a"],
        [1, -1],
        [True, False],
        [[1, 2], [3]],
        {"text": "x"},
        [1.5],
        ["a", None],
    ],
)
def test_bad_prompts(prompt: Any) -> None:
    body: dict[str, Any] = {"model": "m"}
    if prompt is not None:
        body["prompt"] = prompt
    err = bad_body(**body)
    assert err.param == "prompt"
    assert "list of token ids" in err.message


def test_chat_prompt_is_json_of_messages() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "héllo"}]},
    ]
    p = chat(messages=messages, prompt="ignored in chat")
    assert p.kind == "chat"
    assert p.prompt == orjson.dumps(messages)
    assert orjson.loads(p.prompt) == messages
    assert p.prompt_tokens == -(-len(p.prompt) // 4)


def test_chat_prompts_of_a_conversation_share_a_prefix() -> None:
    turn1 = [{"role": "user", "content": "first question"}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "next"},
    ]
    a, b = chat(messages=turn1).prompt, chat(messages=turn2).prompt
    assert b.startswith(a[:-1])  # everything but the closing bracket


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (None, "'messages' must be a non-empty list"),
        ([], "'messages' must be a non-empty list"),
        ("hi", "'messages' must be a non-empty list"),
        ({"role": "user"}, "'messages' must be a non-empty list"),
        (["hi"], "messages[0] must be an object with a 'role'"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], "messages[1] must be"),
        ([{"role": 1, "content": "b"}], "messages[0] must be"),
    ],
)
def test_bad_messages(messages: Any, fragment: str) -> None:
    body: dict[str, Any] = {"model": "m"}
    if messages is not None:
        body["messages"] = messages
    err = bad_body("chat", **body)
    assert err.param == "messages"
    assert fragment in err.message


def test_chat_does_not_need_prompt_and_completions_do_not_need_messages() -> None:
    assert chat().prompt.startswith(b"[")
    err = bad_body("completions", model="m", messages=[{"role": "user", "content": "x"}])
    assert err.param == "prompt"


# --------------------------------------------------------------------------- body errors


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"not json", b'{"model": "m",}', b"\xff\xfe", b'{"model": NaN}']
)
def test_not_json(raw: bytes) -> None:
    err = bad("completions", raw)
    assert err.param is None
    assert "not valid JSON" in err.message


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"42", b"null", b'[{"model": "m"}]'])
def test_not_an_object(raw: bytes) -> None:
    err = bad("chat", raw)
    assert err.param is None
    assert err.message == "request body must be a JSON object"


@pytest.mark.parametrize("model", [None, "", 5, ["m"], {"name": "m"}, True])
def test_bad_model(model: Any) -> None:
    body: dict[str, Any] = {"prompt": "x"}
    if model is not None:
        body["model"] = model
    err = bad("completions", orjson.dumps(body))
    assert err.param == "model"
    assert "'model' is required" in err.message


@pytest.mark.parametrize("salt", [5, ["a"], {"a": 1}, True])
def test_bad_cache_salt(salt: Any) -> None:
    err = bad_body(model="m", prompt="x", cache_salt=salt)
    assert err.param == "cache_salt"


def test_cache_salt() -> None:
    assert completions(cache_salt="tenant-7").cache_salt == "tenant-7"
    assert completions(cache_salt=None).cache_salt == ""


def test_model_is_checked_before_other_fields() -> None:
    err = bad("completions", orjson.dumps({"prompt": 5, "stream": "maybe"}))
    assert err.param == "model"


# --------------------------------------------------------------------------- control headers


@pytest.mark.parametrize("name", SLO_TTFT_HEADERS)
def test_slo_ttft_headers(name: str) -> None:
    assert completions({name: "250"}).slo_ttft_ms == 250.0
    assert completions({name: " 12.5 "}).slo_ttft_ms == 12.5
    assert completions({name: ""}).slo_ttft_ms is None
    assert completions({name: "   "}).slo_ttft_ms is None


@pytest.mark.parametrize("name", SLO_TPOT_HEADERS)
def test_slo_tpot_headers(name: str) -> None:
    assert chat({name: "40"}).slo_tpot_ms == 40.0


def test_slo_current_name_wins_over_alias() -> None:
    headers = {SLO_TTFT_HEADERS[0]: "100", SLO_TTFT_HEADERS[1]: "900"}
    assert completions(headers).slo_ttft_ms == 100.0


@pytest.mark.parametrize("name", [*SLO_TTFT_HEADERS, *SLO_TPOT_HEADERS])
@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf", "1e999", "10ms"])
def test_bad_slo_values_name_the_header(name: str, value: str) -> None:
    err = bad("completions", b'{"model": "m", "prompt": "x"}', {name: value})
    assert err.param == name
    assert name in err.message


def test_slo_error_names_the_alias_actually_sent() -> None:
    err = bad("completions", b'{"model": "m", "prompt": "x"}', {"x-slo-ttft-ms": "soon"})
    assert err.param == "x-slo-ttft-ms"


@pytest.mark.parametrize("name", OBJECTIVE_HEADERS)
def test_objective_headers(name: str) -> None:
    assert completions({name: "batch"}).objective == "batch"
    assert completions({name: "  padded  "}).objective == "padded"
    assert completions({name: ""}).objective is None


@pytest.mark.parametrize("name", FAIRNESS_HEADERS)
def test_fairness_headers(name: str) -> None:
    assert completions({name: "tenant-a"}).fairness_id == "tenant-a"
    assert completions({name: "  "}).fairness_id == DEFAULT_FLOW


def test_header_pairs_prefer_the_first_name() -> None:
    p = completions(
        {
            OBJECTIVE_HEADERS[0]: "gie",
            OBJECTIVE_HEADERS[1]: "llm-d",
            FAIRNESS_HEADERS[0]: "gie-flow",
            FAIRNESS_HEADERS[1]: "llm-d-flow",
        }
    )
    assert (p.objective, p.fairness_id) == ("gie", "gie-flow")
    p = completions({OBJECTIVE_HEADERS[1]: "llm-d", FAIRNESS_HEADERS[1]: "llm-d-flow"})
    assert (p.objective, p.fairness_id) == ("llm-d", "llm-d-flow")


def test_model_rewrite_header() -> None:
    assert completions({MODEL_REWRITE_HEADER: "food-review-v2"}).model_rewrite == "food-review-v2"
    assert completions({MODEL_REWRITE_HEADER: " "}).model_rewrite is None


@pytest.mark.parametrize("name", [*OBJECTIVE_HEADERS, *FAIRNESS_HEADERS, MODEL_REWRITE_HEADER])
def test_over_long_identifiers(name: str) -> None:
    ok = "x" * MAX_HEADER_ID_LENGTH
    assert completions({name: ok}) is not None
    err = bad("completions", b'{"model": "m", "prompt": "x"}', {name: ok + "y"})
    assert err.param == name
    assert f"header '{name}' is longer than {MAX_HEADER_ID_LENGTH}" in err.message


def test_control_headers_cover_every_steering_header() -> None:
    assert set(OBJECTIVE_HEADERS) | set(FAIRNESS_HEADERS) <= CONTROL_HEADERS
    assert MODEL_REWRITE_HEADER in CONTROL_HEADERS
    assert {
        "x-gateway-destination-endpoint",
        "x-gateway-destination-endpoint-subset",
        "x-gateway-destination-endpoint-served",
    } <= CONTROL_HEADERS
    assert all(h == h.lower() for h in CONTROL_HEADERS)


def test_header_errors_come_after_body_checks() -> None:
    # A body error is reported first even when a header is bad too.
    err = bad("completions", b'{"prompt": "x"}', {SLO_TTFT_HEADERS[0]: "soon"})
    assert err.param == "model"


# --------------------------------------------------------------------------- prediction opt-in


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("false", False), ("TRUE", True), (" False ", False), ("", None)],
)
def test_prediction_based_header(value: str, expected: bool | None) -> None:
    assert completions({PREDICTION_BASED_HEADER: value}).prediction_based is expected


def test_prediction_based_header_absent_leaves_the_choice_to_the_default() -> None:
    assert completions().prediction_based is None


@pytest.mark.parametrize("value", ["yes", "1", "0", "on", "truee", "maybe"])
def test_prediction_based_header_other_values_are_400(value: str) -> None:
    err = bad("completions", b'{"model": "m", "prompt": "x"}', {PREDICTION_BASED_HEADER: value})
    assert err.param == PREDICTION_BASED_HEADER
    assert "must be true or false" in err.message


def test_prediction_based_header_is_not_forwarded() -> None:
    assert PREDICTION_BASED_HEADER in CONTROL_HEADERS
    assert PREDICTION_OFF_HEADER in CONTROL_HEADERS


@pytest.mark.parametrize("value", ["", "true", "false", "anything"])
def test_prediction_off_header_opts_out_whatever_its_value(value: str) -> None:
    assert completions({PREDICTION_OFF_HEADER: value}).prediction_based is False


def test_prediction_off_header_wins_over_an_opt_in() -> None:
    headers = {PREDICTION_BASED_HEADER: "true", PREDICTION_OFF_HEADER: "1"}
    assert completions(headers).prediction_based is False


# --------------------------------------------------------------------------- trust, bytes


def test_routing_headers_are_dropped_for_untrusted_clients() -> None:
    from sluicegate.requestcontrol.parse import ROUTING_HEADERS, without_routing_headers

    headers = {
        OBJECTIVE_HEADERS[0]: "critical",
        OBJECTIVE_HEADERS[1]: "critical",
        MODEL_REWRITE_HEADER: "other-lora",
        "x-gateway-destination-endpoint": "10.0.0.1:8000",
        "x-gateway-destination-endpoint-subset": "10.0.0.1:8000",
        SLO_TTFT_HEADERS[0]: "200",
        FAIRNESS_HEADERS[0]: "tenant-a",
        PREDICTION_BASED_HEADER: "false",
        "x-session-token": "abc",
    }
    kept = without_routing_headers(headers)
    assert set(kept) == {
        SLO_TTFT_HEADERS[0],
        FAIRNESS_HEADERS[0],
        PREDICTION_BASED_HEADER,
        "x-session-token",
    }
    p = completions(kept)
    assert (p.objective, p.model_rewrite) == (None, None)
    assert (p.slo_ttft_ms, p.fairness_id, p.prediction_based) == (200.0, "tenant-a", False)
    trusted = completions(headers)
    assert (trusted.objective, trusted.model_rewrite) == ("critical", "other-lora")
    plain = {"x-session-token": "abc"}
    assert without_routing_headers(plain) is plain  # nothing to drop: no copy
    assert ROUTING_HEADERS <= CONTROL_HEADERS  # and never forwarded either


@pytest.mark.parametrize(
    "value",
    ["caf\udcc3", "tab\there", "bell\x07", "\udcff\udcfe"],  # bytes that are not UTF-8, controls
)
def test_identifiers_must_be_printable_text(value: str) -> None:
    for header in (OBJECTIVE_HEADERS[0], FAIRNESS_HEADERS[0], MODEL_REWRITE_HEADER):
        err = bad("completions", orjson.dumps({"model": "m", "prompt": "x"}), {header: value})
        assert err.param == header
        assert "printable" in err.message
        orjson.loads(err.body())  # the error body encodes whatever the header held
    assert completions({FAIRNESS_HEADERS[0]: "tenant-ü-模型"}).fairness_id == "tenant-ü-模型"


def test_slo_header_with_bad_bytes_is_a_clean_400() -> None:
    err = bad(
        "completions", orjson.dumps({"model": "m", "prompt": "x"}), {"x-slo-ttft-ms": "\udcff"}
    )
    assert err.param == "x-slo-ttft-ms"
    assert orjson.loads(err.body())["error"]["message"] == err.message
