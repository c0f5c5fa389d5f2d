"""The response side: usage and first byte observed, the model name restored, and the
request released exactly once however the stream ends."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from ep_support import (
    BASE,
    DESTINATION,
    MODES,
    ONE_AT_A_TIME,
    completion,
    kind,
    model_doc,
    picker_doc,
    removed_headers,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
    streamed,
    wait_for,
)

SSE = {"content-type": "text/event-stream"}
PICKER_ONE_AT_A_TIME = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
    "kind": "EndpointPickerConfig",
    **picker_doc(**ONE_AT_A_TIME),
}


def sample(p: Any, name: str, **labels: str) -> float:
    return p.runtime.metrics.registry.get_sample_value(name, labels) or 0.0


async def routed(p: Any, body: bytes, **headers: Any) -> tuple[Any, str]:
    """A stream whose request was routed; returns it and the chosen address."""
    ex = p.exchange()
    await ex.send(request_headers(**headers), request_body(body))
    answers = await ex.recv(2)
    return ex, set_headers(answers[0])[DESTINATION]


async def test_whole_answer_usage_read_and_model_restored(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    ex, _ = await routed(p, completion(model="food-review"))
    await ex.send(response_headers(headers={"content-length": "999"}))
    (headers_answer,) = await ex.recv()
    assert "content-length" in removed_headers(headers_answer)  # the body will change
    answer = {
        "model": BASE,
        "choices": [{"text": "hi"}],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 3},
        },
    }
    data = orjson.dumps(answer)
    await ex.send(response_body(data[:20], end_of_stream=False))
    await ex.no_answer()  # held: the whole answer is re-encoded at its end
    await ex.send(response_body(data[20:], end_of_stream=True))
    answers = await ex.recv(1)
    assert orjson.loads(streamed(answers, "response_body")) == {**answer, "model": "food-review"}
    labels = {"model_name": "food-review", "target_model_name": BASE}
    assert sample(p, "inference_objective_output_tokens_sum", **labels) == 4
    assert sample(p, "inference_objective_input_tokens_sum", **labels) == 7
    assert sample(p, "inference_objective_prompt_cached_tokens_sum", **labels) == 3
    assert sample(p, "inference_objective_request_duration_seconds_count", **labels) == 1
    assert p.inflight() == 0
    await ex.finish()


async def test_stream_usage_first_byte_and_model_restored_per_event(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    ex, address = await routed(p, completion(model="food-review", stream=True))
    endpoint = p.endpoint(address)
    await ex.send(response_headers(headers=SSE))
    await ex.recv()
    dispatch_prompt = endpoint.inflight.prompt_tokens
    assert dispatch_prompt > 0  # the prompt is charged until the first byte
    events = [{"model": BASE, "choices": [{"text": t}]} for t in ("a", "b", "c")] + [
        {"model": BASE, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    ]
    stream = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    cut = stream.index(b"tiny-") + 3  # split inside the model name of the first event
    await ex.send(response_body(stream[:cut], end_of_stream=False))
    await ex.no_answer()  # the incomplete event waits for the rest
    assert endpoint.inflight.prompt_tokens == 0  # first byte: prefill is over
    await ex.send(response_body(stream[cut:], end_of_stream=True))
    answers = await ex.recv(1)
    relayed = streamed(answers, "response_body")
    assert relayed == stream.replace(b'"model":"tiny-llama"', b'"model":"food-review"')
    labels = {"model_name": "food-review", "target_model_name": BASE}
    assert sample(p, "inference_objective_output_tokens_sum", **labels) == 3
    assert sample(p, "inference_objective_request_ttft_seconds_count", **labels) == 1
    assert sample(p, "inference_objective_request_tpot_seconds_count", **labels) == 1
    assert p.inflight() == 0
    await ex.finish()


async def test_streamed_response_mode_answers_each_chunk(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    ex = p.exchange()
    await ex.send(
        request_headers(request_mode=MODES.FULL_DUPLEX_STREAMED, response_mode=MODES.STREAMED),
        request_body(completion(model="food-review", stream=True)),
    )
    await ex.recv(2)
    await ex.send(response_headers(headers=SSE))
    await ex.recv()
    event = b'data: {"model":"tiny-llama","choices":[{"text":"a"}]}\n\n'
    await ex.send(response_body(event[:10], end_of_stream=False))
    (held,) = await ex.recv()  # one BodyResponse per chunk, even an emptied one
    assert kind(held) == "response_body"
    assert held.response_body.response.body_mutation.body == b""
    await ex.send(response_body(event[10:], end_of_stream=False))
    (rewritten,) = await ex.recv()
    assert rewritten.response_body.response.body_mutation.body == event.replace(
        b"tiny-llama", b"food-review"
    )
    await ex.send(response_body(b"data: [DONE]\n\n", end_of_stream=True))
    (last,) = await ex.recv()
    assert not last.response_body.response.HasField("body_mutation")  # nothing to change
    await ex.finish()
    # Without a rewrite, chunks pass without a body mutation.
    ex = p.exchange()
    await ex.send(
        request_headers(response_mode=MODES.STREAMED, request_mode=MODES.FULL_DUPLEX_STREAMED),
        request_body(completion(stream=True)),
    )
    await ex.recv(2)
    await ex.send(response_headers(headers=SSE), response_body(event, end_of_stream=True))
    _, passed = await ex.recv(2)
    assert not passed.response_body.response.HasField("body_mutation")
    await ex.finish()


async def test_error_status_released_as_an_error(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    ex, _ = await routed(p, completion())
    await ex.send(response_headers(503), response_body(b"upstream busy"))
    answers = await ex.recv(2)
    assert streamed(answers, "response_body") == b"upstream busy"
    labels = {"model_name": BASE, "target_model_name": BASE, "error_code": "503"}
    assert sample(p, "inference_objective_request_error_total", **labels) == 1
    assert p.inflight() == 0
    # A response without a body ends at its headers.
    ex, _ = await routed(p, completion())
    await ex.send(response_headers(200, end_of_stream=True))
    await ex.recv()
    assert p.inflight() == 0
    await ex.finish()


async def test_cancelled_mid_response_releases_the_request(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster)
    streams = []
    for _ in range(4):
        ex, _ = await routed(p, completion(stream=True))
        await ex.send(response_headers(headers=SSE))
        await ex.recv()
        await ex.send(response_body(b'data: {"choices":[{"text":"a"}]}\n\n', False))
        await ex.recv()
        streams.append(ex)
    assert p.inflight() == 4
    assert sample(p, "inference_objective_running_requests", model_name=BASE) == 4
    for ex in streams:
        ex.cancel()  # the client left: Envoy resets the ext_proc stream
    await wait_for(lambda: p.inflight() == 0, what="in-flight counts back to 0")
    for endpoint in p.runtime.datastore.all_endpoints():
        assert endpoint.inflight.requests == 0
        assert endpoint.inflight.prompt_tokens == endpoint.inflight.decode_tokens == 0
    assert sample(p, "inference_objective_running_requests", model_name=BASE) == 0
    # Cancelled requests are not successes.
    success = {"model_name": BASE, "target_model_name": BASE}
    assert sample(p, "inference_objective_request_duration_seconds_count", **success) == 0


async def test_stream_closed_before_the_response_releases_the_request(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    ex, _ = await routed(p, completion())
    assert p.inflight() == 1
    await ex.finish()  # Envoy half-closes (e.g. the upstream could not be reached)
    await wait_for(lambda: p.inflight() == 0)
    # With no response body sent to the picker, the status seen ends the request.
    ex = p.exchange()
    await ex.send(
        request_headers(request_mode=MODES.FULL_DUPLEX_STREAMED, response_mode=MODES.NONE),
        request_body(completion()),
    )
    await ex.recv(2)
    await ex.send(response_headers(200))
    await ex.recv()
    assert p.inflight() == 1
    await ex.finish()
    await wait_for(lambda: p.inflight() == 0)
    success = {"model_name": BASE, "target_model_name": BASE}
    assert sample(p, "inference_objective_request_duration_seconds_count", **success) == 1


async def test_cancelled_while_queued_leaves_the_queue(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(
        cluster, docs=[model_doc("chat", {BASE: 1}), PICKER_ONE_AT_A_TIME], queueing=True
    )
    running, _ = await routed(p, completion(model="chat"))  # fills the only endpoint
    waiting = p.exchange()
    await waiting.send(request_headers(), request_body(completion(model="chat")))
    await waiting.no_answer()  # queued in flow control
    assert sum(c.requests for c in p.runtime.director.controllers().values()) == 1
    waiting.cancel()
    await wait_for(
        lambda: sum(c.requests for c in p.runtime.director.controllers().values()) == 0,
        what="queue emptied",
    )
    # The running request ends; a new one is routed at once (nothing stale was queued).
    await running.send(response_headers(), response_body(b"{}"))
    await running.recv(2)
    assert p.inflight() == 0
    ex, _ = await routed(p, completion(model="chat"))
    assert p.inflight() == 1
    ex.cancel()
    await wait_for(lambda: p.inflight() == 0)


async def test_queued_request_is_routed_when_room_appears(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(
        cluster, docs=[model_doc("chat", {BASE: 1}), PICKER_ONE_AT_A_TIME], queueing=True
    )
    running, _ = await routed(p, completion(model="chat"))
    waiting = p.exchange()
    await waiting.send(request_headers(), request_body(completion(model="chat")))
    await waiting.no_answer()
    await running.send(response_headers(), response_body(b"{}"))
    await running.recv(2)
    answers = await waiting.recv(2)  # now it goes
    assert set_headers(answers[0])[DESTINATION] in p.addresses()
    await asyncio.sleep(0)
    assert p.inflight() == 1
    waiting.cancel()
    await wait_for(lambda: p.inflight() == 0)
