"""SIGTERM to a real ``sluicegate serve`` under load: readiness fails first, requests go on
for the drain delay, streams in flight finish, the process exits 0 and no request that was
sent is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(path: Path, urls: list[str], gateway: dict[str, Any] | None = None) -> Path:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "pool"},
            "spec": {
                "targetPorts": [{"number": 8000}],
                "endpoints": [{"address": u, "name": f"sim-{i}"} for i, u in enumerate(urls)],
            },
        },
        {
            "apiVersion": "sluicegate.dev/v1alpha1",
            "kind": "GatewayConfig",
            "spec": {"scrapeIntervalMs": 20, "metricsStalenessMs": 2000, **(gateway or {})},
        },
    ]
    path.write_text(yaml.safe_dump_all(docs))
    return path


def start_serve(config: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """``sluicegate serve --config CONFIG ARGS`` on a free port, once it listens."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "SLUICEGATE_API_KEYS"}
    port_args = ["--port", str(port), *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(config), *port_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**env, "PYTHONPATH": SRC, "COLUMNS": "200"},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"serve exited: {err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("serve did not start listening")


async def stream(http: aiohttp.ClientSession, port: int, prompt: str, tokens: int) -> bool:
    """A streamed completion; True when it arrived whole (status 200, ``[DONE]`` last)."""
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
        text = (await r.read()).decode()
    if r.status != 200:
        return False
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    return events[-1:] == ["[DONE]"] and len(chunks) >= tokens


async def test_sigterm_drains_without_losing_a_request(sim_cluster: Any, tmp_path: Path) -> None:
    cluster = await sim_cluster(replicas=2, time_scale=1.0)
    config = write_config(tmp_path / "gw.yaml", cluster.urls)
    proc, port = start_serve(config, "--drain-delay", "1.0", "--shutdown-grace", "10")
    base = f"http://127.0.0.1:{port}"
    sent: list[asyncio.Task[bool]] = []
    ready_seen: list[int] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            deadline = time.monotonic() + 10
            while True:  # ready once the endpoints are scraped
                async with http.get(f"{base}/ready") as r:
                    if r.status == 200:
                        break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            # Long streams in flight when the signal comes (~1.5 s of tokens each).
            long = [asyncio.create_task(stream(http, port, f"long {i}", 600)) for i in range(4)]
            await asyncio.sleep(0.3)
            signalled_at: float | None = None
            i = 0
            # A load balancer's view: new requests only while /ready says 200.
            while True:
                async with http.get(f"{base}/ready") as r:
                    ready_seen.append(r.status)
                    if r.status != 200:
                        assert (await r.json())["draining"] is True
                        break
                for _ in range(3):
                    sent.append(asyncio.create_task(stream(http, port, f"short {i}", 4)))
                    i += 1
                if signalled_at is None and i >= 30:
                    proc.send_signal(signal.SIGTERM)
                    signalled_at = time.monotonic()
                await asyncio.sleep(0.03)
            assert signalled_at is not None
            not_ready_after = time.monotonic() - signalled_at
            short_ok = await asyncio.gather(*sent)
            long_ok = await asyncio.gather(*long)
        code = await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
    assert not_ready_after < 0.5  # readiness failed first, within a poll or two
    assert all(long_ok), long_ok
    assert len(short_ok) >= 30
    assert all(short_ok), short_ok
    with socket.socket() as s:  # gone: the listener is closed
        assert s.connect_ex(("127.0.0.1", port)) != 0
