"""The runtime's part in refusing what no endpoint can serve, and in counting rewrites:
queued requests answered when a reload empties their pool or a served-model list drops
their target; rewrite decisions counted under configured names only; the predictor URLs the
Envoy picker's runtime reads from the environment."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from sluicegate.api.loader import build_config
from sluicegate.datalayer.endpoint import ServedModels
from sluicegate.errors import GatewayError
from sluicegate.extproc.run import RunOptions, _base_config
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.runtime import Runtime

QUEUEING = "inference-epp-env.networking.x-k8s.io/experimental-use-queueing"


def pool(endpoints: list[str], queueing: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferencePool",
        "metadata": {"name": "p", "annotations": {QUEUEING: "true"} if queueing else {}},
        "spec": {
            "selector": {"app": "x"},
            "targetPortNumber": 8000,
            "endpoints": [{"address": a} for a in endpoints],
        },
    }


def catch_all(target: str) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "everything"},
        "spec": {"poolRef": {"name": "p"}, "rules": [{"targets": [{"modelRewrite": target}]}]},
    }


def parsed(model: str) -> Any:
    body = orjson.dumps({"model": model, "prompt": "x", "max_tokens": 2})
    return parse_request("completions", body, {})


async def queued(runtime: Runtime, model: str) -> asyncio.Task[Any]:
    """A request that waits: the endpoint was never scraped, so it has no room."""
    task = asyncio.create_task(runtime.acquire(parsed(model), "r1", {}))
    for _ in range(100):
        await asyncio.sleep(0)
        if runtime.director.waiting_requests():
            return task
    raise AssertionError("the request did not queue")


async def test_queued_request_answered_when_a_reload_empties_its_pool() -> None:
    runtime = Runtime(build_config([pool(["127.0.0.1:9"])]))
    task = await queued(runtime, "m")
    runtime.apply_config(build_config([pool([])]))
    with pytest.raises(GatewayError) as info:
        await asyncio.wait_for(task, 1.0)
    assert info.value.status == 503
    assert "pool 'p' has no endpoints" in info.value.message
    assert runtime.director.waiting_requests() == 0
    assert runtime.empty_pools() == ["p"]
    await runtime.stop()


async def test_the_empty_pool_message_says_where_endpoints_come_from() -> None:
    runtime = Runtime(build_config([pool([])]))
    with pytest.raises(GatewayError) as info:
        await runtime.acquire(parsed("m"), "r", {})
    assert "its selector is read only with --kubernetes" in info.value.message
    assert "app=x" not in info.value.message  # no detail of the deployment to clients
    assert "spec.endpoints" in info.value.message
    # Under Kubernetes the endpoints are pods: the fix is a matching Ready pod.
    runtime.apply_config(build_config([pool([])]), {"p": []})
    with pytest.raises(GatewayError) as info:
        await runtime.acquire(parsed("m"), "r", {})
    assert "no Ready pod with an IP carries its selector's labels" in info.value.message
    await runtime.stop()


async def test_queued_request_answered_when_no_endpoint_lists_its_target_any_more() -> None:
    runtime = Runtime(build_config([pool(["127.0.0.1:9"]), catch_all("base")]))
    task = await queued(runtime, "anything")
    (endpoint,) = runtime.datastore.all_endpoints()
    endpoint.models = ServedModels(frozenset({"other"}), frozenset(), 1.0)
    runtime._on_models(endpoint)  # what the collector calls after a new listing
    with pytest.raises(GatewayError) as info:
        await asyncio.wait_for(task, 1.0)
    assert (info.value.status, info.value.reason) == (503, "model-not-served")
    await runtime.stop()


async def test_rewrite_decisions_count_configured_names_only() -> None:
    runtime = Runtime(build_config([pool(["127.0.0.1:9"], queueing=False), catch_all("base")]))
    for model in ("made-up-1", "made-up-2"):
        dispatch = await runtime.acquire(parsed(model), model, {})
        assert dispatch.request.target_model == "base"
        runtime.release(dispatch, 200)
    text = runtime.metrics.render().decode()
    line = (
        'inference_extension_model_rewrite_decisions_total{model_name="_any",'
        'model_rewrite_name="everything",target_model="base"} 2.0'
    )
    assert line in text
    assert "made-up" not in text.split("inference_extension_model_rewrite")[1].split("# HELP")[0]
    await runtime.stop()


def test_the_envoy_pickers_runtime_reads_the_predictor_urls_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PREDICTION_SERVER_URL", "http://localhost:8001,http://localhost:8002")
    monkeypatch.setenv("TRAINING_SERVER_URL", "http://localhost:8000")
    runtime = Runtime(_base_config(RunOptions()))  # what `sluicegate extproc` builds
    assert runtime.predictor is not None
    remote = runtime.predictor.remote
    assert remote is not None
    assert list(remote.settings.prediction_urls) == [
        "http://localhost:8001",
        "http://localhost:8002",
    ]
    assert remote.settings.training_url == "http://localhost:8000"
