"""Generation fields the simulator honours as vLLM does: ``stop``, ``stop_token_ids``,
``include_stop_str_in_output``, ``min_tokens``, ``logprobs``/``top_logprobs`` and ``n``."""

from __future__ import annotations

import math
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from sluicegate.sim.server import Replica

MODEL = "tiny-llama"
PROMPT = "Tell me a story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": PROMPT}]


def body(chat: bool, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "ignore_eos": True, "max_tokens": 40}
    base.update({"messages": MESSAGES} if chat else {"prompt": PROMPT})
    base.update(fields)
    return base


def path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


async def call(
    http: aiohttp.ClientSession, replica: Replica, chat: bool, **fields: Any
) -> tuple[int, dict[str, Any]]:
    async with http.post(replica.url + path(chat), json=body(chat, **fields)) as response:
        return response.status, orjson.loads(await response.read())


async def whole(
    http: aiohttp.ClientSession, replica: Replica, chat: bool, **fields: Any
) -> dict[str, Any]:
    status, answer = await call(http, replica, chat, **fields)
    assert status == 200, answer
    return answer


async def stream(
    http: aiohttp.ClientSession, replica: Replica, chat: bool, **fields: Any
) -> list[dict[str, Any]]:
    """The JSON chunks of a streamed answer (without ``[DONE]``, which must end it)."""
    request = body(chat, stream=True, stream_options={"include_usage": True}, **fields)
    async with http.post(replica.url + path(chat), json=request) as response:
        assert response.status == 200
        raw = await response.read()
    frames = [f.removeprefix(b"data: ") for f in raw.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    return [orjson.loads(f) for f in frames[:-1]]


def text_of(chat: bool, choice: dict[str, Any]) -> str:
    return str(choice["message"]["content"] if chat else choice["text"])


def streamed_text(chat: bool, chunks: list[dict[str, Any]], index: int = 0) -> str:
    parts = []
    for chunk in chunks:
        for c in chunk["choices"]:
            if c["index"] == index:
                parts.append(c["delta"].get("content") or "" if chat else c["text"])
    return "".join(parts)


def finals(chunks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The choice entries that carry a finish reason, by choice index."""
    return {c["index"]: c for ch in chunks for c in ch["choices"] if c["finish_reason"]}


# ---------------------------------------------------------------------------- stop


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_stop_string_cuts_the_text_and_the_generation(
    replica: Replica, http: aiohttp.ClientSession, chat: bool
) -> None:
    full = text_of(chat, (await whole(http, replica, chat))["choices"][0])
    # A stop string across a token boundary, taken from the answer without stop.
    stop = full[42:47]
    pos = full.find(stop)
    tokens = (pos + len(stop) - 1) // 4 + 1
    generated_before = replica.engine.counters.generation_tokens

    answer = await whole(http, replica, chat, stop=["never-generated", stop])
    choice = answer["choices"][0]
    assert text_of(chat, choice) == full[:pos]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert answer["usage"]["completion_tokens"] == tokens
    # The engine generated only up to the stop: simulated time reflects the shorter answer.
    assert replica.engine.counters.generation_tokens - generated_before == tokens

    chunks = await stream(http, replica, chat, stop=stop)
    assert streamed_text(chat, chunks) == full[:pos]
    final = finals(chunks)[0]
    assert (final["finish_reason"], final["stop_reason"]) == ("stop", stop)
    assert chunks[-1]["usage"]["completion_tokens"] == tokens


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_streamed_text_holds_back_what_may_be_a_stop_string(
    replica: Replica, http: aiohttp.ClientSession, chat: bool
) -> None:
    """As vLLM, a stream withholds len(longest stop) - 1 characters until the answer ends,
    so no part of a stop string is ever sent."""
    full = text_of(chat, (await whole(http, replica, chat))["choices"][0])
    chunks = await stream(http, replica, chat, stop=["#not-there#"])  # 10 held back
    deltas = [
        (c["delta"].get("content", "") if chat else c["text"])
        for ch in chunks
        for c in ch["choices"]
        if not (chat and "role" in c["delta"])
    ]
    assert "".join(deltas) == full
    assert len(deltas) == 40  # one chunk per generated token
    assert deltas[:2] == ["", ""]  # the first 8 characters are within the hold-back
    assert deltas[-1] == full[-14:]  # the last token's 4 and the 10 held back


async def test_include_stop_str_in_output(replica: Replica, http: aiohttp.ClientSession) -> None:
    full = (await whole(http, replica, False))["choices"][0]["text"]
    stop = full[21:26]
    pos = full.find(stop)
    answer = await whole(http, replica, False, stop=stop, include_stop_str_in_output=True)
    assert answer["choices"][0]["text"] == full[: pos + len(stop)]
    chunks = await stream(http, replica, False, stop=stop, include_stop_str_in_output=True)
    assert streamed_text(False, chunks) == full[: pos + len(stop)]


async def test_stop_token_ids_end_with_the_token(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    full = (await whole(http, replica, False))["choices"][0]["text"]
    pieces = [full[i : i + 4] for i in range(0, len(full), 4)]
    target = pieces[9]
    first = pieces.index(target)
    token_id = int.from_bytes(target.encode(), "little")
    answer = await whole(http, replica, False, stop_token_ids=[7, token_id])
    choice = answer["choices"][0]
    assert choice["text"] == "".join(pieces[: first + 1])  # the stop token's text is kept
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", token_id)
    assert answer["usage"]["completion_tokens"] == first + 1


async def test_min_tokens_defers_the_stop(replica: Replica, http: aiohttp.ClientSession) -> None:
    full = (await whole(http, replica, False))["choices"][0]["text"]
    # Every generated token starts with a space, so " " stops at once...
    at_once = await whole(http, replica, False, stop=" ")
    assert (at_once["choices"][0]["text"], at_once["usage"]["completion_tokens"]) == ("", 1)
    # ...unless min_tokens defers it: it may end only the fifth token, cut before its space.
    deferred = await whole(http, replica, False, stop=" ", min_tokens=5)
    assert deferred["choices"][0]["text"] == full[:16]
    assert deferred["usage"]["completion_tokens"] == 5


async def test_min_tokens_delays_the_natural_end(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    natural = await whole(http, replica, False, ignore_eos=False, max_tokens=2000)
    length = natural["usage"]["completion_tokens"]
    assert natural["choices"][0]["finish_reason"] == "stop"
    longer = await whole(
        http, replica, False, ignore_eos=False, max_tokens=2000, min_tokens=length + 5
    )
    assert longer["usage"]["completion_tokens"] == length + 5
    assert longer["choices"][0]["finish_reason"] == "stop"
    assert longer["choices"][0]["stop_reason"] is None  # the end-of-sequence token


async def test_a_stop_that_never_occurs_changes_nothing(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    plain = await whole(http, replica, True)
    stopped = await whole(http, replica, True, stop=["\n\nUser:"])
    assert stopped["choices"][0]["message"] == plain["choices"][0]["message"]
    assert stopped["choices"][0]["finish_reason"] == "length"
    assert stopped["choices"][0]["stop_reason"] is None


# ---------------------------------------------------------------------------- logprobs


def check_completion_logprobs(lp: dict[str, Any], text: str, k: int, offset: int = 0) -> None:
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert "".join(lp["tokens"]) == text
    n = len(lp["tokens"])
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    expected_offset = offset
    for token, value, top, at in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"], strict=True
    ):
        assert at == expected_offset
        expected_offset += len(token)
        assert value <= 0
        # The sampled token first, then the top k: k + 1 entries unless it is among them.
        assert next(iter(top)) == token
        assert top[token] == value
        assert len(top) in (k, k + 1) if k else len(top) == 1
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-9


async def test_completion_logprobs(replica: Replica, http: aiohttp.ClientSession) -> None:
    answer = await whole(http, replica, False, logprobs=5)
    choice = answer["choices"][0]
    check_completion_logprobs(choice["logprobs"], choice["text"], 5)
    assert len(choice["logprobs"]["tokens"]) == answer["usage"]["completion_tokens"]
    without = await whole(http, replica, False)
    assert without["choices"][0]["logprobs"] is None

    only_sampled = await whole(http, replica, False, logprobs=0)
    check_completion_logprobs(only_sampled["choices"][0]["logprobs"], choice["text"], 0)

    chunks = await stream(http, replica, False, logprobs=5)
    offset = 0
    merged: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    for chunk in chunks[:-1]:
        c = chunk["choices"][0]
        check_completion_logprobs(c["logprobs"], c["text"], 5, offset)
        offset += len(c["text"])
        for key, values in merged.items():
            values.extend(c["logprobs"][key])
    for key, values in merged.items():
        assert values == choice["logprobs"][key]


def check_chat_logprobs(lp: dict[str, Any], text: str, k: int) -> None:
    assert set(lp) == {"content"}
    assert "".join(entry["token"] for entry in lp["content"]) == text
    for entry in lp["content"]:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0
        top = entry["top_logprobs"]
        assert len(top) == k
        assert len({t["token"] for t in top}) == k
        for alt in top:
            assert set(alt) == {"token", "logprob", "bytes"}
            assert alt["bytes"] == list(alt["token"].encode())
        if k:  # vLLM lists the sampled token first
            assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"])


async def test_chat_logprobs(replica: Replica, http: aiohttp.ClientSession) -> None:
    answer = await whole(http, replica, True, logprobs=True, top_logprobs=3)
    choice = answer["choices"][0]
    check_chat_logprobs(choice["logprobs"], choice["message"]["content"], 3)
    assert len(choice["logprobs"]["content"]) == answer["usage"]["completion_tokens"]

    bare = await whole(http, replica, True, logprobs=True)
    check_chat_logprobs(bare["choices"][0]["logprobs"], choice["message"]["content"], 0)

    chunks = await stream(http, replica, True, logprobs=True, top_logprobs=3)
    content: list[Any] = []
    for chunk in chunks[:-1]:
        c = chunk["choices"][0]
        if "role" in c["delta"]:
            assert c["logprobs"] is None
            continue
        check_chat_logprobs(c["logprobs"], c["delta"]["content"], 3)
        content.extend(c["logprobs"]["content"])
    assert content == choice["logprobs"]["content"]


@pytest.mark.parametrize(
    ("chat", "fields", "message", "param"),
    [
        (
            False,
            {"logprobs": 21},
            "Requested sample logprobs of 21, which is greater than max allowed: 20 "
            "(parameter=logprobs, value=21)",
            "logprobs",
        ),
        (
            True,
            {"logprobs": True, "top_logprobs": 21},
            "Requested sample logprobs of 21, which is greater than max allowed: 20 "
            "(parameter=logprobs, value=21)",
            "logprobs",
        ),
        (False, {"logprobs": -1}, "Requested sample logprobs of 128256", "logprobs"),
        (False, {"logprobs": -2}, "`logprobs` must be a positive value or -1.", "logprobs"),
        (
            True,
            {"top_logprobs": 2},
            "when using `top_logprobs`, `logprobs` must be set to true.",
            "top_logprobs",
        ),
        (False, {"stop": ["ok", ""]}, "stop cannot contain an empty string.", "stop"),
        (False, {"stop": 5}, "'stop' must be a string or a list of strings", "stop"),
        (False, {"stop_token_ids": ["x"]}, "stop_token_ids", "stop_token_ids"),
        (
            False,
            {"min_tokens": 41},
            "min_tokens must be less than or equal to max_tokens=40, got 41.",
            "min_tokens",
        ),
        (False, {"n": 0}, "n must be at least 1, got 0.", "n"),
        (False, {"n": 65}, "n must be at most 64, got 65.", "n"),
        (True, {"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2.", "n"),
    ],
)
async def test_limits_answer_vllms_400(
    replica: Replica,
    http: aiohttp.ClientSession,
    chat: bool,
    fields: dict[str, Any],
    message: str,
    param: str,
) -> None:
    status, answer = await call(http, replica, chat, **fields)
    assert status == 400
    error = answer["error"]
    assert message in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)


# ---------------------------------------------------------------------------- n


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_n_choices_are_sequences_of_their_own(
    replica: Replica, http: aiohttp.ClientSession, chat: bool
) -> None:
    single = await whole(http, replica, chat, max_tokens=12)
    finished_before = replica.engine.counters.finished_by_reason.get("length", 0)
    answer = await whole(http, replica, chat, max_tokens=12, n=3)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    texts = [text_of(chat, c) for c in choices]
    assert texts[0] == text_of(chat, single["choices"][0])  # choice 0 answers as n=1 does
    assert len(set(texts)) == 3
    assert answer["usage"]["completion_tokens"] == 36
    assert answer["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
    # Each choice ran in the engine: three finished sequences.
    assert replica.engine.counters.finished_by_reason["length"] - finished_before == 3

    chunks = await stream(http, replica, chat, max_tokens=12, n=3)
    for index, text in enumerate(texts):
        assert streamed_text(chat, chunks, index) == text
    assert sorted(finals(chunks)) == [0, 1, 2]
    assert chunks[-1]["usage"]["completion_tokens"] == 36
    if chat:  # one role chunk per choice, before any content
        roles = [c["index"] for ch in chunks[:3] for c in ch["choices"] if "role" in c["delta"]]
        assert roles == [0, 1, 2]


async def test_n_with_stop_and_logprobs_per_choice(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    answer = await whole(http, replica, False, n=2, logprobs=1, stop=" the")
    total = 0
    for choice in answer["choices"]:
        lp = choice["logprobs"]
        assert "".join(lp["tokens"]).startswith(choice["text"])
        assert " the" not in choice["text"]
        total += len(lp["tokens"])
    assert answer["usage"]["completion_tokens"] == total


async def test_the_openai_sdk_reads_the_new_fields(client: openai.AsyncOpenAI) -> None:
    completion = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=30, n=2, logprobs=2, stop=[" the", " and"]
    )
    assert [c.index for c in completion.choices] == [0, 1]
    for c in completion.choices:
        assert c.logprobs is not None
        assert c.logprobs.tokens is not None
        assert "".join(c.logprobs.tokens).startswith(c.text)

    chat = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=10,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens = 0
    async for chunk in chat:
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                tokens += len(choice.logprobs.content)
                assert len(choice.logprobs.content[0].top_logprobs) == 2
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == tokens
