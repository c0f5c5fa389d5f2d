"""Which paths are passed through, and the merged model list (no servers needed)."""

from __future__ import annotations

import pytest

from sluicegate.datalayer.endpoint import Endpoint, ServedModels
from sluicegate.errors import GatewayError
from sluicegate.requestcontrol.models import ModelRoute
from sluicegate.requestcontrol.models_list import model_entries, model_entry
from sluicegate.requestcontrol.routes import check_passed, generates


@pytest.mark.parametrize(
    "path",
    [
        "/v1/embeddings",
        "/v1/responses",
        "/v1/responses/resp_1/cancel",
        "/v1/audio/transcriptions",
        "/v1/score",
        "/v2/rerank",
        "/tokenize",
        "/detokenize",
        "/rerank",
        "/pooling",
        "/classify",
        "/score",
        "/invocations",
    ],
)
def test_passed(path: str) -> None:
    check_passed("POST", path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/load_lora_adapter",
        "/v1/Unload_Lora_Adapter",
        "/v1/admin",
        "/v1/admin/x",
        "/v2/admin/x",
        "/reset_prefix_cache",
        "/sleep",
        "/wake_up",
        "/pause",
        "/update_weights",
        "/collective_rpc",
        "/admin/faults",
        "/metrics/",
        "/version",
        "/",
        "/v1",
        "/v1/load%5flora_adapter",
        "/v1/%2e%2e/reset_prefix_cache",
        "/v1/./load_lora_adapter",
        "/v1/../reset_prefix_cache",
        "/v1//load_lora_adapter",
        "/v1\\load_lora_adapter",
        "/tokenize/x",
        # Servers drop a fragment and a ';' parameter before routing (aiohttp, uvicorn):
        # the route behind them must be judged, so such paths are refused whole.
        "/v1/load_lora_adapter#x",
        "/v1/chat/completions#",
        "/v1/load_lora_adapter;x",
        "/v1/load_lora_adapter/",
        "/v1/admin/",
        "/v1/load_lora_adapter ",
        "/v1/models:x",
        "v1/embeddings",
    ],
)
def test_refused(path: str) -> None:
    with pytest.raises(GatewayError) as caught:
        check_passed("POST", path)
    assert (caught.value.status, caught.value.code) == (404, "not_found")
    assert path in caught.value.message


def test_generating_routes() -> None:
    assert generates("/v1/responses")
    assert generates("/v1/audio/transcriptions")
    for path in ("/v1/embeddings", "/tokenize", "/detokenize", "/score", "/v2/rerank/"):
        assert not generates(path), path


def endpoint(name: str, *entries: dict[str, object]) -> Endpoint:
    e = Endpoint(name, "127.0.0.1", 8000)
    ids = {str(x["id"]) for x in entries}
    e.models = ServedModels(frozenset(ids), frozenset(), 1.0, tuple(entries))
    return e


BASE = {"id": "base", "owned_by": "vllm", "root": "/m/base", "parent": None, "max_model_len": 9}
LORA = {"id": "lora", "owned_by": "vllm", "root": "/a/lora", "parent": "base"}


def test_merged_list() -> None:
    endpoints = [endpoint("b", BASE, {**LORA, "owned_by": "other"}), endpoint("a", BASE, LORA)]
    routes = {
        "public": ModelRoute("public", "pool", ["base", "lora"], [1, 3], 0),
        "lora": ModelRoute("lora", "pool", ["lora"], [1], 0),  # served under that name
        "ghost": ModelRoute("ghost", "pool", ["missing"], [1], 0),
    }
    entries = {e["id"]: e for e in model_entries(endpoints, routes)}
    assert list(entries) == ["base", "ghost", "lora", "public"]
    assert entries["base"] == BASE
    assert entries["lora"] == LORA  # endpoint "a" first
    public = entries["public"]
    assert (public["parent"], public["root"], public["owned_by"]) == ("lora", "/a/lora", "vllm")
    assert "max_model_len" not in public  # the adapter's entry has none
    ghost = entries["ghost"]
    assert (ghost["parent"], ghost["root"], ghost["owned_by"]) == (
        "missing",
        "missing",
        "sluicegate",
    )


def test_one_entry() -> None:
    slashed = {**BASE, "id": "/m/qwen"}
    endpoints = [endpoint("a", slashed, {**LORA, "id": "org/name"})]
    assert model_entry("/v1/models/%2Fm%2Fqwen", endpoints, {}) == slashed
    assert model_entry("/v1/models//m/qwen", endpoints, {})["id"] == "/m/qwen"
    assert model_entry("/v1/models/org/name", endpoints, {})["id"] == "org/name"
    with pytest.raises(GatewayError) as caught:
        model_entry("/v1/models/nope", endpoints, {})
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")
