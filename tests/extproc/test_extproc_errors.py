"""Decisions the picker answers itself (immediate responses), and faults that must not
take the server down."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from ep_support import (
    BASE,
    DESTINATION,
    ONE_AT_A_TIME,
    completion,
    immediate,
    kind,
    model_doc,
    picker_doc,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
    streamed,
    wait_for,
)


async def refused(p: Any, *messages: Any) -> Any:
    """Send ``messages`` on a new stream; the one answer must be an immediate response,
    after which the picker ends the stream."""
    ex = p.exchange()
    await ex.send(*messages)
    (answer,) = await ex.recv()
    out = immediate(answer)
    ex.cancel()
    return out


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "tiny-llama", "prompt": ', None),  # not JSON
        (b'["a list"]', None),
        (b'{"prompt": "no model"}', "model"),
        (orjson.dumps({"model": BASE, "prompt": "x", "max_tokens": "lots"}), "max_tokens"),
        (orjson.dumps({"model": BASE, "prompt": 42}), "prompt"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(
    sim_cluster: Any, picker: Any, body: bytes, param: str | None
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    out = await refused(p, request_headers(headers={"x-request-id": "r-1"}), request_body(body))
    assert out.status == 400
    assert out.body["error"]["type"] == "invalid_request_error"
    assert out.body["error"]["param"] == param
    assert out.headers["content-type"] == "application/json"
    assert out.headers["x-request-id"] == "r-1"
    assert out.headers["x-sluicegate-dropped-reason"] == "bad-request"


async def test_unknown_model_and_unknown_path_are_404(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    out = await refused(p, request_headers(), request_body(completion(model="no-such-model")))
    assert out.status == 404
    assert out.body["error"]["code"] == "model_not_found"
    assert "no-such-model" in out.body["error"]["message"]
    out = await refused(p, request_headers("/v1/load_lora_adapter"), request_body(completion()))
    assert out.status == 404
    assert "administrative" in out.body["error"]["message"]


async def test_body_over_the_limit_is_a_413_as_soon_as_it_is_known(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, settings={"maxBodyBytes": 2048})
    ex = p.exchange()
    await ex.send(request_headers(), request_body(b"x" * 1500, end_of_stream=False))
    await ex.no_answer()
    await ex.send(request_body(b"x" * 1500, end_of_stream=False))  # 3000 > 2048: no need to wait
    (answer,) = await ex.recv()
    out = immediate(answer)
    assert out.status == 413
    assert "2048" in out.body["error"]["message"]
    ex.cancel()
    # At the limit is fine.
    body = completion(prompt="y" * (2048 - len(completion(prompt=""))))
    assert len(body) == 2048
    ex = p.exchange()
    await ex.send(request_headers(), request_body(body))
    assert set_headers((await ex.recv(2))[0])[DESTINATION] in p.addresses()
    ex.cancel()


async def test_sheddable_request_on_a_saturated_pool_is_a_429(
    sim_cluster: Any, picker: Any
) -> None:
    cluster = await sim_cluster(replicas=1)
    docs = [
        model_doc("bulk", {BASE: 1}, "Sheddable"),
        model_doc("chat", {BASE: 1}, "Critical"),
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            **picker_doc(**ONE_AT_A_TIME),
        },
    ]
    p = await picker(cluster, docs=docs)
    # The pool has room: a sheddable request goes through.
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion(model="bulk")))
    assert kind((await ex.recv(2))[0]) == "request_headers"
    # Now one request is in flight, the only endpoint is full: sheddable work is shed.
    out = await refused(p, request_headers(), request_body(completion(model="bulk")))
    assert out.status == 429
    assert out.headers["retry-after"] == "1"
    assert out.headers["x-sluicegate-dropped-reason"] == "rejected-saturated"
    assert out.body["error"]["type"] == "rate_limit_error"
    # Critical requests are still served.
    ex2 = p.exchange()
    await ex2.send(request_headers(), request_body(completion(model="chat")))
    assert kind((await ex2.recv(2))[0]) == "request_headers"
    ex.cancel()
    ex2.cancel()


async def test_no_eligible_endpoint_is_a_503(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    p = await picker(cluster)
    out = await refused(p, request_headers(subset=[]), request_body(completion()))
    assert (out.status, out.headers["retry-after"]) == (503, "1")
    assert "subset" in out.body["error"]["message"]
    out = await refused(p, request_headers(subset=["10.9.9.9:8000"]), request_body(completion()))
    assert out.status == 503
    # The servers go away: their scrapes fail and they are ejected.
    await cluster.stop()
    endpoints = p.runtime.datastore.all_endpoints()
    await wait_for(lambda: all(e.health.ejected for e in endpoints), what="all ejected")
    out = await refused(p, request_headers(), request_body(completion()))
    assert out.status == 503
    assert out.body["error"]["code"] == "no_endpoint"
    # Without a body too.
    out = await refused(p, request_headers("/v1/responses/r1", method="GET", end_of_stream=True))
    assert out.status == 503


async def test_a_pool_without_endpoints_is_a_503_at_once_even_with_queueing(
    sim_cluster: Any, picker: Any
) -> None:
    # The published example beside the fixture's pool: its "qwen-pool" has a selector,
    # no endpoints, and asks for queueing.
    fixture = Path(__file__).parent.parent / "fixtures" / "published-priority-example.yaml"
    docs = [d for d in yaml.safe_load_all(fixture.read_text()) if d]
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=docs)
    pool = p.runtime.datastore.pools["qwen-pool"]
    assert p.runtime.director.flow.enabled_for(pool.annotations)
    started = time.perf_counter()
    out = await refused(p, request_headers(), request_body(completion(model="travel-helper")))
    assert time.perf_counter() - started < 1.0
    assert (out.status, out.headers["retry-after"]) == (503, "1")
    message = out.body["error"]["message"]
    assert "pool 'qwen-pool' has no endpoints" in message
    assert "spec.endpoints" in message
    assert p.runtime.director.waiting_requests() == 0


async def test_not_synced_yet_is_a_503(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    synced = False
    p = await picker(cluster, synced=lambda: synced)
    out = await refused(p, request_headers(), request_body(completion()))
    assert out.status == 503
    assert "synced" in out.body["error"]["message"]
    synced = True
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion()))
    assert set_headers((await ex.recv(2))[0])[DESTINATION] in p.addresses()
    ex.cancel()


async def test_request_body_streamed_without_override_is_refused(
    sim_cluster: Any, picker: Any
) -> None:
    from ep_support import MODES

    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)
    ex = p.exchange()
    await ex.send(request_headers(request_mode=MODES.STREAMED))
    await ex.recv()  # the mode override, which this "proxy" ignores
    await ex.send(request_body(b'{"model": ', end_of_stream=False))
    (answer,) = await ex.recv()
    out = immediate(answer)
    assert out.status == 500
    assert "allow_mode_override" in out.body["error"]["message"]
    ex.cancel()


async def test_unexpected_fault_is_a_500_and_the_server_carries_on(
    sim_cluster: Any, picker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    with monkeypatch.context() as m:
        m.setattr(p.runtime, "acquire", broken)
        out = await refused(p, request_headers(), request_body(completion()))
    assert out.status == 500
    assert out.body["error"]["code"] == "internal_error"
    assert "boom" not in str(out.body)  # internals stay in the log
    # The next request is served.
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion()))
    assert set_headers((await ex.recv(2))[0])[DESTINATION] in p.addresses()
    ex.cancel()


async def test_fault_in_the_response_phase_passes_the_response_through(
    sim_cluster: Any, picker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})])
    ex = p.exchange()
    await ex.send(request_headers(), request_body(completion(model="food-review", stream=True)))
    await ex.recv(2)
    await ex.send(response_headers(headers={"content-type": "text/event-stream"}))
    await ex.recv()
    first = b'data: {"model":"tiny-llama","choices":[{"text":"a"}]}\n\n'
    half = b'data: {"model": "tiny-llama", "choi'
    await ex.send(response_body(first, end_of_stream=False), response_body(half, False))
    answers = await ex.recv(1)  # the complete event; the half event is held back
    await ex.no_answer()

    from sluicegate.extproc.response import ResponseRelay

    def broken(self: Any, chunk: bytes, end: bool) -> bytes:
        raise RuntimeError("boom")

    monkeypatch.setattr(ResponseRelay, "feed", broken)
    rest = b'ces": [{"text": "b"}]}\n\ndata: [DONE]\n\n'
    await ex.send(response_body(rest, end_of_stream=True))
    answers += await ex.recv(1)
    # What was held back goes on, followed by the rest untouched: the stream is intact.
    assert streamed(answers, "response_body") == (
        b'data: {"model":"food-review","choices":[{"text":"a"}]}\n\n'
        + b'data: {"model": "food-review", "choi'
        + rest
    )
    await ex.finish()
    assert p.inflight() == 0
