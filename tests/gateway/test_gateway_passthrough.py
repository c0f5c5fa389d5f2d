"""Routes passed through to the model servers (embeddings, Responses, tokenize...), the
routes never passed, and the fleet's own model list — with the openai SDK where it has a
call for the route."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai
import pytest
from gw_support import GatewayFactory, model_doc
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseTextDeltaEvent,
)
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.gateway.app import Gateway
from sluicegate.gateway.proxy import SERVED_HEADER
from sluicegate.sim.faults import Faults
from sluicegate.sim.routes import EMBEDDING_DIMENSIONS, embedding_vector

BASE = "tiny-llama"
KEY = "s3cretKeyOf20Chars00"


Client = Callable[[Gateway], openai.AsyncOpenAI]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    """Factory of SDK clients for a gateway (no retries), closed at teardown."""
    made: list[openai.AsyncOpenAI] = []

    def make(gateway: Gateway) -> openai.AsyncOpenAI:
        sdk = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key="unchecked", max_retries=0
        )
        made.append(sdk)
        return sdk

    yield make
    for sdk in made:
        await sdk.close()


def url(gateway: Gateway, path: str) -> str:
    return f"http://127.0.0.1:{gateway.port}{path}"


def histogram_sum(gateway: Gateway, name: str, model: str) -> float:
    text = gateway.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(
                s.value
                for s in family.samples
                if s.name == name + "_sum" and s.labels.get("model_name") == model
            )
    raise AssertionError(f"no family {name}")


# --------------------------------------------------------------------------- embeddings


async def test_embeddings_float_and_the_sdk_default_base64(
    sim_cluster: Any, gateway: GatewayFactory, client: Client
) -> None:
    gw = await gateway(await sim_cluster(replicas=2))
    sdk = client(gw)
    expected = embedding_vector(b"hello world", EMBEDDING_DIMENSIONS)
    as_floats = await sdk.embeddings.create(
        model=BASE, input="hello world", encoding_format="float"
    )
    assert as_floats.data[0].embedding == expected
    assert as_floats.usage.prompt_tokens == 3  # 11 bytes, 4 bytes a token
    assert as_floats.model == BASE
    # No encoding_format: the SDK asks for base64 and decodes it.
    default = await sdk.embeddings.create(model=BASE, input=["hello world", "other"])
    assert [d.index for d in default.data] == [0, 1]
    assert default.data[0].embedding == pytest.approx(expected, abs=0)
    assert default.data[1].embedding != expected
    raw = await sdk.embeddings.with_raw_response.create(
        model=BASE, input="hello world", encoding_format="base64"
    )
    packed = base64.b64decode(raw.http_response.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{EMBEDDING_DIMENSIONS}f", packed)) == expected
    assert raw.headers["x-gateway-destination-endpoint-served"]
    assert histogram_sum(gw, "inference_objective_input_tokens", BASE) > 0


async def test_embeddings_of_a_public_name_are_rewritten_both_ways(
    sim_cluster: Any, gateway: GatewayFactory, client: Client
) -> None:
    cluster = await sim_cluster(replicas=1, lora=["emb-v1"])
    gw = await gateway(cluster, docs=[model_doc("emb", {"emb-v1": 1})])
    result = await client(gw).embeddings.create(model="emb", input="x", encoding_format="float")
    assert result.model == "emb"  # the server answered for emb-v1


# --------------------------------------------------------------------------- responses


async def test_responses_whole_and_streamed(
    sim_cluster: Any, gateway: GatewayFactory, client: Client
) -> None:
    cluster = await sim_cluster(replicas=2, lora=["food-v1"])
    gw = await gateway(cluster, docs=[model_doc("food", {"food-v1": 1})])
    sdk = client(gw)
    whole = await sdk.responses.create(
        model="food", input="Tell me about soup.", instructions="Be brief.", max_output_tokens=6
    )
    assert whole.model == "food"  # restored from food-v1
    assert whole.output_text
    assert whole.usage is not None
    assert (whole.usage.output_tokens, whole.status) == (6, "incomplete")
    assert whole.usage.input_tokens > 0

    deltas: list[str] = []
    completed = None
    stream = await sdk.responses.create(
        model=BASE,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}],
        max_output_tokens=5,
        stream=True,
    )
    async for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert completed is not None
    assert completed.usage is not None
    assert len(deltas) == completed.usage.output_tokens == 5
    assert "".join(deltas) == completed.output_text
    assert completed.model == BASE
    # The proxy read the usage from the response.completed event.
    assert histogram_sum(gw, "inference_objective_output_tokens", BASE) == 5
    assert histogram_sum(gw, "inference_objective_output_tokens", "food") == 6


async def test_responses_stream_keeps_the_public_name(
    sim_cluster: Any, gateway: GatewayFactory, client: Client
) -> None:
    cluster = await sim_cluster(replicas=1, lora=["food-v1"])
    gw = await gateway(cluster, docs=[model_doc("food", {"food-v1": 1})])
    stream = await client(gw).responses.create(
        model="food", input="soup", max_output_tokens=3, stream=True
    )
    models = set()
    async for event in stream:
        if isinstance(event, ResponseCreatedEvent | ResponseCompletedEvent):
            models.add(event.response.model)
        elif isinstance(event, ResponseTextDeltaEvent):
            assert event.delta
    assert models == {"food"}


# --------------------------------------------------------------------------- models


async def test_models_list_keeps_the_servers_fields(
    sim_cluster: Any, gateway: GatewayFactory, client: Client
) -> None:
    cluster = await sim_cluster(replicas=2, lora={"food-v1": "/adapters/food"})
    gw = await gateway(cluster, docs=[model_doc("food", {"food-v1": 1})])
    models = {m.id: m.model_dump() for m in (await client(gw).models.list()).data}
    assert set(models) == {BASE, "food-v1", "food"}
    base, adapter, public = models[BASE], models["food-v1"], models["food"]
    assert base["owned_by"] == "vllm"
    max_len = cluster.replicas[0].options.profile.max_model_len
    assert (base["root"], base["parent"], base["max_model_len"]) == (BASE, None, max_len)
    assert base["permission"][0]["object"] == "model_permission"
    assert (adapter["root"], adapter["parent"]) == ("/adapters/food", BASE)
    assert (public["root"], public["parent"], public["owned_by"]) == (
        "/adapters/food",
        "food-v1",
        "vllm",
    )
    assert public["max_model_len"] == max_len


async def test_models_list_does_not_wait_on_a_dead_server(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2, lora=["only-on-both"])
    gw = await gateway(cluster, settings={"modelsRefreshIntervalMs": 20})
    await cluster.replicas[1].stop()
    started = time.monotonic()
    async with http.get(url(gw, "/v1/models")) as r:
        assert r.status == 200
        ids = {m["id"] for m in (await r.json())["data"]}
    assert time.monotonic() - started < 0.5  # answered from the lists already fetched
    assert ids == {BASE, "only-on-both"}


async def test_models_retrieve_with_slashes_and_unknown(
    sim_cluster: Any, gateway: GatewayFactory, client: Client, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, served_model_name="/model/qwen", lora=["org/name"])
    gw = await gateway(cluster)
    sdk = client(gw)
    base = await sdk.models.retrieve("/model/qwen")  # sent as /v1/models/%2Fmodel%2Fqwen
    assert (base.id, base.owned_by) == ("/model/qwen", "vllm")
    adapter = await sdk.models.retrieve("org/name")
    assert adapter.model_dump()["parent"] == "/model/qwen"
    async with http.get(url(gw, "/v1/models/org/name")) as r:  # unencoded, as curl sends it
        assert r.status == 200
        assert (await r.json())["id"] == "org/name"
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.models.retrieve("nope")
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["type"]) == ("model_not_found", "invalid_request_error")
    assert "nope" in error["message"]
    async with http.head(url(gw, "/v1/models/org/name")) as r:
        assert r.status == 200
    async with http.post(url(gw, "/v1/models/org/name")) as r:
        assert r.status == 405


# --------------------------------------------------------------------------- tokenize


async def test_tokenize_and_detokenize_round_trip(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    gw = await gateway(await sim_cluster(replicas=2))
    async with http.post(url(gw, "/tokenize"), json={"model": BASE, "prompt": "hello"}) as r:
        assert r.status == 200
        tokenized = await r.json()
    assert set(tokenized) >= {"count", "max_model_len", "tokens"}
    assert tokenized["count"] == len(tokenized["tokens"]) == 2
    chat = {"model": BASE, "messages": [{"role": "user", "content": "hello"}]}
    async with http.post(url(gw, "/tokenize"), json=chat) as r:
        assert r.status == 200
        assert (await r.json())["count"] > 2  # the chat template adds tokens
    # Model-less: any endpoint of the only pool answers.
    async with http.post(url(gw, "/detokenize"), json={"tokens": tokenized["tokens"]}) as r:
        assert r.status == 200
        assert await r.json() == {"prompt": "hello"}


async def test_model_less_and_non_json_bodies_go_to_the_only_pool(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1)
    gw = await gateway(cluster)
    form = aiohttp.FormData()
    form.add_field("model", BASE)
    form.add_field("file", b"RIFF....", filename="a.wav", content_type="audio/wav")
    async with http.post(url(gw, "/v1/audio/transcriptions"), data=form) as r:
        # Passed through (the simulator serves no audio): the server's own 404.
        assert r.status == 404
        assert r.headers[SERVED_HEADER] == f"127.0.0.1:{cluster.replicas[0].port}"
    async with http.get(url(gw, "/v1/no-such-route")) as r:
        assert r.status == 404
        assert r.headers[SERVED_HEADER] == f"127.0.0.1:{cluster.replicas[0].port}"


async def test_several_pools_need_a_model(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    from gw_support import pool_doc

    other = await sim_cluster(replicas=1)
    gw = await gateway(await sim_cluster(replicas=1), docs=[pool_doc(other.urls, name="other")])
    async with http.post(url(gw, "/detokenize"), json={"tokens": [1]}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "model"


# --------------------------------------------------------------------------- limits


async def test_pass_through_needs_the_key_and_a_served_model(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    gw = await gateway(await sim_cluster(replicas=1), api_keys=[KEY])
    body = {"model": BASE, "input": "x", "encoding_format": "float"}
    async with http.post(url(gw, "/v1/embeddings"), json=body) as r:
        assert r.status == 401
        assert (await r.json())["error"]["code"] == "invalid_api_key"
    async with http.post(url(gw, "/tokenize"), json={"prompt": "x"}) as r:
        assert r.status == 401
    authorized = {"authorization": f"Bearer {KEY}"}
    async with http.post(url(gw, "/v1/embeddings"), json=body, headers=authorized) as r:
        assert r.status == 200
    unknown = {**body, "model": "nope"}
    async with http.post(url(gw, "/v1/embeddings"), json=unknown, headers=authorized) as r:
        assert r.status == 404  # as for completions
        assert (await r.json())["error"]["code"] == "model_not_found"
    async with http.post(
        url(gw, "/v1/embeddings"), json={**body, "model": 3}, headers=authorized
    ) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "model"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/load_lora_adapter",
        "/v1/LOAD_LORA_ADAPTER",
        "/v1/load%5Flora_adapter",
        "/v1//load_lora_adapter",
        "/v1/x/../load_lora_adapter",
        "/reset_prefix_cache",
        "/admin/faults",
        "/v1/admin/faults",
        "/sleep",
        "/metrics/",
    ],
)
async def test_administrative_routes_are_not_passed(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession, path: str
) -> None:
    cluster = await sim_cluster(replicas=1, enable_lora=True)
    gw = await gateway(cluster)
    body = {"lora_name": "evil", "lora_path": "/tmp/evil", "model": BASE}
    async with http.post(url(gw, path), json=body) as r:
        assert r.status == 404
        error = (await r.json())["error"]
        assert error["code"] == "not_found"
        assert SERVED_HEADER not in r.headers
    assert "evil" not in cluster.replicas[0].loras


async def test_pass_through_is_retried_before_the_first_byte(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    # Scrapes far apart: the stopped replica stays a candidate, so requests reach it.
    gw = await gateway(cluster, preset="round-robin", settings={"scrapeIntervalMs": 60_000})
    await cluster.replicas[0].stop()
    for i in range(4):
        body = {"model": BASE, "input": f"text {i}", "encoding_format": "float"}
        async with http.post(url(gw, "/v1/embeddings"), json=body) as r:
            assert r.status == 200
            assert r.headers["x-inference-pod"] == cluster.replicas[1].pod_name
    assert gw.metrics.retries.value >= 1


async def test_head_wherever_get(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    for path in ("/metrics", "/v1/models", "/health", "/ready"):
        async with http.head(url(gw, path)) as r:
            assert r.status == 200, path
            assert await r.read() == b""


async def test_server_errors_on_a_pass_through_route_are_retried_elsewhere(
    sim_cluster: Any, gateway: GatewayFactory, client: Client
) -> None:
    faults = {0: Faults(error_rate=1.0, error_status=503)}
    cluster = await sim_cluster(replicas=2, faults=faults)
    gw = await gateway(cluster, preset="round-robin")
    sdk = client(gw)
    for i in range(4):
        raw = await sdk.responses.with_raw_response.create(
            model=BASE, input=f"question {i}", max_output_tokens=2
        )
        assert raw.headers["x-inference-pod"] == cluster.replicas[1].pod_name
        assert raw.parse().usage is not None
    assert gw.metrics.retries.value >= 1
