"""Bad input gets a clear 4xx and the gateway keeps serving; control headers stay ours."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gw_support import GatewayFactory, gateway_doc, model_doc, pool_doc

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway

BASE = "tiny-llama"


def url(gw: Gateway, path: str = "/v1/completions") -> str:
    return f"http://127.0.0.1:{gw.port}{path}"


async def _ok(http: aiohttp.ClientSession, gw: Gateway) -> None:
    async with http.post(url(gw), json={"model": BASE, "prompt": "ok", "max_tokens": 1}) as r:
        assert r.status == 200, await r.text()


BAD_BODIES = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"prompt": "no model"}', 400, "model"),
    (b'{"model": 7, "prompt": "x"}', 400, "model"),
    (b'{"model": "tiny-llama", "prompt": "x", "max_tokens": "many"}', 400, "max_tokens"),
    (b'{"model": "tiny-llama", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    (b'{"model": "tiny-llama", "prompt": "x", "stream": "maybe"}', 400, "stream"),
    (b'{"model": "tiny-llama", "prompt": {"a": 1}}', 400, "prompt"),
    (b'{"model": "tiny-llama", "prompt": "x", "cache_salt": 5}', 400, "cache_salt"),
    (b'{"model": "nobody-serves-this", "prompt": "x"}', 404, "model"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_BODIES)
async def test_bad_bodies_get_4xx_naming_the_field(
    sim_cluster: Any,
    gateway: GatewayFactory,
    http: Any,
    body: bytes,
    status: int,
    param: str | None,
) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    async with http.post(url(gw), data=body, headers={"content-type": "application/json"}) as r:
        assert r.status == status
        error = (await r.json())["error"]
        assert error["message"]
        assert error["param"] == param
    await _ok(http, gw)


async def test_bad_chat_messages(sim_cluster: Any, gateway: GatewayFactory, http: Any) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    for messages in ([], "hi", [{"content": "no role"}], [42]):
        async with http.post(
            url(gw, "/v1/chat/completions"), json={"model": BASE, "messages": messages}
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "messages"
    await _ok(http, gw)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-slo-ttft-ms", "soon"),
        ("x-slo-tpot-ms", "-5"),
        ("x-llm-d-slo-ttft-ms", "nan"),
        ("x-gateway-inference-objective", "x" * 300),
    ],
)
async def test_malformed_control_headers_are_400(
    sim_cluster: Any, gateway: GatewayFactory, http: Any, header: str, value: str
) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    async with http.post(
        url(gw), json={"model": BASE, "prompt": "x"}, headers={header: value}
    ) as r:
        assert r.status == 400
        assert header in (await r.json())["error"]["message"]
    await _ok(http, gw)


async def test_lenient_fields_pass_through(
    sim_cluster: Any, gateway: GatewayFactory, http: Any
) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    body = {
        "model": BASE,
        "prompt": "x",
        "max_tokens": "3",
        "temperature": "0",
        "stream": "false",
        "ignore_eos": True,
        "some_vendor_field": {"kept": True},
    }
    async with http.post(url(gw), json=body) as r:
        assert r.status == 200
        assert (await r.json())["usage"]["completion_tokens"] == 3


async def test_oversized_body_is_413(sim_cluster: Any, gateway: GatewayFactory, http: Any) -> None:
    gw = await gateway(await sim_cluster(replicas=1), settings={"maxBodyBytes": 4096})
    async with http.post(url(gw), json={"model": BASE, "prompt": "x" * 10_000}) as r:
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "body_too_large"
    await _ok(http, gw)


async def test_api_key(sim_cluster: Any, gateway: GatewayFactory, http: Any) -> None:
    key = "s3cret-0123456789abcdef"  # keys need at least 16 characters
    gw = await gateway(await sim_cluster(replicas=1), api_keys=[key])
    body = {"model": BASE, "prompt": "x", "max_tokens": 1}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": key}):
        async with http.post(url(gw), json=body, headers=headers) as r:
            assert r.status == 401
    async with http.get(url(gw, "/v1/models")) as r:
        assert r.status == 401
    async with http.post(url(gw), json=body, headers={"authorization": f"Bearer {key}"}) as r:
        assert r.status == 200
    async with http.get(url(gw, "/health")) as r:  # probes need no key
        assert r.status == 200


async def test_model_known_to_config_but_not_served_is_503(
    sim_cluster: Any, gateway: GatewayFactory, http: Any
) -> None:
    gw = await gateway(
        await sim_cluster(replicas=1), docs=[model_doc("ghost", {"missing-adapter": 1})]
    )
    async with http.post(url(gw), json={"model": "ghost", "prompt": "x"}) as r:
        assert r.status == 503
        assert r.headers["Retry-After"]


class RecordingUpstream:
    """A fake model server that records the headers it receives."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _complete(self, request: web.Request) -> web.Response:
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response(
            {
                "id": "x",
                "object": "text_completion",
                "model": BASE,
                "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text='vllm:num_requests_waiting{model_name="m"} 0\n'
            'vllm:num_requests_running{model_name="m"} 0\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0\n'
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": BASE, "parent": None}]})


async def test_client_cannot_choose_the_upstream(http: Any) -> None:
    upstreams = [RecordingUpstream(), RecordingUpstream()]
    for u in upstreams:
        await u.start()
    addresses = [f"127.0.0.1:{u.port}" for u in upstreams]
    config = build_config([pool_doc(addresses), gateway_doc(scrapeIntervalMs=20)])
    gw = Gateway(config)
    await gw.start("127.0.0.1", 0)
    try:
        for endpoint in gw.datastore.all_endpoints():
            assert gw.collector is not None
            await gw.collector.refresh(endpoint)
        forced = {
            "x-gateway-destination-endpoint": addresses[1],
            "x-gateway-destination-endpoint-subset": addresses[1],
            "x-gateway-inference-objective": "batch",
            "x-gateway-inference-fairness-id": "tenant-a",
            "x-gateway-model-name-rewrite": BASE,
            "x-request-id": "req-123",
        }
        for i in range(10):
            body = {"model": BASE, "prompt": f"distinct prompt {i}"}
            async with http.post(url(gw), json=body, headers=forced) as r:
                assert r.status == 200
                assert r.headers["x-request-id"] == "req-123"
        seen = [h for u in upstreams for h in u.headers]
        assert len(seen) == 10
        assert all(len(u.headers) > 0 for u in upstreams)  # not pinned to the forced one
        for headers in seen:
            for name in forced:
                if name != "x-request-id":
                    assert name not in headers, name
            assert headers["x-request-id"] == "req-123"
    finally:
        await gw.stop()
        for u in upstreams:
            assert u.runner is not None
            await u.runner.cleanup()


async def test_health_ready_metrics(sim_cluster: Any, gateway: GatewayFactory, http: Any) -> None:
    cluster = await sim_cluster(replicas=2)
    gw = await gateway(cluster)
    await _ok(http, gw)
    async with http.get(url(gw, "/health")) as r:
        assert r.status == 200
    async with http.get(url(gw, "/ready")) as r:
        assert r.status == 200
        assert (await r.json())["ready_endpoints"] == 2
    async with http.get(url(gw, "/metrics")) as r:
        text = await r.text()
    for name in (
        "inference_objective_request_total",
        "inference_objective_running_requests",
        "inference_extension_scheduler_e2e_duration_seconds",
        "inference_pool_average_kv_cache_utilization",
        "inference_pool_ready_pods",
        "inference_extension_prefix_indexer_size",
        "sluicegate_gateway_overhead_seconds",
    ):
        assert name in text, name
    await cluster.stop()
    for e in gw.datastore.all_endpoints():
        assert gw.collector is not None
        for _ in range(3):
            await gw.collector.refresh(e)
    async with http.get(url(gw, "/ready")) as r:
        assert r.status == 503


async def test_gateway_answers_carry_the_request_id(
    sim_cluster: Any, gateway: GatewayFactory, http: Any
) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    async with http.post(url(gw), data=b"{bad", headers={"x-request-id": "abc-1"}) as r:
        assert r.status == 400
        assert r.headers["x-request-id"] == "abc-1"
    async with http.post(url(gw), json={"model": "unknown-model", "prompt": "x"}) as r:
        assert r.status == 404
        assert len(r.headers["x-request-id"]) >= 16  # generated when the client sent none


async def test_made_up_model_names_share_one_error_series(
    sim_cluster: Any, gateway: GatewayFactory, http: Any
) -> None:
    """Client-chosen model names must not fill the error metric's label sets (bounded
    memory), nor push a served model's errors out of their own series."""
    gw = await gateway(await sim_cluster(replicas=1))
    for i in range(20):
        async with http.post(url(gw), json={"model": f"made-up-{i}", "prompt": "x"}) as r:
            assert r.status == 404
    registry = gw.metrics.registry
    name = "inference_objective_request_error_total"
    unknown = {"model_name": "_unknown", "target_model_name": "", "error_code": "404"}
    assert registry.get_sample_value(name, unknown) == 20
    assert registry.get_sample_value(name, {**unknown, "model_name": "made-up-0"}) is None
    await _ok(http, gw)
