"""Shared pieces of the reliability suite: names, a raw HTTP/1.1 client, gateways to test.

Every name the suite depends on (settings, metrics, error codes, command-line flags) is a
constant at the top of this module, so that a rename lands in one place. Times are seconds
unless a name says ``_ms``; sizes are bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml
from aiohttp import web

import sluicegate.gateway.app as gateway_app
from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.gateway.http import HttpServer
from sluicegate.runtime import RuntimeOptions
from sluicegate.sim.faults import Faults
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.server import ReplicaOptions, SimCluster

# ---------------------------------------------------------------------------- names

BASE = "tiny-llama"
"""The model every simulated replica serves (the ``tiny`` profile)."""
OTHER_MODEL = "tiny-llama-b"
"""A second model the recording upstream lists (a target a rewrite can choose)."""
API_KEY = "rel-suite-key-0123456789"
"""A valid key (API keys must be at least 16 characters)."""
SECOND_KEY = "rel-suite-key-trusted-98765"
AUTH = f"Bearer {API_KEY}"

# GatewayConfig spec fields (camelCase), the existing ones and those of issue 14.
S_API_KEYS = "apiKeys"
S_MAX_BODY = "maxBodyBytes"
S_MAX_RETRIES = "maxRetries"
S_REQUEST_TIMEOUT = "requestTimeoutMs"
S_CONNECT_TIMEOUT = "connectTimeoutMs"
S_SCRAPE_INTERVAL = "scrapeIntervalMs"
S_STALENESS = "metricsStalenessMs"
S_MAX_CONNECTIONS = "maxConnections"
S_MAX_BUFFERED = "maxBufferedBodyBytes"
S_BODY_TIMEOUT = "bodyTimeoutMs"
S_FIRST_BYTE_TIMEOUT = "firstByteTimeoutMs"
S_OUTLIER = "outlierDetection"
S_TRUST_CONTROL = "trustControlHeaders"
S_TRUSTED_KEYS = "trustedApiKeys"
S_METRICS_AUTH = "metricsAuth"

OUTLIER_SETTINGS: dict[str, Any] = {
    "consecutive5xx": 3,
    "consecutiveGatewayFailure": 3,
    "baseEjectionTimeMs": 400,
    "maxEjectionPercent": 50,
    "stallTimeoutMs": 300,
}
"""``outlierDetection`` for the fault tests: ejected after 3 failures in a row, or after
0.3 s without progress while requests wait on it (stalled); back after 0.4 s (Envoy's
outlier detection fields, in the project's camelCase with ms)."""

# Metrics the gateway exports.
M_RUNNING = "inference_objective_running_requests"
M_ENDPOINT_INFLIGHT = "sluicegate_endpoint_inflight_requests"
M_EJECTIONS = "sluicegate_endpoint_ejections_total"
M_EJECTED = "sluicegate_endpoints_ejected"
M_RETRIES = "sluicegate_upstream_retries_total"
INFLIGHT_METRICS = (M_RUNNING, M_ENDPOINT_INFLIGHT)

# Command line of ``sluicegate serve``.
F_API_KEY_FILE = "--api-key-file"
F_ALLOW_EMPTY_CONFIG = "--allow-empty-config"

LISTENING = re.compile(r"listening on \S*http://127\.0\.0\.1:(\d+)")
"""How ``serve`` announces its address (the port it bound for ``--port 0``)."""

RELOAD_LOGGED = "configuration"
"""A word of every line the gateway logs about a reload (applied, or refused)."""

IDLE_TIMEOUT_S = 0.8
"""The gateway's idle (and slow-head) timeout in these tests, instead of 75 s."""
SMALL_BODY_LIMIT = 64 * 1024
"""``maxBodyBytes`` of the bad-input gateway: small, so the 413 cases stay cheap."""
BODY_TIMEOUT_MS = 500
READ_TIMEOUT_S = 5.0
"""Longest a test waits for any one answer."""

# ---------------------------------------------------------------------------- documents


def pool_doc(urls: Sequence[str], name: str = "pool") -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "endpoints": [{"address": u, "name": f"sim-{i}"} for i, u in enumerate(urls)],
        },
    }


def model_doc(public: str, targets: Mapping[str, int], pool: str = "pool") -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": public},
        "spec": {
            "modelName": public,
            "criticality": "Standard",
            "poolRef": {"name": pool},
            "targetModels": [{"name": n, "weight": w} for n, w in targets.items()],
        },
    }


def gateway_doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig", "spec": spec}


def fast_settings(**extra: Any) -> dict[str, Any]:
    """GatewayConfig spec of every test gateway: quick scrapes, then ``extra``."""
    return {S_SCRAPE_INTERVAL: 20, S_STALENESS: 2000, **extra}


def write_config(path: Path, docs: Sequence[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))


# ---------------------------------------------------------------------------- gateways


class GatewayFactory(Protocol):
    """The ``relgw`` fixture: :func:`start_gateway`, stopped at the test's end."""

    async def __call__(
        self,
        urls: Sequence[str],
        settings: dict[str, Any] | None = None,
        docs: Sequence[dict[str, Any]] = (),
        *,
        keys: bool = True,
        access_log: bool = False,
        scrape: bool = True,
    ) -> Gateway: ...


class ServeFactory(Protocol):
    """The ``served`` fixture: ``sluicegate serve`` as a child process."""

    async def __call__(
        self, docs: Sequence[dict[str, Any]], *extra: str, key_file: bool = False
    ) -> GatewayProcess: ...


def _quick_idle_server(*args: Any, **kwargs: Any) -> HttpServer:
    # The gateway builds its server with the 75 s default; a slow-head test cannot wait that.
    kwargs["idle_timeout_s"] = IDLE_TIMEOUT_S
    return HttpServer(*args, **kwargs)


async def start_gateway(
    urls: Sequence[str],
    settings: Mapping[str, Any] | None = None,
    docs: Sequence[dict[str, Any]] = (),
    *,
    keys: bool = True,
    access_log: bool = False,
    scrape: bool = True,
) -> Gateway:
    """A :class:`Gateway` on a free port in front of ``urls``: the suite's API key in
    ``apiKeys`` (unless ``keys=False``), ``settings`` added to its GatewayConfig, the idle
    timeout :data:`IDLE_TIMEOUT_S`; every endpoint scraped once when ``scrape``."""
    spec = fast_settings(**({S_API_KEYS: [API_KEY]} if keys else {}), **(settings or {}))
    config = build_config([pool_doc(urls), gateway_doc(**spec), *docs])
    gw = Gateway(config, GatewayOptions(RuntimeOptions(), access_log=access_log))
    # The gateway module builds its HttpServer by this name; if that changes, so must this.
    original = gateway_app.HttpServer
    gateway_app.HttpServer = _quick_idle_server  # type: ignore[misc]
    try:
        await gw.start("127.0.0.1", 0)
    finally:
        gateway_app.HttpServer = original  # type: ignore[misc]
    if scrape:
        assert gw.collector is not None
        for endpoint in gw.datastore.all_endpoints():
            await gw.collector.refresh(endpoint)
    return gw


async def start_sim(
    replicas: int = 1, time_scale: float = 0.1, faults: Mapping[int, Faults] | None = None
) -> SimCluster:
    """Simulated ``tiny`` replicas on free ports (``time_scale`` wall s per simulated s)."""
    cluster = SimCluster(
        ReplicaOptions(get_profile("tiny"), time_scale=time_scale), replicas, dict(faults or {})
    )
    await cluster.start("127.0.0.1", 0)
    return cluster


@asynccontextmanager
async def running(
    settings: Mapping[str, Any] | None = None, docs: Sequence[dict[str, Any]] = ()
) -> AsyncIterator[Gateway]:
    """One simulated replica and a gateway in front of it, for the ``with`` block."""
    cluster = await start_sim()
    try:
        gw = await start_gateway(cluster.urls, settings, docs)
        try:
            yield gw
        finally:
            await gw.stop()
    finally:
        await cluster.stop()


# ---------------------------------------------------------------------------- raw HTTP


def request(
    method: str = "POST",
    path: str = "/v1/completions",
    body: bytes | dict[str, Any] | None = None,
    headers: Sequence[tuple[str, str]] = (),
    *,
    auth: bool = True,
    host: bool = True,
    length: bool = True,
) -> bytes:
    """One HTTP/1.1 request's bytes: ``Host``, the suite's key and ``Content-Length``
    added unless turned off; ``headers`` are written as given, after those."""
    raw = orjson.dumps(body) if isinstance(body, dict) else (body or b"")
    lines = [f"{method} {path} HTTP/1.1".encode()]
    if host:
        lines.append(b"Host: gateway")
    if auth:
        lines.append(f"Authorization: {AUTH}".encode())
    if raw and length:
        lines.append(b"Content-Type: application/json")
        lines.append(b"Content-Length: %d" % len(raw))
    lines.extend(f"{n}: {v}".encode("utf-8", "surrogateescape") for n, v in headers)
    return b"\r\n".join(lines) + b"\r\n\r\n" + raw


def good_body(prompt: str = "ok", max_tokens: int = 1) -> dict[str, Any]:
    return {"model": BASE, "prompt": prompt, "max_tokens": max_tokens}


GOOD = request(body=good_body())
"""A request the gateway answers 200 (with the suite's key)."""


@dataclass(slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Lower-case names; repeats joined with ``", "``."""
    body: bytes

    def error(self) -> dict[str, Any] | None:
        """The OpenAI-style ``error`` object, if the body is one."""
        try:
            payload = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            return payload["error"]
        return None

    def message(self) -> str:
        """What the answer says went wrong: the error message, or the text body."""
        error = self.error()
        if error is not None and isinstance(error.get("message"), str):
            return error["message"]
        return self.body.decode("utf-8", "replace")


async def read_answer(
    reader: asyncio.StreamReader, head_only: bool = False, timeout_s: float = READ_TIMEOUT_S
) -> Answer:
    """One response from ``reader`` (interim 1xx answers skipped); waits at most
    ``timeout_s`` for each part of it."""
    while True:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        if status >= 200:
            break
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if head_only or status in (204, 304):
        return Answer(status, headers, b"")
    if "content-length" in headers:
        size = int(headers["content-length"])
        body = await asyncio.wait_for(reader.readexactly(size), timeout_s)
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout_s)
            size = int(size_line.split(b";")[0], 16)
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), timeout_s)
            if size == 0:
                break
            parts.append(chunk[:-2])
        body = b"".join(parts)
    else:
        body = await asyncio.wait_for(reader.read(), timeout_s)
    return Answer(status, headers, body)


@dataclass(slots=True)
class Exchange:
    answers: list[Answer]
    closed: bool
    """The gateway closed the connection after its answers."""
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


async def send_raw(
    port: int,
    data: bytes,
    answers: int = 1,
    head_only: bool = False,
    close_wait_s: float = 1.0,
    pause_s: float = 0.0,
    timeout_s: float = READ_TIMEOUT_S,
) -> Exchange:
    """Write ``data`` on a new connection and read up to ``answers`` responses, then see
    whether the gateway closes the connection within ``close_wait_s``.

    With ``pause_s``, ``data`` is written in two halves around a pause (a request split
    across reads). An answer that does not come within ``timeout_s`` ends the reading
    (``answers`` is then short). The caller closes ``writer`` (:func:`close_quietly`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if pause_s:
        writer.write(data[: len(data) // 2])
        await writer.drain()
        await asyncio.sleep(pause_s)
        data = data[len(data) // 2 :]
    writer.write(data)
    got: list[Answer] = []
    closed = False
    try:
        for _ in range(answers):
            got.append(await read_answer(reader, head_only, timeout_s))
    except (asyncio.IncompleteReadError, ConnectionError):
        closed = True
    except TimeoutError:
        return Exchange(got, False, reader, writer)
    if not closed:
        closed = await is_closed(reader, close_wait_s)
    return Exchange(got, closed, reader, writer)


async def is_closed(reader: asyncio.StreamReader, wait_s: float) -> bool:
    """Whether the peer ends the connection within ``wait_s`` (sending nothing more)."""
    try:
        rest = await asyncio.wait_for(reader.read(1), wait_s)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return rest == b""


def close_quietly(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        writer.close()


async def good_request_succeeds(port: int) -> None:
    """A fresh connection still gets a 200 for :data:`GOOD`."""
    ex = await send_raw(port, GOOD, close_wait_s=0.0)
    close_quietly(ex.writer)
    assert ex.answers, "no answer to a good request"
    assert ex.answers[0].status == 200, ex.answers[0].body


# ---------------------------------------------------------------------------- metrics


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """``(labels, value)`` of every sample of metric ``name`` in a Prometheus text."""
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)", re.MULTILINE)
    return [(m.group(1) or "", float(m.group(2))) for m in pattern.finditer(text)]


def assert_inflight_zero(text: str) -> None:
    """Every in-flight gauge the gateway exports reads 0."""
    seen = 0
    for name in INFLIGHT_METRICS:
        for labels, value in samples(text, name):
            seen += 1
            assert value == 0, f"{name}{labels} = {value}"
    assert seen, f"none of {INFLIGHT_METRICS} exported"


# ---------------------------------------------------------------------------- upstream


class RecordingUpstream:
    """A model server that answers every completion and keeps the raw bodies and headers
    it received (to check what the gateway forwarded, byte for byte). It lists two
    models, :data:`BASE` and :data:`OTHER_MODEL`."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _complete(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        payload = {
            "id": "cmpl-rec",
            "object": "text_completion",
            "model": BASE,
            "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.json_response(payload)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=f'vllm:num_requests_waiting{{model_name="{BASE}"}} 0\n'
            f'vllm:num_requests_running{{model_name="{BASE}"}} 0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{BASE}"}} 0\n'
        )

    async def _models(self, request: web.Request) -> web.Response:
        models = [{"id": name, "parent": None} for name in (BASE, OTHER_MODEL)]
        return web.json_response({"data": models})


# ---------------------------------------------------------------------------- subprocess


@dataclass(slots=True)
class GatewayProcess:
    """``sluicegate serve`` in a child process (for RSS, signals and reloads)."""

    proc: subprocess.Popen[bytes]
    port: int
    config: Path
    """The configuration file it reads (rewrite it, then :meth:`reload`)."""
    log: list[str] = field(default_factory=list)
    """Lines of the child's stderr so far (read by a background thread)."""
    readers: list[threading.Thread] = field(default_factory=list)

    def rss_bytes(self) -> int:
        """Resident set size of the gateway process, from /proc (bytes)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc status")

    def reload(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for reader in self.readers:
            reader.join(2)  # they end at the pipes' end of file, now that it exited
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def serve_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sluicegate", "serve", "--config", str(config), *extra]


def _pump(stream: Any, sink: list[str]) -> None:
    for line in iter(stream.readline, b""):
        sink.append(line.decode("utf-8", "replace").rstrip())


def spawn_gateway(config: Path, *extra: str) -> tuple[GatewayProcess, list[str]]:
    """Start ``serve --config config extra...``; returns it and the list its stdout lines
    are appended to (stderr lines go to its ``log``), both read by daemon threads."""
    proc = subprocess.Popen(
        serve_command(config, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    out: list[str] = []
    child = GatewayProcess(proc, 0, config)
    for stream, sink in ((proc.stdout, out), (proc.stderr, child.log)):
        reader = threading.Thread(target=_pump, args=(stream, sink), daemon=True)
        reader.start()
        child.readers.append(reader)
    return child, out


def child_env() -> dict[str, str]:
    """The test's environment (its PYTHONPATH makes the worktree's code the one run)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "200")  # one line per announcement, not wrapped
    return env
