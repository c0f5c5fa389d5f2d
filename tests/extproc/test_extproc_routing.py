"""The request side of the ext_proc protocol, driven over a real gRPC channel with
hand-built messages: where the request goes and what the proxy is told to send upstream."""

from __future__ import annotations

from typing import Any

import orjson
from ep_support import (
    BASE,
    DESTINATION,
    MODES,
    completion,
    kind,
    metadata_destination,
    model_doc,
    removed_headers,
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
    set_headers,
    streamed,
    streamed_pieces,
)

from sluicegate.extproc.protocol import BODY_CHUNK_BYTES
from sluicegate.extproc.stream import StreamSettings


async def test_full_duplex_request_in_one_chunk(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster)
    body = completion(prompt="Hello there")
    ex = p.exchange()
    await ex.send(request_headers(request_mode=MODES.FULL_DUPLEX_STREAMED))
    await ex.no_answer()  # nothing until the body has ended
    await ex.send(request_body(body))
    headers_answer, body_answer = await ex.recv(2)

    assert kind(headers_answer) == "request_headers"
    common = headers_answer.request_headers.response
    assert common.clear_route_cache
    sent = set_headers(headers_answer)
    assert sent[DESTINATION] in p.addresses()
    assert metadata_destination(headers_answer) == sent[DESTINATION]  # the two must agree
    assert sent["x-gateway-model-name"] == BASE
    assert sent["content-length"] == str(len(body))
    assert streamed([body_answer]) == body  # unchanged
    assert streamed_pieces([body_answer])[0].end_of_stream
    # The request is charged to the chosen endpoint until its response ends.
    assert p.endpoint(sent[DESTINATION]).inflight.requests == 1
    await ex.send(response_headers(), response_body(b'{"choices": []}'))
    await ex.recv(2)
    assert p.inflight() == 0
    await ex.finish()


async def test_body_in_several_chunks_and_an_empty_last_one(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster)
    body = completion(prompt="one two three " * 50)
    ex = p.exchange()
    # Without protocol_config (older Envoy): FULL_DUPLEX_STREAMED is assumed.
    await ex.send(request_headers())
    for i in range(0, len(body), 100):
        await ex.send(request_body(body[i : i + 100], end_of_stream=False))
    await ex.no_answer()
    await ex.send(request_body(b"", end_of_stream=True))
    answers = await ex.recv(2)
    assert set_headers(answers[0])[DESTINATION] in p.addresses()
    assert streamed(answers) == body
    ex.cancel()


async def test_large_body_is_sent_back_in_62000_byte_pieces(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    body = completion(prompt="x" * 200_000)
    ex = p.exchange()
    await ex.send(request_headers(), request_body(body))
    count = -(-len(body) // BODY_CHUNK_BYTES)
    answers = await ex.recv(1 + count)
    pieces = streamed_pieces(answers)
    assert [len(piece.body) for piece in pieces[:-1]] == [BODY_CHUNK_BYTES] * (count - 1)
    assert 0 < len(pieces[-1].body) <= BODY_CHUNK_BYTES
    assert [piece.end_of_stream for piece in pieces] == [False] * (count - 1) + [True]
    assert b"".join(piece.body for piece in pieces) == body
    ex.cancel()


async def test_subset_hint_restricts_the_choice(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=3)
    p = await picker(cluster)
    for allowed in p.addresses():
        for _ in range(3):
            ex = p.exchange()
            await ex.send(request_headers(subset=[allowed]), request_body(completion()))
            answers = await ex.recv(2)
            assert set_headers(answers[0])[DESTINATION] == allowed
            ex.cancel()
    # Two allowed: only those two are ever chosen.
    two = p.addresses()[:2]
    for _ in range(6):
        ex = p.exchange()
        await ex.send(request_headers(subset=two), request_body(completion()))
        assert set_headers((await ex.recv(2))[0])[DESTINATION] in two
        ex.cancel()


async def test_model_rewritten_to_the_target_and_named_for_routes(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    body = completion(model="food-review", prompt="Write as if you were a critic")
    ex = p.exchange()
    await ex.send(
        request_headers(
            headers={
                "x-gateway-inference-objective": "critical",
                "x-gateway-inference-fairness-id": "tenant-a",
                DESTINATION: "10.0.0.1:1",  # a client's attempt is overwritten
            }
        ),
        request_body(body),
    )
    answers = await ex.recv(2)
    sent = set_headers(answers[0])
    upstream = streamed(answers)
    assert orjson.loads(upstream)["model"] == BASE
    assert orjson.loads(upstream)["prompt"] == "Write as if you were a critic"
    assert sent["content-length"] == str(len(upstream)) != str(len(body))
    assert sent["x-gateway-model-name"] == "food-review"  # the model the client asked for
    assert sent[DESTINATION] in p.addresses()
    removed = removed_headers(answers[0])
    assert "x-gateway-inference-objective" in removed
    assert "x-gateway-inference-fairness-id" in removed
    assert DESTINATION not in removed  # set, not removed
    ex.cancel()


async def test_request_ended_by_trailers(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    body = completion()
    ex = p.exchange()
    await ex.send(request_headers(), request_body(body, end_of_stream=False))
    await ex.no_answer()
    await ex.send(request_trailers())
    answers = await ex.recv(3)
    assert [kind(a) for a in answers] == ["request_headers", "request_body", "request_trailers"]
    assert streamed(answers) == body
    assert not streamed_pieces(answers)[-1].end_of_stream  # the trailers end the stream
    ex.cancel()


async def test_buffered_mode_answers_in_the_body_response(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    ex = p.exchange()
    await ex.send(request_headers(request_mode=MODES.BUFFERED))
    (first,) = await ex.recv()
    assert kind(first) == "request_headers"
    assert not set_headers(first)  # let through; Envoy holds them until the body answer
    body = completion(model="food-review")
    await ex.send(request_body(body))
    (answer,) = await ex.recv()
    assert kind(answer) == "request_body"
    common = answer.request_body.response
    assert common.clear_route_cache
    sent = set_headers(answer)
    assert sent[DESTINATION] in p.addresses()
    assert metadata_destination(answer) == sent[DESTINATION]
    assert orjson.loads(common.body_mutation.body)["model"] == BASE
    assert sent["content-length"] == str(len(common.body_mutation.body))
    ex.cancel()


async def test_streamed_mode_asks_envoy_to_buffer(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    for mode in (MODES.STREAMED, MODES.BUFFERED_PARTIAL, MODES.NONE):
        ex = p.exchange()
        await ex.send(request_headers(request_mode=mode, response_mode=MODES.STREAMED))
        (first,) = await ex.recv()
        override = first.mode_override
        assert first.HasField("mode_override")
        assert override.request_body_mode == MODES.BUFFERED
        assert override.response_body_mode == MODES.STREAMED  # kept
        await ex.send(request_body(completion()))
        (answer,) = await ex.recv()
        assert set_headers(answer)[DESTINATION] in p.addresses()
        ex.cancel()


async def test_header_values_from_older_envoy_releases(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    ex = p.exchange()
    await ex.send(
        request_headers(legacy_values=True, headers={"x-request-id": "abc-123"}),
        request_body(completion(model="food-review")),
    )
    answers = await ex.recv(2)
    assert set_headers(answers[0])[DESTINATION] in p.addresses()
    assert "x-request-id" not in set_headers(answers[0])  # kept as the client sent it
    ex.cancel()


async def test_fallbacks_listed_when_asked_and_the_served_one_is_charged(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=3)
    p = await picker(cluster, stream=StreamSettings(fallback_endpoints=2))
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion()))
    answers = await ex.recv(2)
    listed = set_headers(answers[0])[DESTINATION].split(",")
    assert len(listed) == 3
    assert sorted(listed) == sorted(p.addresses())
    assert metadata_destination(answers[0]) == ",".join(listed)
    primary, fallback = p.endpoint(listed[0]), p.endpoint(listed[1])
    assert (primary.inflight.requests, fallback.inflight.requests) == (1, 0)
    # The proxy reports that the first fallback served it: the charge moves there.
    await ex.send(response_headers(served=listed[1]))
    await ex.recv()
    assert (primary.inflight.requests, fallback.inflight.requests) == (0, 1)
    await ex.send(response_body(b"{}"))
    await ex.recv()
    assert p.inflight() == 0
    await ex.finish()
