"""The simulated vLLM server over HTTP: the OpenAI SDK, raw requests, errors and lifecycle."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from sluicegate.sim import server as sim_server
from sluicegate.sim.server import Replica
from sluicegate.sim.text import render_chat
from sluicegate.tokens import count_tokens

MODEL = "tiny-llama"
IGNORE_EOS = {"ignore_eos": True}
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello to the simulator."},
]


def chat_prompt_tokens(messages: list[Any]) -> int:
    """Prompt tokens of ``messages``: ceil(bytes / 4) of the rendered chat prompt."""
    return math.ceil(len(render_chat(messages)) / 4)


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes | dict[str, Any]
) -> tuple[int, Any]:
    """POST ``body`` (raw bytes or a JSON object); the status and the decoded JSON answer."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    async with http.post(url, data=data, headers=headers) as response:
        raw = await response.read()
        try:
            return response.status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return response.status, raw.decode()


def sse_payloads(body: bytes) -> list[bytes]:
    """The ``data:`` payloads of a whole SSE body, checking every frame is well formed."""
    frames = body.split(b"\n\n")
    assert frames[-1] == b"", "the body must end with a complete frame"
    payloads = []
    for frame in frames[:-1]:
        assert frame.startswith(b"data: "), frame
        payloads.append(frame.removeprefix(b"data: "))
    return payloads


async def good_completion(http: aiohttp.ClientSession, replica: Replica) -> None:
    status, body = await post(
        http,
        replica.url + "/v1/completions",
        {"model": MODEL, "prompt": "still alive?", "max_tokens": 2},
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] <= 2


# ---------------------------------------------------------------------------- completions


async def test_completion(client: openai.AsyncOpenAI) -> None:
    prompt = "naïve café ☕ — the quick brown fox"  # multi-byte characters count as bytes
    response = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, extra_body=IGNORE_EOS
    )
    assert response.object == "text_completion"
    assert response.model == MODEL
    assert response.id.startswith("cmpl-")
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert count_tokens(choice.text) == 5
    usage = response.usage
    assert usage is not None
    assert usage.prompt_tokens == math.ceil(len(prompt.encode()) / 4)
    assert usage.completion_tokens == 5
    assert usage.total_tokens == usage.prompt_tokens + 5
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0


async def test_chat_completion(client: openai.AsyncOpenAI) -> None:
    response = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, extra_body=IGNORE_EOS
    )
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    message = response.choices[0].message
    assert message.role == "assistant"
    assert message.content is not None
    assert count_tokens(message.content) == 4
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == chat_prompt_tokens(MESSAGES)
    assert response.usage.completion_tokens == 4


async def test_without_ignore_eos_the_answer_stops_naturally(client: openai.AsyncOpenAI) -> None:
    response = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None
    content = response.choices[0].message.content or ""
    assert response.usage.completion_tokens == count_tokens(content) > 0
    assert response.usage.prompt_tokens + response.usage.completion_tokens < 4096


async def test_max_completion_tokens(client: openai.AsyncOpenAI) -> None:
    response = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, extra_body=IGNORE_EOS
    )
    assert response.usage is not None
    assert response.usage.completion_tokens == 3
    # max_completion_tokens wins over the deprecated max_tokens, as in vLLM.
    response = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=7,
        max_completion_tokens=2,
        extra_body=IGNORE_EOS,
    )
    assert response.usage is not None
    assert response.usage.completion_tokens == 2


async def test_content_as_text_parts(client: openai.AsyncOpenAI) -> None:
    as_parts: list[Any] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello, "},
                {"type": "text", "text": "simulated world."},
            ],
        }
    ]
    as_string: list[Any] = [{"role": "user", "content": "Hello, simulated world."}]
    parts = await client.chat.completions.create(
        model=MODEL, messages=as_parts, max_completion_tokens=2, extra_body=IGNORE_EOS
    )
    string = await client.chat.completions.create(
        model=MODEL, messages=as_string, max_completion_tokens=2, extra_body=IGNORE_EOS
    )
    assert parts.usage is not None
    assert string.usage is not None
    assert parts.usage.prompt_tokens == string.usage.prompt_tokens
    assert parts.usage.prompt_tokens == chat_prompt_tokens(as_string)


async def test_numeric_and_boolean_strings_are_accepted(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    status, body = await post(
        http,
        replica.url + "/v1/completions",
        {
            "model": MODEL,
            "prompt": "lax parsing",
            "max_tokens": "5",
            "temperature": "0",
            "top_p": "1.0",
            "ignore_eos": "true",
            "stream": "false",
        },
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 5
    status, body = await post(
        http,
        replica.url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": MESSAGES,
            "max_completion_tokens": "3",
            "temperature": "0.7",
            "ignore_eos": True,
        },
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 3


async def test_tokenize_counts_like_usage(replica: Replica, http: aiohttp.ClientSession) -> None:
    status, body = await post(http, replica.url + "/tokenize", {"messages": MESSAGES})
    assert status == 200, body
    assert body["count"] == chat_prompt_tokens(MESSAGES) == len(body["tokens"])
    assert body["max_model_len"] == 4096


# ---------------------------------------------------------------------------- streaming


async def test_chat_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    chunks = [chunk async for chunk in stream]
    assert len({chunk.id for chunk in chunks}) == 1
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    content = [chunk for chunk in chunks[1:] if chunk.choices]
    assert all(chunk.choices[0].delta.role is None for chunk in content)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in content)
    assert count_tokens(text) == 6
    reasons = [chunk.choices[0].finish_reason for chunk in content]
    assert reasons[-1] == "length"
    assert set(reasons[:-1]) <= {None}
    final = chunks[-1]
    assert final.choices == []
    assert final.usage is not None
    assert final.usage.completion_tokens == 6
    assert final.usage.prompt_tokens == chat_prompt_tokens(MESSAGES)
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_completion_stream_without_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model=MODEL, prompt="stream me", max_tokens=4, stream=True, extra_body=IGNORE_EOS
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks)
    assert count_tokens("".join(chunk.choices[0].text for chunk in chunks)) == 4
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_sse_framing_ends_with_done(
    replica: Replica, http: aiohttp.ClientSession, chat: bool
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    prompt: dict[str, Any] = {"messages": MESSAGES} if chat else {"prompt": "frames"}
    body = {
        "model": MODEL,
        **prompt,
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(replica.url + path, json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        payloads = sse_payloads(await response.read())
    assert payloads[-1] == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    with_choices = [c for c in chunks if c["choices"]]
    assert len(with_choices) == 3 + chat  # chat: the role chunk, then one chunk per token


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_continuous_usage_stats(client: openai.AsyncOpenAI, chat: bool) -> None:
    options: Any = {"include_usage": True, "continuous_usage_stats": True}
    if chat:
        stream: Any = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=5,
            stream=True,
            stream_options=options,
            extra_body=IGNORE_EOS,
        )
        prompt_tokens = chat_prompt_tokens(MESSAGES)
    else:
        stream = await client.completions.create(
            model=MODEL,
            prompt="continuous usage",
            max_tokens=5,
            stream=True,
            stream_options=options,
            extra_body=IGNORE_EOS,
        )
        prompt_tokens = count_tokens("continuous usage")
    chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is not None for chunk in chunks), "usage must be in every chunk"
    assert all(chunk.usage.prompt_tokens == prompt_tokens for chunk in chunks)
    completion = [chunk.usage.completion_tokens for chunk in chunks]
    # (chat: the role chunk counts 0) then one per token, then the final usage chunk.
    expected = [1, 2, 3, 4, 5, 5] if not chat else [0, 1, 2, 3, 4, 5, 5]
    assert completion == expected
    assert all(c.usage.total_tokens == prompt_tokens + c.usage.completion_tokens for c in chunks)


async def test_no_token_is_sent_before_its_step_ends(
    sim_cluster: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    # The engine computes a step ahead of the clock; its tokens are due only when the step's
    # (scaled) duration has passed. The server-side e2e latency, in simulated seconds, is
    # then a lower bound of what the client sees: it starts after the client sent the
    # request and ends when the last token is due.
    scale = 5.0
    replica = (await sim_cluster(replicas=1, time_scale=scale)).replicas[0]
    body = {"model": MODEL, "prompt": "pace", "max_tokens": 5, "ignore_eos": True, "stream": True}
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(replica.url + "/v1/completions", json=body) as response:
        payloads = sse_payloads(await response.read())
    elapsed = loop.time() - started
    assert len(payloads) == 5 + 1
    e2e = (await scrape(replica)).value("vllm:e2e_request_latency_seconds", "_sum")
    assert e2e > 0
    assert elapsed >= e2e * scale


async def test_server_stays_responsive_when_the_engine_runs_behind_the_clock(
    sim_cluster: Any, openai_client: Any, scrape: Any
) -> None:
    # At time_scale 1e-4 a ~2 ms step lasts 0.2 µs of wall time, less than computing it:
    # the engine is always behind. It must still yield to the HTTP handlers between steps,
    # so requests run concurrently and scrapes are answered while they do.
    replica = (await sim_cluster(replicas=1, time_scale=1e-4)).replicas[0]
    client = openai_client(replica)
    tasks = [
        asyncio.create_task(
            client.completions.create(
                model=MODEL, prompt=f"busy {i}", max_tokens=500, extra_body=IGNORE_EOS
            )
        )
        for i in range(4)
    ]
    most_running = 0.0
    while not all(task.done() for task in tasks):
        families = await scrape(replica)
        most_running = max(most_running, families.value("vllm:num_requests_running"))
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    assert most_running >= 2


# ---------------------------------------------------------------------------- errors

_TOO_LONG = "x" * (4000 * 4)  # 4,000 tokens of the tiny profile's 4,096
BAD_REQUESTS: list[Any] = [
    pytest.param(
        "/v1/completions", b'{"model": "tiny-llama", "prompt": ', 400, None, id="bad-json"
    ),
    pytest.param("/v1/completions", b"", 400, None, id="empty-body"),
    pytest.param("/v1/completions", b"[1, 2]", 400, None, id="not-an-object"),
    pytest.param("/v1/completions", {"prompt": "hi"}, 400, "model", id="no-model"),
    pytest.param("/v1/completions", {"model": MODEL}, 400, "prompt", id="no-prompt"),
    pytest.param("/v1/completions", {"model": MODEL, "prompt": 5}, 400, "prompt", id="prompt-int"),
    pytest.param(
        "/v1/completions", {"model": "nope", "prompt": "hi"}, 404, "model", id="unknown-model"
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": "abc"},
        400,
        "max_tokens",
        id="max_tokens-abc",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": True},
        400,
        "max_tokens",
        id="max_tokens-bool",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": 0},
        400,
        "max_tokens",
        id="max_tokens-0",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "stream": "maybe"},
        400,
        "stream",
        id="stream-maybe",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "temperature": "hot"},
        400,
        "temperature",
        id="temperature-hot",
    ),
    pytest.param(
        "/v1/completions", {"model": MODEL, "prompt": "hi", "n": 65}, 400, "n", id="n-over-limit"
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "stream": True, "stream_options": "yes"},
        400,
        "stream_options",
        id="stream_options-str",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": _TOO_LONG, "max_tokens": 200},
        400,
        "max_tokens",
        id="over-max-model-len",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": _TOO_LONG * 2},
        400,
        None,
        id="prompt-over-max-model-len",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": MODEL, "messages": "hi"},
        400,
        "messages",
        id="messages-str",
    ),
    pytest.param(
        "/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages", id="no-messages"
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": MODEL, "messages": ["hi"]},
        400,
        "messages",
        id="message-str",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ],
        },
        400,
        "messages",
        id="image-part",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
async def test_bad_request_is_an_openai_error(
    replica: Replica,
    http: aiohttp.ClientSession,
    path: str,
    body: bytes | dict[str, Any],
    status: int,
    param: str | None,
) -> None:
    got, answer = await post(http, replica.url + path, body)
    assert got == status, answer
    error = answer["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert error["param"] == param
    message = error["message"]
    if param is not None and "context length" not in message and "content part" not in message:
        assert param in message  # the message names the offending field too
    assert replica.engine.num_requests == 0
    await good_completion(http, replica)


async def test_server_survives_a_burst_of_bad_requests(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    requests = [p.values for p in BAD_REQUESTS]
    answers = await asyncio.gather(
        *(post(http, replica.url + path, body) for path, body, _, _ in requests)
    )
    assert [status for status, _ in answers] == [status for _, _, status, _ in requests]
    await good_completion(http, replica)


async def test_sdk_raises_typed_errors(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    assert not_found.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as too_long:
        await client.completions.create(model=MODEL, prompt=_TOO_LONG, max_tokens=200)
    assert "maximum context length is 4096 tokens" in too_long.value.message


async def test_oversized_body_is_rejected_with_413(
    sim_cluster: Any, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim_server, "MAX_BODY_BYTES", 64 * 1024)
    replica = (await sim_cluster(replicas=1)).replicas[0]
    status, answer = await post(
        http, replica.url + "/v1/completions", {"model": MODEL, "prompt": "y" * 100_000}
    )
    assert status == 413
    assert answer["error"]["code"] == 413
    assert replica.engine.num_requests == 0
    await good_completion(http, replica)


# ---------------------------------------------------------------------------- models and LoRA


async def test_models_lists_base_model_and_adapters(sim_cluster: Any, openai_client: Any) -> None:
    replica = (await sim_cluster(replicas=1, lora={"sql-lora": "/adapters/sql"})).replicas[0]
    models = await openai_client(replica).models.list()
    by_id = {model.id: model.model_dump() for model in models.data}
    assert list(by_id) == [MODEL, "sql-lora"]
    assert by_id[MODEL]["max_model_len"] == 4096
    assert by_id[MODEL]["parent"] is None
    assert by_id["sql-lora"]["parent"] == MODEL
    assert by_id["sql-lora"]["root"] == "/adapters/sql"


async def test_lora_load_and_unload(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    replica = (await sim_cluster(replicas=1, enable_lora=True)).replicas[0]
    client = openai_client(replica)
    load, unload = replica.url + "/v1/load_lora_adapter", replica.url + "/v1/unload_lora_adapter"

    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="ad", prompt="hi", max_tokens=1)
    async with http.post(load, json={"lora_name": "ad", "lora_path": "/p/ad"}) as response:
        assert response.status == 200
        assert "ad" in await response.text()
    status, answer = await post(http, load, {"lora_name": "ad", "lora_path": "/p/ad"})
    assert status == 400
    assert answer["error"]["param"] == "lora_name"
    status, answer = await post(http, load, {"lora_path": "/p/x"})
    assert status == 400

    assert [m.id for m in (await client.models.list()).data] == [MODEL, "ad"]
    response = await client.completions.create(
        model="ad", prompt="hi", max_tokens=2, extra_body=IGNORE_EOS
    )
    assert response.model == "ad"
    assert response.usage is not None
    assert response.usage.completion_tokens == 2

    async with http.post(unload, json={"lora_name": "ad"}) as response_:
        assert response_.status == 200
    status, answer = await post(http, unload, {"lora_name": "ad"})
    assert status == 404
    status, answer = await post(http, unload, {"lora_name": "never-loaded"})
    assert status == 404
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="ad", prompt="hi", max_tokens=1)
    assert [m.id for m in (await client.models.list()).data] == [MODEL]


async def test_health_and_version(replica: Replica, http: aiohttp.ClientSession) -> None:
    async with http.get(replica.url + "/health") as response:
        assert response.status == 200
    async with http.get(replica.url + "/version") as response:
        assert response.status == 200
        assert (await response.json())["version"].startswith("0.32")


# ---------------------------------------------------------------------------- headers


async def test_response_headers_identify_the_replica(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    assert len({r.port for r in cluster.replicas}) == 2
    for index, replica in enumerate(cluster.replicas):
        expected = {
            "x-inference-pod": f"sim-{index}",
            "x-inference-port": str(replica.port),
            "x-inference-namespace": "default",
        }
        client = openai_client(replica)
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt="who are you", max_tokens=1
        )
        assert {k: raw.headers.get(k) for k in expected} == expected
        async with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=1, stream=True
        ) as streamed:
            assert {k: streamed.headers.get(k) for k in expected} == expected
        async with http.post(
            replica.url + "/v1/completions", json={"model": "nope", "prompt": "x"}
        ) as error:
            assert error.status == 404
            assert {k: error.headers.get(k) for k in expected} == expected


# ---------------------------------------------------------------------------- prefix cache


async def test_repeated_long_prompt_hits_the_prefix_cache(
    replica: Replica, client: openai.AsyncOpenAI, scrape: Any
) -> None:
    prompt = "".join(f"Line {i}: a long shared system prompt. " for i in range(50))
    before = await scrape(replica)
    first = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, extra_body=IGNORE_EOS
    )
    second = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, extra_body=IGNORE_EOS
    )
    salted = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=2,
        extra_body={**IGNORE_EOS, "cache_salt": "another-tenant"},
    )
    after = await scrape(replica)

    assert first.usage is not None
    assert second.usage is not None
    assert salted.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert salted.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert 0 < cached < second.usage.prompt_tokens
    assert cached % 16 == 0  # whole KV blocks of the tiny profile
    assert salted.usage.prompt_tokens_details.cached_tokens == 0  # a salt isolates the cache

    def delta(name: str) -> float:
        return float(after.value(name) - before.value(name))

    assert delta("vllm:prefix_cache_hits") == cached
    assert delta("vllm:prompt_tokens_cached") == cached
    assert delta("vllm:prefix_cache_queries") >= 3 * first.usage.prompt_tokens


# ---------------------------------------------------------------------------- disconnects


async def test_client_disconnect_mid_stream_aborts_the_request(
    sim_cluster: Any, openai_client: Any, scrape: Any
) -> None:
    replica = (await sim_cluster(replicas=1, time_scale=1.0)).replicas[0]
    stream = await openai_client(replica).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2000, stream=True, extra_body=IGNORE_EOS
    )
    received = 0
    async for _chunk in stream:
        received += 1
        if received == 3:
            break
    assert replica.engine.num_requests == 1
    assert replica.engine.pool.usage > 0
    await stream.close()

    await wait_for(lambda: replica.engine.num_requests == 0)
    assert replica.engine.pool.usage == 0
    metrics = await scrape(replica)
    assert metrics.value("vllm:request_success", finished_reason="abort") == 1
    assert metrics.value("vllm:num_requests_running") == 0
    assert metrics.value("vllm:kv_cache_usage_perc") == 0
    await wait_for(lambda: not replica.driver.handles and not replica._transports)
    assert not replica.metrics._last_token_time  # no per-request state left behind


async def test_client_timeout_aborts_a_non_streaming_request(
    sim_cluster: Any, openai_client: Any
) -> None:
    replica = (await sim_cluster(replicas=1, time_scale=1.0)).replicas[0]
    client = openai_client(replica, timeout=0.2)
    with pytest.raises(openai.APITimeoutError):
        await client.completions.create(
            model=MODEL, prompt="a long answer", max_tokens=2000, extra_body=IGNORE_EOS
        )
    await wait_for(lambda: replica.engine.num_requests == 0)
    assert replica.engine.pool.usage == 0
    assert replica.engine.counters.finished_by_reason == {"abort": 1}


# ---------------------------------------------------------------------------- lifecycle


async def test_stop_refuses_connections_and_restart_serves_again(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    replica, other = cluster.replicas
    client = openai_client(replica)
    await client.completions.create(model=MODEL, prompt="before", max_tokens=3)
    port = replica.port

    await replica.stop()
    with pytest.raises(aiohttp.ClientConnectorError):
        await http.get(replica.url + "/health")
    with pytest.raises(openai.APIConnectionError):
        await client.completions.create(model=MODEL, prompt="while down", max_tokens=1)
    await good_completion(http, other)  # the rest of the pool is unaffected

    await replica.restart()
    assert replica.port == port
    response = await client.completions.create(
        model=MODEL, prompt="after", max_tokens=3, extra_body=IGNORE_EOS
    )
    assert response.usage is not None
    assert response.usage.completion_tokens == 3
    # A restarted server starts from an empty engine.
    assert replica.engine.counters.generation_tokens == 3


async def test_restart_forgets_adapters_loaded_at_run_time(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    replica = (await sim_cluster(replicas=1, lora=["from-cli"])).replicas[0]
    async with http.post(
        replica.url + "/v1/load_lora_adapter", json={"lora_name": "at-run-time"}
    ) as response:
        assert response.status == 200
    client = openai_client(replica)
    assert [m.id for m in (await client.models.list()).data] == [MODEL, "at-run-time", "from-cli"]
    await replica.restart()
    assert [m.id for m in (await client.models.list()).data] == [MODEL, "from-cli"]


async def test_stop_cuts_in_flight_streams(sim_cluster: Any, openai_client: Any) -> None:
    replica = (await sim_cluster(replicas=1, time_scale=1.0)).replicas[0]
    client = openai_client(replica)
    stream = await client.completions.create(
        model=MODEL, prompt="long", max_tokens=2000, stream=True, extra_body=IGNORE_EOS
    )
    await stream.__anext__()
    await asyncio.wait_for(replica.stop(), timeout=5)
    with pytest.raises(openai.APIConnectionError):
        async for _chunk in stream:
            pass
    assert replica.engine.num_requests == 0
    await replica.restart()
    response = await client.completions.create(model=MODEL, prompt="back", max_tokens=1)
    assert response.choices[0].text
