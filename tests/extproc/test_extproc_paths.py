"""Which paths the picker routes, by the gateway's rules (requestcontrol/routes.py): the
passed-through inference routes with and without a body, the model list it answers
itself, and the refused administrative routes — driven by hand-built messages."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from ep_support import (
    BASE,
    DESTINATION,
    MODES,
    completion,
    immediate,
    kind,
    model_doc,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
    sse,
    streamed,
)

from sluicegate.extproc.protocol import MODEL_NAME_HEADER as MODEL_NAME

SSE = {"content-type": "text/event-stream"}


def sample(p: Any, name: str, **labels: str) -> float:
    return p.runtime.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_embeddings_are_routed_by_model_and_their_usage_is_read(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster, docs=[model_doc("embedder", {BASE: 1})])
    body = orjson.dumps({"model": "embedder", "input": ["a", "b"]})
    ex = p.exchange()
    await ex.send(request_headers("/v1/embeddings?x=1"), request_body(body))
    headers_answer, body_answer = await ex.recv(2)
    sent = set_headers(headers_answer)
    assert sent[DESTINATION] in p.addresses()
    assert sent[MODEL_NAME] == "embedder"
    forwarded = streamed([body_answer])
    assert orjson.loads(forwarded) == {"model": BASE, "input": ["a", "b"]}  # rewritten
    assert sent["content-length"] == str(len(forwarded))
    assert p.inflight() == 1
    answer = {"object": "list", "model": BASE, "data": [], "usage": {"prompt_tokens": 6}}
    await ex.send(response_headers(), response_body(orjson.dumps(answer)))
    answers = await ex.recv(2)
    assert orjson.loads(streamed(answers, "response_body"))["model"] == "embedder"
    await ex.finish()
    assert p.inflight() == 0
    labels = {"model_name": "embedder", "target_model_name": BASE}
    assert sample(p, "inference_objective_input_tokens_sum", **labels) == 6
    assert sample(p, "inference_objective_request_duration_seconds_count", **labels) == 1


async def test_a_responses_stream_has_its_usage_read(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    body = orjson.dumps({"model": BASE, "input": "Hi", "stream": True, "max_output_tokens": 5})
    ex = p.exchange()
    await ex.send(request_headers("/v1/responses"), request_body(body))
    await ex.recv(2)
    done = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 3, "output_tokens": 5}},
    }
    stream = sse({"type": "response.output_text.delta", "delta": "x"}, done)
    await ex.send(response_headers(headers=SSE), response_body(stream))
    await ex.recv(2)
    await ex.finish()
    labels = {"model_name": BASE, "target_model_name": BASE}
    assert sample(p, "inference_objective_input_tokens_sum", **labels) == 3
    assert sample(p, "inference_objective_output_tokens_sum", **labels) == 5


@pytest.mark.parametrize("mode", [MODES.FULL_DUPLEX_STREAMED, MODES.BUFFERED])
async def test_a_request_without_body_goes_to_a_ready_endpoint_and_is_accounted(
    sim_cluster: Any, picker: Any, mode: int
) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster)
    busy = p.runtime.datastore.all_endpoints()[0]
    busy.inflight.requests += 5
    try:
        ex = p.exchange()
        await ex.send(
            request_headers(
                "/v1/responses/resp-1", method="GET", end_of_stream=True, request_mode=mode
            )
        )
        (answer,) = await ex.recv()
        assert kind(answer) == "request_headers"  # no body to answer
        sent = set_headers(answer)
        assert sent[DESTINATION] in p.addresses()
        assert sent[DESTINATION] != busy.address  # the least loaded
        assert MODEL_NAME not in sent  # model-less
        assert "content-length" not in sent
        assert p.inflight() == 6
        await ex.send(response_headers(), response_body(b'{"id": "resp-1"}'))
        answers = await ex.recv(2)
        assert streamed(answers, "response_body") == b'{"id": "resp-1"}'
        await ex.finish()
        assert p.inflight() == 5
    finally:
        busy.inflight.requests -= 5


@pytest.mark.parametrize(
    "path",
    [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/reset_prefix_cache",
        "/sleep",
        "/v1/admin/faults",
        "/v1/load%5Flora_adapter",
        "/v1/x/../load_lora_adapter",
        "/openai/v1/chat/completions",  # only the gateway's own spelling of the route
    ],
)
async def test_administrative_and_unknown_paths_are_refused(
    sim_cluster: Any, picker: Any, path: str
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    for bodyless in (False, True):
        ex = p.exchange()
        if bodyless:
            await ex.send(request_headers(path, end_of_stream=True))
        else:
            await ex.send(request_headers(path), request_body(b'{"lora_name": "x"}'))
        out = immediate((await ex.recv())[0])
        assert out.status == 404
        assert out.body["error"]["code"] == "not_found"
        assert path in out.body["error"]["message"]
        ex.cancel()
    assert p.inflight() == 0


async def test_the_model_list_is_answered_by_the_picker(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])

    async def ask(path: str, method: str = "GET") -> Any:
        ex = p.exchange()
        await ex.send(request_headers(path, method=method, end_of_stream=True))
        out = immediate((await ex.recv())[0])
        ex.cancel()
        return out

    listed = await ask("/v1/models")
    assert listed.status == 200
    assert listed.headers["content-type"] == "application/json"
    ids = [entry["id"] for entry in listed.body["data"]]
    assert ids == sorted({BASE, "food-review"})  # de-duplicated over the replicas
    entry = await ask("/v1/models/food-review")
    assert (entry.status, entry.body["parent"]) == (200, BASE)
    missing = await ask("/v1/models/nothing")
    assert (missing.status, missing.body["error"]["code"]) == (404, "model_not_found")
    assert (await ask("/v1/models", "POST")).status == 405
    assert (await ask("/v1/completions", "GET")).status == 405
    assert p.inflight() == 0


async def test_a_passed_route_needs_a_valid_body(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    ex = p.exchange()
    await ex.send(request_headers("/v1/embeddings"), request_body(b'{"model": 3}'))
    out = immediate((await ex.recv())[0])
    assert (out.status, out.body["error"]["param"]) == (400, "model")
    ex = p.exchange()
    await ex.send(request_headers("/v1/embeddings"), request_body(completion(model="nope")))
    assert immediate((await ex.recv())[0]).status == 404
