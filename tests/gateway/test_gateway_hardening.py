"""Hostile or odd input at the gateway's door: auth on the request head, bytes that are not
UTF-8, deep JSON, big integers, routing-control headers from untrusted clients, HEAD probes.
Every refusal is a clear 4xx and the next good request is served."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gw_support import GatewayFactory, gateway_doc, model_doc, pool_doc

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway
from sluicegate.gateway.http import Refusal, Request
from sluicegate.live_metrics import ClientConnections

BASE = "tiny-llama"
KEY = "acceptedKey0123456789"
TRUSTED = "trustedKey0123456789"
REWRITE = "x-gateway-model-name-rewrite"
GENERATED_ID = re.compile(r"[0-9a-f]{32}")


def url(gw: Gateway, path: str = "/v1/completions") -> str:
    return f"http://127.0.0.1:{gw.port}{path}"


async def ok(http: aiohttp.ClientSession, gw: Gateway, key: str | None = None) -> None:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": BASE, "prompt": "ok", "max_tokens": 1}
    async with http.post(url(gw), json=body, headers=headers) as r:
        assert r.status == 200, await r.text()


async def raw_exchange(
    gw: Gateway, head: bytes, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One request written byte for byte (so any byte can be in a header); the status,
    headers (lower-case names) and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        writer.write(head + b"\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            payload = await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()
    return int(status_line.split()[1]), headers, payload


def post_head(gw: Gateway, extra: bytes, length: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + extra
        + b"content-length: %d\r\n" % length
    )


def head_only(path: str, headers: dict[str, str]) -> Request:
    return Request("POST", path, path, headers, b"", "1.1")


# --------------------------------------------------------------------------- auth


async def test_head_check_decides_auth(sim_cluster: Any, gateway: GatewayFactory) -> None:
    gw = await gateway(await sim_cluster(replicas=1), api_keys=[KEY])
    refusal = gw._check_head(head_only("/v1/completions", {"x-request-id": "r-1"}))
    assert isinstance(refusal, Refusal)
    assert refusal.status == 401
    assert ("x-request-id", "r-1") in refusal.headers
    assert ("x-sluicegate-dropped-reason", "unauthorized") in refusal.headers
    assert ("www-authenticate", "Bearer") in refusal.headers
    error = json.loads(refusal.body)["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert gw._check_head(head_only("/v1/completions", {"authorization": f"bearer {KEY}"})) is None
    for path in ("/v1/models", "/v1/chat/completions", "/nope"):
        assert gw._check_head(head_only(path, {})) is not None, path
    for path in ("/health", "/ready", "/metrics"):
        assert gw._check_head(head_only(path, {})) is None, path
    # Bytes that are not UTF-8 (decoded by the server with surrogate escapes), a bad id.
    for auth in ("Bearer \udcff\udcfe", "Bearer caf\udcc3", "\udcff", "Bearer "):
        refused = gw._check_head(
            head_only("/v1/completions", {"authorization": auth, "x-request-id": "\udcff"})
        )
        assert isinstance(refused, Refusal), auth
        request_id = dict(refused.headers)["x-request-id"]
        assert GENERATED_ID.fullmatch(request_id)


async def test_a_401_comes_before_the_body(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """Needs the HTTP server's head checks (``on_head``)."""
    gw = await gateway(await sim_cluster(replicas=1), api_keys=[KEY])
    # A head announcing a megabyte that never comes: answered at once.
    status, headers, body = await raw_exchange(
        gw, post_head(gw, b"authorization: Bearer \xff\xfe\r\nx-request-id: id-\xff\r\n", 1 << 20)
    )
    assert status == 401
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    assert GENERATED_ID.fullmatch(headers["x-request-id"])
    async with http.get(url(gw, "/v1/models")) as r:
        assert r.status == 401
    async with http.get(url(gw, "/metrics")) as r:
        assert r.status == 200  # open unless metricsAuth
    await ok(http, gw, KEY)


async def test_metrics_auth(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    gw = await gateway(
        await sim_cluster(replicas=1), api_keys=[KEY], settings={"metricsAuth": True}
    )
    assert gw._check_head(head_only("/metrics", {})) is not None
    assert gw._check_head(head_only("/metrics", {"authorization": f"Bearer {KEY}"})) is None
    assert gw._check_head(head_only("/health", {})) is None
    async with http.get(url(gw, "/metrics")) as r:  # needs the server's head checks
        assert r.status == 401
    async with http.get(url(gw, "/metrics"), headers={"authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200


# --------------------------------------------------------------------------- bytes


async def test_bad_request_ids_are_replaced_and_logged_cleanly(
    sim_cluster: Any, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    from sluicegate.gateway.app import GatewayOptions

    gw = await gateway(await sim_cluster(replicas=1))
    gw.options = GatewayOptions(gw.options.runtime, access_log=True)
    body = b'{"model": "tiny-llama", "prompt": "x", "max_tokens": 1}'
    caplog.set_level(logging.INFO, logger="sluicegate.access")
    for bad_id in (b"abc\xff", b"x" * 129, "naïve".encode()):
        status, headers, _ = await raw_exchange(
            gw, post_head(gw, b"x-request-id: " + bad_id + b"\r\n", len(body)), body
        )
        assert status == 200
        assert GENERATED_ID.fullmatch(headers["x-request-id"])
        logged = json.loads(caplog.records[-1].getMessage())
        assert logged["request_id"] == headers["x-request-id"]
        assert logged["status"] == 200
    status, headers, _ = await raw_exchange(
        gw, post_head(gw, b"x-request-id: req-7\r\n", len(body)), body
    )
    assert (status, headers["x-request-id"]) == (200, "req-7")
    # A gateway error for a request with a bad id: a clean id on the answer too.
    status, headers, err = await raw_exchange(
        gw, post_head(gw, b"x-request-id: \xfe\r\n", 4), b"{bad"
    )
    assert status == 400
    assert "not valid JSON" in json.loads(err)["error"]["message"]
    assert GENERATED_ID.fullmatch(headers["x-request-id"])


async def test_bad_bytes_in_control_headers_are_400(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    body = b'{"model": "tiny-llama", "prompt": "x", "max_tokens": 1}'
    for header in (b"x-gateway-inference-fairness-id", b"x-slo-ttft-ms"):
        status, _, err = await raw_exchange(
            gw, post_head(gw, header + b": t\xff\r\n", len(body)), body
        )
        assert status == 400, header
        assert json.loads(err)["error"]["param"] == header.decode()
    await ok(http, gw)


# --------------------------------------------------------------------------- JSON


def deep_body(depth: int, model: str = BASE) -> bytes:
    return (b'{"model":"%s","prompt":"x","max_tokens":1,"x":' % model.encode()) + (
        b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    )


async def test_deep_json_is_one_400(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, lora=["food-v1"])
    gw = await gateway(cluster, docs=[model_doc("food-review", {"food-v1": 1})])
    for model in (BASE, "food-review"):  # the second is rewritten for its target
        for depth in (129, 300, 1024, 1100):
            async with http.post(url(gw), data=deep_body(depth, model)) as r:
                assert r.status == 400, (model, depth)
                assert "deeper than 128 levels" in (await r.json())["error"]["message"]
        async with http.post(url(gw), data=deep_body(128, model)) as r:
            assert r.status == 200, await r.text()
    content = "[" * 200 + "]" * 200
    chat = '{"model":"food-review","messages":[{"role":"user","content":' + content + "}]}"
    async with http.post(url(gw, "/v1/chat/completions"), data=chat) as r:
        assert r.status == 400
    await ok(http, gw)


class BodyRecorder:
    """A model server that records the bodies it receives and answers with the model it
    was asked for (and a number no 64-bit integer holds)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.port = 0
        self.runner: web.AppRunner | None = None

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
        raw = await request.read()
        self.bodies.append(raw)
        model = json.loads(raw)["model"]
        answer = {"id": "c", "object": "text_completion", "model": model, "n": 10**23}
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text='vllm:num_requests_waiting{model_name="m"} 0\n'
            'vllm:num_requests_running{model_name="m"} 0\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0\n'
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "target-é/v1", "parent": None}]})


async def test_big_integers_reach_the_server_exactly(http: aiohttp.ClientSession) -> None:
    upstream = BodyRecorder()
    await upstream.start()
    config = build_config(
        [
            pool_doc([f"127.0.0.1:{upstream.port}"]),
            gateway_doc(scrapeIntervalMs=20),
            model_doc("public", {"target-é/v1": 1}),
        ]
    )
    gw = Gateway(config)
    await gw.start("127.0.0.1", 0)
    try:
        assert gw.collector is not None
        for endpoint in gw.datastore.all_endpoints():
            await gw.collector.refresh(endpoint)
        sent = (
            b'{"messages_like": [{"model": "public"}], "prompt": "x", '
            b'"max_tokens": 100000000000000000000000, "seed": 1180591620717411303424, '
            b'"model" : "public"}'
        )
        async with http.post(url(gw), data=sent) as r:
            assert r.status == 200, await r.text()
            answer = await r.read()
        upstream_body = json.loads(upstream.bodies[-1])
        assert upstream_body["max_tokens"] == 10**23
        assert upstream_body["seed"] == 2**70
        assert upstream_body["model"] == "target-é/v1"
        assert upstream_body["messages_like"] == [{"model": "public"}]  # nested: untouched
        assert json.loads(answer)["model"] == "public"
    finally:
        await gw.stop()
        assert upstream.runner is not None
        await upstream.runner.cleanup()


# --------------------------------------------------------------------------- trust


async def _targets(gw: Gateway, http: aiohttp.ClientSession, headers: dict[str, str]) -> str:
    before = {t: gw.metrics.requests.labels("split", t).value for t in ("v1", "v2")}
    body = {"model": "split", "prompt": "x", "max_tokens": 1}
    async with http.post(url(gw), json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
    after = {t: gw.metrics.requests.labels("split", t).value for t in ("v1", "v2")}
    (target,) = [t for t in after if after[t] != before[t]]
    return target


async def test_routing_headers_only_from_trusted_clients(
    sim_cluster: Any, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, lora=["v1", "v2"])
    docs = [model_doc("split", {"v1": 1})]
    gw = await gateway(cluster, docs=docs)
    assert await _targets(gw, http, {REWRITE: "v2"}) == "v1"  # ignored

    gw = await gateway(cluster, docs=docs, settings={"trustControlHeaders": True})
    assert await _targets(gw, http, {REWRITE: "v2"}) == "v2"

    gw = await gateway(cluster, docs=docs, api_keys=[KEY], settings={"trustedApiKeys": [TRUSTED]})
    assert await _targets(gw, http, {REWRITE: "v2", "authorization": f"Bearer {KEY}"}) == "v1"
    assert await _targets(gw, http, {REWRITE: "v2", "authorization": f"Bearer {TRUSTED}"}) == "v2"
    assert await _targets(gw, http, {"authorization": f"Bearer {TRUSTED}"}) == "v1"


# --------------------------------------------------------------------------- small ones


async def test_head_probes(sim_cluster: Any, gateway: GatewayFactory) -> None:
    gw = await gateway(await sim_cluster(replicas=1))
    for path in (b"/health", b"/ready"):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"HEAD " + path + b" HTTP/1.1\r\nhost: x\r\n\r\nGET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            assert b"content-type: application/json" in head
            # No body: the next bytes are the pipelined GET's answer.
            second = await reader.readuntil(b"\r\n\r\n")
            assert second.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(15) == b'{"status":"ok"}'
        writer.close()


async def test_client_limits_reach_the_server(
    sim_cluster: Any, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {"maxConnections": 64, "maxBufferedBodyBytes": "64Mi", "bodyTimeoutMs": 2500}
    gw = await gateway(await sim_cluster(replicas=1), settings=settings)
    server = gw._server
    assert server is not None
    assert (server.max_connections, server.max_buffered_body_bytes) == (64, 64 << 20)
    assert server.body_timeout_s == 2.5
    assert server.on_head == gw._check_head
    changed = gw.config.gateway.model_copy(update={"max_connections": 65})
    caplog.set_level(logging.WARNING, logger="sluicegate.gateway")
    gw.apply_config(dataclasses.replace(gw.config, gateway=changed))
    assert "maxConnections changes take effect at the next restart" in caplog.text
    assert "maxBodyBytes" not in caplog.text


def test_client_connection_metrics() -> None:
    config = build_config([pool_doc(["127.0.0.1:1"]), gateway_doc()])
    gw = Gateway(config)
    numbers = ClientConnections(open=3, refused=2, buffered_body_bytes=4096, body_timeouts=1)
    gw.metrics.watch_client_connections(lambda: numbers)
    text = gw.metrics.render().decode()
    assert "sluicegate_client_connections 3.0" in text
    assert "sluicegate_client_connections_refused_total 2.0" in text
    assert "sluicegate_request_body_buffered_bytes 4096.0" in text
    assert "sluicegate_request_body_timeouts_total 1.0" in text
