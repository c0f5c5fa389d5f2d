"""The picker honours routing-control headers only with ``trustControlHeaders`` (the proxy
then vouches for them), removes them either way, and replaces unusable request ids."""

from __future__ import annotations

import re
from typing import Any

import orjson
from ep_support import (
    completion,
    model_doc,
    removed_headers,
    request_body,
    request_headers,
    set_headers,
    streamed,
)

REWRITE = "x-gateway-model-name-rewrite"


async def _target_of(p: Any, headers: dict[str, str]) -> tuple[str, list[str], dict[str, str]]:
    ex = p.exchange()
    await ex.send(request_headers(headers=headers), request_body(completion(model="split")))
    answers = await ex.recv(2)
    ex.cancel()
    model = orjson.loads(streamed(answers))["model"]
    return model, removed_headers(answers[0]), set_headers(answers[0])


async def test_rewrite_header_ignored_unless_trusted(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1, lora=["v1", "v2"])
    docs = [model_doc("split", {"v1": 1})]
    untrusted = await picker(cluster, docs=docs)
    model, removed, _ = await _target_of(untrusted, {REWRITE: "v2"})
    assert model == "v1"  # the InferenceModel's split, not the client's choice
    assert REWRITE in removed  # and the header does not reach the server
    model, _, _ = await _target_of(untrusted, {})
    assert model == "v1"

    trusted = await picker(cluster, docs=docs, settings={"trustControlHeaders": True})
    model, removed, _ = await _target_of(trusted, {REWRITE: "v2"})
    assert model == "v2"
    assert REWRITE in removed


async def test_unusable_request_id_is_replaced(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1, lora=["v1"])
    p = await picker(cluster, docs=[model_doc("split", {"v1": 1})])
    for sent in ("x" * 129, "caf\u00e9", "tab\tid"):
        _, _, set_ = await _target_of(p, {"x-request-id": sent})
        assert re.fullmatch(r"[0-9a-f]{32}", set_["x-request-id"]), sent
    _, _, set_ = await _target_of(p, {"x-request-id": "req-42"})
    assert "x-request-id" not in set_  # a clean id is kept as the client sent it
