"""The simulator's embeddings, Responses, detokenize and model-card routes."""

from __future__ import annotations

import base64
import struct
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from sluicegate.sim.routes import EMBEDDING_DIMENSIONS, embedding_vector
from sluicegate.sim.server import Replica


async def test_model_cards(sim_cluster: Any, http: aiohttp.ClientSession) -> None:
    cluster = await sim_cluster(replicas=1, lora={"sql": "/adapters/sql"})
    replica = cluster.replicas[0]
    async with http.get(replica.url + "/v1/models") as r:
        cards = {c["id"]: c for c in (await r.json())["data"]}
    base, sql = cards[replica.model_name], cards["sql"]
    max_len = replica.options.profile.max_model_len
    assert base["owned_by"] == sql["owned_by"] == "vllm"
    assert (base["root"], base["parent"], base["max_model_len"]) == (
        replica.model_name,
        None,
        max_len,
    )
    assert (sql["root"], sql["parent"]) == ("/adapters/sql", replica.model_name)
    permission = base["permission"][0]
    assert permission["object"] == "model_permission"
    assert permission["id"].startswith("modelperm-")


def test_embedding_vectors_are_deterministic_unit_vectors() -> None:
    a = embedding_vector(b"a", 64)
    assert a == embedding_vector(b"a", 64)
    assert a != embedding_vector(b"b", 64)
    assert sum(v * v for v in a) == pytest.approx(1.0, abs=1e-5)
    # Already float32: base64 round-trips exactly.
    assert list(struct.unpack("<64f", struct.pack("<64f", *a))) == a


async def test_embeddings_with_the_sdk(client: AsyncOpenAI, replica: Replica) -> None:
    default = await client.embeddings.create(model=replica.model_name, input=["a", "bb"])
    assert [len(d.embedding) for d in default.data] == [EMBEDDING_DIMENSIONS] * 2
    assert default.data[0].embedding == embedding_vector(b"a", EMBEDDING_DIMENSIONS)
    assert default.usage.prompt_tokens == 2
    ids = await client.embeddings.create(
        model=replica.model_name, input=[[1, 2, 3]], encoding_format="float", dimensions=8
    )
    assert len(ids.data[0].embedding) == 8
    assert ids.usage.prompt_tokens == 3
    with pytest.raises(NotFoundError):
        await client.embeddings.create(model="nope", input="a")
    for bad in ({"input": ""}, {"input": []}, {"input": [None]}, {"dimensions": 0}):
        with pytest.raises(BadRequestError):
            await client.embeddings.create(model=replica.model_name, **{"input": "a", **bad})


async def test_embeddings_base64_shape(replica: Replica, http: aiohttp.ClientSession) -> None:
    body = {"model": replica.model_name, "input": "x", "encoding_format": "base64"}
    async with http.post(replica.url + "/v1/embeddings", json=body) as r:
        answer = await r.json()
    assert answer["object"] == "list"
    item = answer["data"][0]
    assert (item["object"], item["index"]) == ("embedding", 0)
    packed = base64.b64decode(item["embedding"])
    assert len(packed) == 4 * EMBEDDING_DIMENSIONS
    assert answer["usage"] == {"prompt_tokens": 1, "total_tokens": 1, "completion_tokens": 0}
    body["encoding_format"] = "bytes"
    async with http.post(replica.url + "/v1/embeddings", json=body) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "encoding_format"


async def test_detokenize_inverts_tokenize(replica: Replica, http: aiohttp.ClientSession) -> None:
    for text in ("hello", "ünïcode ✓", "abcd"):
        async with http.post(replica.url + "/tokenize", json={"prompt": text}) as r:
            tokenized = await r.json()
        assert set(tokenized) == {"count", "max_model_len", "tokens", "token_strs"}  # vLLM's
        tokens = tokenized["tokens"]
        async with http.post(replica.url + "/detokenize", json={"tokens": tokens}) as r:
            assert await r.json() == {"prompt": text}
    for bad in ({"tokens": "x"}, {"tokens": [-1]}, {"tokens": [True]}, {}):
        async with http.post(replica.url + "/detokenize", json=bad) as r:
            assert r.status == 400, bad
    async with http.post(replica.url + "/detokenize", json={"model": "no", "tokens": [1]}) as r:
        assert r.status == 404


async def test_responses_go_through_the_engine(client: AsyncOpenAI, replica: Replica) -> None:
    before = replica.engine.counters.generation_tokens
    whole = await client.responses.create(
        model=replica.model_name, input="hello", max_output_tokens=4
    )
    assert whole.object == "response"
    assert whole.status == "incomplete"
    assert whole.usage is not None
    assert whole.usage.output_tokens == 4
    assert replica.engine.counters.generation_tokens - before == 4
    assert whole.output[0].type == "message"
    assert whole.output_text

    stream = await client.responses.create(
        model=replica.model_name,
        input=[{"role": "user", "content": "hi"}],
        instructions="short",
        max_output_tokens=3,
        stream=True,
    )
    kinds = [event.type async for event in stream]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 3
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


async def test_responses_errors(client: AsyncOpenAI, replica: Replica) -> None:
    with pytest.raises(NotFoundError):
        await client.responses.create(model="nope", input="x")
    with pytest.raises(BadRequestError):
        await client.responses.create(model=replica.model_name, input=[])
    with pytest.raises(BadRequestError):
        await client.responses.create(
            model=replica.model_name, input=[{"role": "user", "content": [{"type": "input_image"}]}]
        )
    with pytest.raises(BadRequestError):
        await client.responses.create(model=replica.model_name, input="x", max_output_tokens=0)
