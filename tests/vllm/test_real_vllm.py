"""The gateway in front of two real vLLM servers on CPU (run with ``scripts/test-vllm``).

A release check, not part of the everyday suite: it needs the vLLM environment that
``scripts/test-vllm`` installs (``.venv-vllm``, named by ``SLUICEGATE_VLLM_PYTHON``) and
is skipped without it. Both servers serve a tiny random Llama built locally
(:mod:`vllm_harness`); the gateway runs in this process with the default scheduling
profile (queue, KV-cache and prefix-cache scorers), exactly as ``sluicegate serve
--config`` builds it.

What only a real server shows, and is checked here:

- the OpenAI fields vLLM really sends (usage, ``prompt_tokens_details``, SSE framing,
  error bodies) pass through, and the gateway's own metrics count them right;
- the Prometheus names and labels vLLM really exposes are scraped into
  :class:`~sluicegate.datalayer.endpoint.EngineMetrics` (CPU block size 128, KV blocks,
  running and waiting gauges, KV use) and steer requests away from a queueing server;
- a repeated long prompt stays on one server and hits its prefix cache for real;
- a public model name is rewritten both ways; a client that goes away aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import aiohttp
import openai
import orjson
import pytest
from vllm_harness import (
    BLOCK_SIZE_CPU,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_NAME,
    START_TIMEOUT_S,
    VllmServer,
    ensure_model,
    metric_value,
    start_servers,
    vllm_python,
)

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway
from sluicegate.gateway.proxy import SERVED_HEADER

VLLM_PYTHON = vllm_python()

# Server start-up (about 30 s each on 2 cores, both at once) counts against the first test.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

POOL = "vllm-pool"
# KV cache per server in GiB (vLLM's CPU default is 4): 1 GiB is 4096 blocks of 128 tokens
# of this float32 model, plenty for these tests.
KV_CACHE_GIB = "1"


def server_env(index: int) -> dict[str, str]:
    """Per-server environment: loopback only, a bounded KV cache, one core each."""
    cores = os.cpu_count() or 1
    return {
        # vLLM's engine talks to its worker over a message queue bound to the host's
        # address unless told otherwise; keep it on loopback.
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
        # "auto" binds every server's worker to the same core; give each its own.
        "VLLM_CPU_OMP_THREADS_BIND": str(index % cores),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    """Two vLLM servers on free loopback ports, killed (whole process groups) at the end."""
    work = tmp_path_factory.mktemp("vllm")
    model = ensure_model(VLLM_PYTHON, work / MODEL_NAME)
    servers = start_servers(
        VLLM_PYTHON, model, work / "logs", count=2, timeout=START_TIMEOUT_S, env=server_env
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def pool_doc(servers: list[VllmServer]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": POOL},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "endpoints": [{"address": s.url, "name": f"vllm-{i}"} for i, s in enumerate(servers)],
        },
    }


async def wait_for(condition: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_gateway(
    servers: list[VllmServer], *docs: dict[str, Any]
) -> AsyncIterator[Gateway]:
    """A gateway on a free port in front of ``servers`` (plus extra configuration
    documents), once it has scraped both servers and listed their models."""
    config = build_config([pool_doc(servers), *docs], "<test-vllm>")
    gw = Gateway(config)
    await gw.start("127.0.0.1", 0)
    try:
        endpoints = gw.datastore.all_endpoints()
        await wait_for(
            lambda: all(e.metrics is not None and e.models.known for e in endpoints),
            10.0,
            "the first scrape and model list of both servers",
        )
        yield gw
    finally:
        await gw.stop()


@pytest.fixture
async def gateway(vllm_servers: list[VllmServer]) -> AsyncIterator[Gateway]:
    """The gateway with the default scheduling profile (no EndpointPickerConfig), as
    ``sluicegate serve --config`` runs it."""
    async with running_gateway(vllm_servers) as gw:
        assert gw.config.picker is None
        yield gw


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def client(gw: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{gw.port}/v1",
        api_key="no-key-is-checked-here",
        max_retries=0,
        timeout=60,
    )


def addresses(servers: list[VllmServer]) -> set[str]:
    return {s.address for s in servers}


def long_prompt(seed: int, words: int = 500) -> str:
    """A few hundred pseudo-words: several 128-token KV blocks of this tokenizer."""
    rng = random.Random(seed)
    syllables = "ka lo mi ne ru sa ti vo ze pa de fi go ha mar dun kel bro".split()
    return " ".join(
        "".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(words)
    )


async def sse_events(resp: aiohttp.ClientResponse) -> list[bytes]:
    """The ``data:`` payloads of an SSE answer, in order (``[DONE]`` included)."""
    body = await resp.read()
    events = [e.strip() for e in body.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events), body[:500]
    return [e[len(b"data: ") :] for e in events]


async def server_metric(http: aiohttp.ClientSession, server: VllmServer, name: str) -> float:
    """One of the server's own counters or gauges, e.g. ``vllm:prefix_cache_hits_total``."""
    async with http.get(f"{server.url}/metrics") as resp:
        return metric_value(await resp.text(), name)


async def gateway_metrics(http: aiohttp.ClientSession, gw: Gateway) -> str:
    async with http.get(f"http://127.0.0.1:{gw.port}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


BY_MODEL = {"model_name": MODEL_NAME, "target_model_name": MODEL_NAME}


# ---------------------------------------------------------------------- requests


async def test_completions_and_chat_through_the_gateway(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    base = f"http://127.0.0.1:{gateway.port}"
    served = addresses(vllm_servers)

    # Non-streaming completion, raw: vLLM's own body comes back with its usage.
    body = {"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 7, "ignore_eos": True}
    async with http.post(f"{base}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_HEADER] in served
        done = await resp.json()
    assert done["object"] == "text_completion"
    assert done["model"] == MODEL_NAME
    assert done["id"].startswith("cmpl-")
    assert done["system_fingerprint"].startswith("vllm-")
    assert done["choices"][0]["finish_reason"] == "length"
    usage = done["usage"]
    assert usage["completion_tokens"] == 7
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7

    # Streaming completion with usage: SSE framing and the final usage chunk.
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(f"{base}/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers[SERVED_HEADER] in served
        events = await sse_events(resp)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert len(text_chunks) == 7
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 7
    assert chunks[-1]["usage"]["prompt_tokens"] == usage["prompt_tokens"]

    # Chat through the openai SDK, not streaming and streaming, content as text parts.
    oai = client(gateway)
    chat = await oai.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say something."},
        ],
        max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    assert chat.object == "chat.completion"
    assert chat.model == MODEL_NAME
    assert chat.choices[0].message.role == "assistant"
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 5
    assert chat.usage.prompt_tokens > usage["prompt_tokens"]  # the template adds tokens

    messages: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Stream, please."}]}
    ]
    stream = await oai.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        max_completion_tokens=6,
        stream=True,
        # vLLM's extension: usage in every chunk, as guidellm asks for it.
        stream_options=cast(Any, {"include_usage": True, "continuous_usage_stats": True}),
        extra_body={"ignore_eos": True},
    )
    parts = [c async for c in stream]
    assert parts[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in parts if c.choices]
    assert finish[-1] == "length"
    assert parts[-1].usage is not None
    assert parts[-1].usage.completion_tokens == 6
    await oai.close()

    async with http.get(f"{base}/ready") as resp:
        assert resp.status == 200
        assert (await resp.json())["ready_endpoints"] == 2

    # The gateway's own model list carries what the servers list.
    async with http.get(f"{base}/v1/models") as resp:
        models = await resp.json()
    assert MODEL_NAME in {m["id"] for m in models["data"]}

    # Requests by model, token histograms from the servers' usage, TTFT for streams.
    text = await gateway_metrics(http, gateway)
    assert metric_value(text, "inference_objective_request_total", **BY_MODEL) == 4
    assert metric_value(text, "inference_objective_output_tokens_sum", **BY_MODEL) == 7 + 7 + 5 + 6
    assert metric_value(text, "inference_objective_input_tokens_count", **BY_MODEL) == 4
    assert metric_value(text, "inference_objective_request_ttft_seconds_count", **BY_MODEL) == 2
    assert metric_value(text, "inference_objective_request_error_total") == 0
    assert metric_value(text, "inference_pool_ready_pods", name=POOL) == 2


# ---------------------------------------------------------------------- scraped metrics


async def test_endpoint_metrics_are_scraped_from_the_real_servers(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    by_address = {s.address: s for s in vllm_servers}
    endpoints = gateway.datastore.all_endpoints()
    assert len(endpoints) == 2
    now = gateway.clock.now()
    for endpoint in endpoints:
        m = endpoint.metrics
        assert m is not None
        assert now - m.scraped_at < gateway.staleness_s
        assert not endpoint.health.ejected
        assert endpoint.models.base_models == {MODEL_NAME}
        assert not endpoint.models.adapters
        # What the server itself says in cache_config_info.
        async with http.get(f"{by_address[endpoint.address].url}/metrics") as resp:
            exposition = await resp.text()
        info = next(
            line for line in exposition.splitlines() if line.startswith("vllm:cache_config_info{")
        )
        assert f'block_size="{BLOCK_SIZE_CPU}"' in info
        assert m.block_size == BLOCK_SIZE_CPU
        assert m.num_gpu_blocks is not None
        assert m.num_gpu_blocks > 0
        assert f'num_gpu_blocks="{m.num_gpu_blocks}"' in info
        # VLLM_CPU_KVCACHE_SPACE over (K and V x 2 layers x 4 heads x 32 dims x 4 bytes)
        # per token: 1 GiB is 524,288 tokens, 4096 blocks of 128.
        kv_bytes_per_token = 2 * 2 * 4 * 32 * 4
        assert m.num_gpu_blocks == int(KV_CACHE_GIB) * 2**30 // kv_bytes_per_token // 128
        assert endpoint.kv_capacity_tokens == m.num_gpu_blocks * BLOCK_SIZE_CPU
        assert (m.waiting, m.running) == (0, 0)
        assert 0.0 <= m.kv_usage < 0.01


async def test_scraped_queue_steers_new_requests_to_the_idle_server(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    """Load put on one server behind the gateway's back shows up in its scrapes (running,
    waiting, KV use) and the gateway sends new requests to the other one."""
    busy, idle = vllm_servers
    busy_endpoint = next(e for e in gateway.datastore.all_endpoints() if e.address == busy.address)
    body = {
        "model": MODEL_NAME,
        "prompt": "Tell me a long story.",
        "max_tokens": MAX_MODEL_LEN - 64,
        "ignore_eos": True,
    }

    async def occupy() -> None:
        async with http.post(f"{busy.url}/v1/completions", json=body) as resp:
            await resp.read()

    load = [asyncio.create_task(occupy()) for _ in range(MAX_NUM_SEQS + 2)]
    try:
        await wait_for(
            lambda: (
                busy_endpoint.metrics is not None
                and busy_endpoint.metrics.running == MAX_NUM_SEQS
                and busy_endpoint.metrics.waiting == 2
            ),
            10.0,
            f"a scrape of {busy.address} showing {MAX_NUM_SEQS} running and 2 waiting",
        )
        assert busy_endpoint.metrics is not None
        assert busy_endpoint.metrics.kv_usage > 0.0
        assert not any(t.done() for t in load), "the load finished too soon to test anything"
        oai = client(gateway)
        for _ in range(3):
            raw = await oai.completions.with_raw_response.create(
                model=MODEL_NAME, prompt="Hello there", max_tokens=2
            )
            assert raw.headers[SERVED_HEADER] == idle.address
        await oai.close()
    finally:
        for task in load:
            task.cancel()  # closing the connections aborts the requests on the server
        await asyncio.gather(*load, return_exceptions=True)
    await wait_for(
        lambda: (
            busy_endpoint.metrics is not None
            and busy_endpoint.metrics.running == 0
            and busy_endpoint.metrics.waiting == 0
        ),
        10.0,
        f"{busy.address} to report no running or waiting request",
    )


async def test_public_model_name_is_rewritten_both_ways(
    vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    """An InferenceModel maps a public name to the served one: vLLM sees ``tiny-llama``,
    the client sees its own name in every body and SSE chunk, usage intact."""
    public = "public-llama"
    model_doc = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": public},
        "spec": {
            "modelName": public,
            "poolRef": {"name": POOL},
            "targetModels": [{"name": MODEL_NAME, "weight": 1}],
        },
    }
    async with running_gateway(vllm_servers, model_doc) as gw:
        base = f"http://127.0.0.1:{gw.port}"
        requests: list[tuple[str, dict[str, Any]]] = [
            ("completions", {"prompt": "Hello there"}),
            ("chat/completions", {"messages": [{"role": "user", "content": "Hello there"}]}),
        ]
        for path, fields in requests:
            for stream in (False, True):
                body: dict[str, Any] = {
                    "model": public,
                    "max_tokens": 30,
                    "ignore_eos": True,
                    "stream": stream,
                    **fields,
                }
                if stream:
                    body["stream_options"] = {"include_usage": True}
                async with http.post(f"{base}/v1/{path}", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    payloads = await sse_events(resp) if stream else [await resp.read()]
                if stream:
                    assert payloads.pop() == b"[DONE]"
                answers = [orjson.loads(p) for p in payloads]
                assert {a["model"] for a in answers} == {public}, (path, stream)
                assert answers[-1]["usage"]["completion_tokens"] == 30
        text = await gateway_metrics(http, gw)
    labels = {"model_name": public, "target_model_name": MODEL_NAME}
    assert metric_value(text, "inference_objective_request_total", **labels) == 4
    assert metric_value(text, "inference_objective_output_tokens_sum", **labels) == 4 * 30


# ---------------------------------------------------------------------- prefix affinity


async def test_repeated_long_prompt_stays_on_one_server_and_hits_its_prefix_cache(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    base = f"http://127.0.0.1:{gateway.port}"
    by_address = {s.address: s for s in vllm_servers}
    hits = "vllm:prefix_cache_hits_total"
    hits_before = {a: await server_metric(http, s, hits) for a, s in by_address.items()}
    prompt = long_prompt(seed=2)
    repeats = 4
    served: list[str] = []
    usages: list[dict[str, Any]] = []
    for i in range(repeats):
        body = {
            "model": MODEL_NAME,
            "prompt": prompt,
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": i % 2 == 1,
            "stream_options": {"include_usage": True},
        }
        if not body["stream"]:
            del body["stream_options"]
        async with http.post(f"{base}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            served.append(resp.headers[SERVED_HEADER])
            if body["stream"]:
                events = await sse_events(resp)
                usages.append(orjson.loads(events[-2])["usage"])
            else:
                usages.append((await resp.json())["usage"])
        # Let a scrape land between requests, as traffic spaced in time would.
        await asyncio.sleep(0.2)

    prompt_tokens = usages[0]["prompt_tokens"]
    assert 3 * BLOCK_SIZE_CPU < prompt_tokens < MAX_MODEL_LEN - 4
    assert len(set(served)) == 1, f"repeated prompt spread over {served}"
    home = served[0]
    other = next(a for a in by_address if a != home)

    # vLLM reports the cached share of each prompt: whole 128-token blocks after the first.
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    full_blocks = (prompt_tokens - 1) // BLOCK_SIZE_CPU * BLOCK_SIZE_CPU
    assert cached[0] == 0
    assert cached[1:] == [full_blocks] * (repeats - 1)

    # The servers' own counters agree: hits on the home server only.
    hits_after = {a: await server_metric(http, s, hits) for a, s in by_address.items()}
    assert hits_after[home] - hits_before[home] == full_blocks * (repeats - 1)
    assert hits_after[other] == hits_before[other]

    # ... and the gateway scraped them into the endpoint's metrics.
    endpoint = next(e for e in gateway.datastore.all_endpoints() if e.address == home)
    await wait_for(
        lambda: (
            endpoint.metrics is not None and endpoint.metrics.prefix_cache_hits >= hits_after[home]
        ),
        5.0,
        "the gateway to scrape the new prefix-cache hits",
    )

    # The gateway's histograms saw the cached tokens and its own prefix matches: none
    # for the first request, the whole prompt for the repeats.
    text = await gateway_metrics(http, gateway)
    assert metric_value(text, "inference_objective_request_total", **BY_MODEL) == repeats
    assert metric_value(
        text, "inference_objective_prompt_cached_tokens_sum", **BY_MODEL
    ) == full_blocks * (repeats - 1)
    ratio = "inference_extension_prefix_indexer_hit_ratio"
    assert metric_value(text, f"{ratio}_count") == repeats
    assert metric_value(text, f"{ratio}_bucket", le="0.9") == 1
    assert metric_value(text, f"{ratio}_sum") == repeats - 1


async def test_prompts_sharing_a_long_prefix_keep_their_server(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    """A long shared prefix (a document) with a different question each time: each family
    stays on the server that served it first, whichever that was, and hits its cache."""
    base = f"http://127.0.0.1:{gateway.port}"
    homes: dict[int, set[str]] = {3: set(), 4: set()}
    cached: dict[int, list[int]] = {3: [], 4: []}
    for _ in range(3):
        for seed in homes:
            body = {
                "model": MODEL_NAME,
                "prompt": long_prompt(seed) + f" question {len(cached[seed])}",
                "max_tokens": 2,
                "ignore_eos": True,
            }
            async with http.post(f"{base}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                homes[seed].add(resp.headers[SERVED_HEADER])
                usage = (await resp.json())["usage"]
                cached[seed].append(usage["prompt_tokens_details"]["cached_tokens"])
            await asyncio.sleep(0.1)
    for seed, served in homes.items():
        assert len(served) == 1, f"prompt family {seed} spread over {served}"
        assert cached[seed][0] == 0
        assert all(c >= 3 * BLOCK_SIZE_CPU for c in cached[seed][1:]), cached


# ---------------------------------------------------------------------- errors and aborts


async def test_server_errors_pass_through_and_unknown_models_are_answered_here(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    base = f"http://127.0.0.1:{gateway.port}"
    # Longer than --max-model-len: vLLM's own 400 comes back as vLLM wrote it, not retried.
    body = {"model": MODEL_NAME, "prompt": long_prompt(seed=5, words=2500), "max_tokens": 4}
    async with http.post(f"{base}/v1/completions", json=body) as resp:
        assert resp.status == 400
        assert resp.headers[SERVED_HEADER] in addresses(vllm_servers)
        assert "x-sluicegate-dropped-reason" not in resp.headers
        error = (await resp.json())["error"]
    assert str(MAX_MODEL_LEN) in error["message"]
    assert error["type"] in {"BadRequestError", "invalid_request_error"}

    # A model no server lists: the gateway answers itself, as vLLM would.
    direct_body = {"model": "no-such-model", "prompt": "hi", "max_tokens": 1}
    async with http.post(f"{vllm_servers[0].url}/v1/completions", json=direct_body) as resp:
        direct_status = resp.status
    async with http.post(f"{base}/v1/completions", json=direct_body) as resp:
        assert resp.status == direct_status == 404
        assert resp.headers["x-sluicegate-dropped-reason"] == "unknown-model"
        assert (await resp.json())["error"]["code"] == "model_not_found"

    assert all(not e.health.ejected for e in gateway.datastore.all_endpoints())
    text = await gateway_metrics(http, gateway)
    errors = "inference_objective_request_error_total"
    assert metric_value(text, errors, **BY_MODEL, error_code="400") == 1
    # Made-up model names share one series (they must not fill the label sets).
    assert metric_value(text, errors, model_name="_unknown", error_code="404") == 1
    assert metric_value(text, "sluicegate_upstream_retries_total") == 0


async def test_client_disconnect_aborts_the_request_on_the_server(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    """Closing a stream mid-generation makes vLLM stop generating, not finish the request."""
    by_address = {s.address: s for s in vllm_servers}
    generated = "vllm:generation_tokens_total"
    before = {a: await server_metric(http, s, generated) for a, s in by_address.items()}
    max_tokens = MAX_MODEL_LEN - 64
    body = {
        "model": MODEL_NAME,
        "prompt": "Tell me a very long story.",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"http://127.0.0.1:{gateway.port}/v1/completions", json=body)
        assert resp.status == 200
        server = by_address[resp.headers[SERVED_HEADER]]
        got = b""
        while got.count(b"data:") < 5:
            got += await resp.content.readany()
        resp.close()  # the client goes away mid-stream
    endpoint = next(e for e in gateway.datastore.all_endpoints() if e.address == server.address)
    await wait_for(
        lambda: (
            endpoint.inflight.requests == 0
            and endpoint.metrics is not None
            and endpoint.metrics.running == 0
        ),
        10.0,
        "the gateway to release the request and the server to stop running it",
    )
    tokens = await server_metric(http, server, generated) - before[server.address]
    assert 5 <= tokens < max_tokens / 2, f"the server generated {tokens} of {max_tokens} tokens"


# ---------------------------------------------------------------------- other routes


async def test_tokenize_and_detokenize_pass_through(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    """vLLM's own /tokenize and /detokenize through the gateway (the tokenize answer's
    shape is the one the simulator copies)."""
    base = f"http://127.0.0.1:{gateway.port}"
    text = "Hello there, general"
    body = {"model": MODEL_NAME, "prompt": text, "add_special_tokens": False}
    async with http.post(f"{base}/tokenize", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers[SERVED_HEADER] in addresses(vllm_servers)
        tokenized = await resp.json()
    assert set(tokenized) >= {"count", "max_model_len", "tokens"}
    assert tokenized["count"] == len(tokenized["tokens"]) > 0
    assert tokenized["max_model_len"] == MAX_MODEL_LEN
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": text}]}
    async with http.post(f"{base}/tokenize", json=chat) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["count"] > tokenized["count"]  # the chat template's tokens
    back = {"model": MODEL_NAME, "tokens": tokenized["tokens"]}
    async with http.post(f"{base}/detokenize", json=back) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["prompt"] == text


async def test_model_list_keeps_vllms_fields(gateway: Gateway) -> None:
    sdk = client(gateway)
    try:
        listed = {m.id: m.model_dump() for m in (await sdk.models.list()).data}
        retrieved = (await sdk.models.retrieve(MODEL_NAME)).model_dump()
        with pytest.raises(openai.NotFoundError):
            await sdk.models.retrieve("no-such-model")
    finally:
        await sdk.close()
    card = listed[MODEL_NAME]
    assert card == retrieved
    assert card["owned_by"] == "vllm"
    assert card["parent"] is None
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert str(card["root"]).endswith(MODEL_NAME)  # the model directory vLLM loaded


async def test_responses_api_through_the_gateway(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    """vLLM's Responses API, whole and streamed; the gateway reads the usage from the
    answer and from the stream's ``response.completed`` event."""
    sdk = client(gateway)
    try:
        whole = await sdk.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=8)
        assert whole.usage is not None
        assert 0 < whole.usage.output_tokens <= 8
        completed = None
        stream = await sdk.responses.create(
            model=MODEL_NAME, input="Hello", max_output_tokens=8, stream=True
        )
        async for event in stream:
            if event.type == "response.completed":
                completed = event.response
    finally:
        await sdk.close()
    assert completed is not None
    assert completed.usage is not None
    text = await gateway_metrics(http, gateway)
    assert metric_value(text, "inference_objective_output_tokens_sum", **BY_MODEL) == (
        whole.usage.output_tokens + completed.usage.output_tokens
    )


async def test_embeddings_and_admin_routes(
    gateway: Gateway, vllm_servers: list[VllmServer], http: aiohttp.ClientSession
) -> None:
    """The test model is generative: vLLM serves no embeddings for it, and its refusal
    comes back as vLLM wrote it (the route is passed through). Its administrative
    routes are the gateway's 404, never reaching a server."""
    base = f"http://127.0.0.1:{gateway.port}"
    body = {"model": MODEL_NAME, "input": "hello", "encoding_format": "float"}
    async with http.post(f"{base}/v1/embeddings", json=body) as resp:
        assert resp.status in (400, 404, 405, 501), await resp.text()
        assert resp.headers[SERVED_HEADER] in addresses(vllm_servers)
    for path in ("/reset_prefix_cache", "/v1/load_lora_adapter", "/sleep", "/pause"):
        async with http.post(f"{base}{path}", json={}) as resp:
            assert resp.status == 404, path
            assert SERVED_HEADER not in resp.headers
            assert (await resp.json())["error"]["code"] == "not_found"
