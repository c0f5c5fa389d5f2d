"""The published queueing-and-priority example (tests/fixtures/) run by ``sluicegate serve``.

As published, its pool has a selector and no endpoints: the gateway must say so at start
(one log line), in ``/health``, and answer its requests 503 at once — never after the
queue's time to live, although the pool asks for queueing. With the documented edit (the
pool's ``endpoints``) its models are served; the "qwen" InferenceModel targets a name the
servers do not serve ("/model/qwen"), also a 503 at once, and an InferenceModelRewrite
fixes it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from gw_support import gateway_doc, wait_until_scraped

from sluicegate.api.loader import Config, build_config
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.runtime import RuntimeOptions

FIXTURE = Path(__file__).parent.parent / "fixtures" / "published-priority-example.yaml"
POOL = "qwen-pool"
SERVED_BASE = "/model/qwen"


def published() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(FIXTURE.read_text()) if d]


def with_endpoints(docs: list[dict[str, Any]], urls: list[str]) -> list[dict[str, Any]]:
    """The documented edit: the pool lists its servers."""
    pool = docs[0]
    assert pool["kind"] == "InferencePool"
    pool["spec"]["endpoints"] = [{"address": u} for u in urls]
    return docs


async def start(config: Config) -> Gateway:
    gw = Gateway(config, GatewayOptions(RuntimeOptions()))
    await gw.start("127.0.0.1", 0)
    return gw


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def post(http: aiohttp.ClientSession, gw: Gateway, body: dict[str, Any]) -> Any:
    started = time.perf_counter()
    async with http.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions", json=body) as r:
        answer = await r.json()
        return r.status, answer, time.perf_counter() - started


async def test_as_published_the_empty_pool_is_said_once_and_answered_503_at_once(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    config = build_config([*published(), gateway_doc(scrapeIntervalMs=20)])
    gw = await start(config)
    try:
        pool = gw.runtime.datastore.pools[POOL]
        # The annotation turns queueing on for this pool: the refusal must not wait.
        assert gw.runtime.director.flow.enabled_for(pool.annotations)
        lines = [r.getMessage() for r in caplog.records if POOL in r.getMessage()]
        assert len(lines) == 1, lines
        assert "no endpoints" in lines[0]
        assert "spec.endpoints" in lines[0]
        assert "--kubernetes" in lines[0]
        assert "app=qwen" in lines[0]
        for model in ("qwen", "travel-helper"):
            status, body, took = await post(http, gw, chat(model))
            assert status == 503, body
            assert took < 1.0
            message = body["error"]["message"]
            assert f"pool '{POOL}' has no endpoints" in message
            assert "spec.endpoints" in message
            assert body["error"]["code"] == "no_endpoint"
        assert gw.runtime.director.waiting_requests() == 0
        async with http.get(f"http://127.0.0.1:{gw.port}/health") as r:
            assert r.status == 200  # liveness: restarting adds no endpoint
            health = await r.json()
        assert health["status"] == "degraded"
        assert [p["pool"] for p in health["empty_pools"]] == [POOL]
        assert "spec.endpoints" in health["empty_pools"][0]["fix"]
        async with http.get(f"http://127.0.0.1:{gw.port}/ready") as r:
            assert r.status == 503
    finally:
        await gw.stop()


async def test_with_endpoints_the_example_serves_and_its_name_mismatch_is_a_503(
    sim_cluster: Any, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = await sim_cluster(
        replicas=2, served_model_name=SERVED_BASE, lora=["travel-helper-v1", "travel-helper-v2"]
    )
    docs = with_endpoints(published(), cluster.urls)
    gw = await start(build_config([*docs, gateway_doc(scrapeIntervalMs=20)]))
    try:
        assert not [r for r in caplog.records if "no endpoints" in r.getMessage()]
        await wait_until_scraped(gw)
        async with http.get(f"http://127.0.0.1:{gw.port}/health") as r:
            assert await r.json() == {"status": "ok"}
        # The adapter behind "travel-helper": served, and answered under the client's name.
        status, body, _ = await post(http, gw, chat("travel-helper"))
        assert status == 200, body
        assert body["model"] == "travel-helper"
        # The served base name passes as it is.
        status, body, _ = await post(http, gw, chat(SERVED_BASE))
        assert (status, body["model"]) == (200, SERVED_BASE)
        # "qwen" targets "qwen", which no server lists: a 503 now, not after the TTL.
        caplog.clear()
        status, body, took = await post(http, gw, chat("qwen"))
        assert status == 503, body
        assert took < 1.0
        assert f"no endpoint of pool '{POOL}' serves model 'qwen'" in body["error"]["message"]
        logged = [r.getMessage() for r in caplog.records if "serves model 'qwen'" in r.getMessage()]
        assert len(logged) == 1
        assert f"target model 'qwen'; the endpoints list: {SERVED_BASE}" in logged[0]
        await post(http, gw, chat("qwen"))  # the same refusal is not logged again
        assert len([r for r in caplog.records if "serves model 'qwen'" in r.getMessage()]) == 1
    finally:
        await gw.stop()


REWRITE = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
    "kind": "InferenceModelRewrite",
    "metadata": {"name": "qwen-served-name"},
    "spec": {
        "poolRef": {"group": "inference.networking.x-k8s.io", "name": POOL},
        "rules": [
            {
                "matches": [{"model": {"type": "Exact", "value": "qwen"}}],
                "targets": [{"modelRewrite": SERVED_BASE}],
            }
        ],
    },
}


async def test_a_rewrite_fixes_the_name_and_the_answer_keeps_the_clients_name(
    sim_cluster: Any, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, served_model_name=SERVED_BASE)
    docs = with_endpoints(published(), cluster.urls)
    gw = await start(build_config([*docs, REWRITE, gateway_doc(scrapeIntervalMs=20)]))
    try:
        await wait_until_scraped(gw)
        for _ in range(2):
            status, body, _ = await post(http, gw, chat("qwen"))
            assert status == 200, body
            assert body["model"] == "qwen"
        route = gw.runtime.director.models.routes["qwen"]
        assert route.rewrite == "qwen-served-name"
        assert route.priority == 100  # the InferenceModel's Critical is kept
        async with http.get(f"http://127.0.0.1:{gw.port}/metrics") as r:
            text = await r.text()
        assert (
            "inference_extension_model_rewrite_decisions_total{"
            'model_name="qwen",model_rewrite_name="qwen-served-name",'
            f'target_model="{SERVED_BASE}"}} 2.0'
        ) in text
    finally:
        await gw.stop()
