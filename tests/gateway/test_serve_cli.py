"""``sluicegate serve`` as a user runs it: the embedded default, a config file, reloads."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from gw_support import model_doc, pool_doc

from sluicegate.gateway.app import Gateway
from sluicegate.gateway.run import embedded_config
from sluicegate.scheduling.config import load_preset

BASE = "tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def serve_process() -> Iterator[Any]:
    """Start ``sluicegate serve ARGS`` on a free port; stopped with SIGINT at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return proc, port
            except OSError:
                time.sleep(0.1)
        raise AssertionError("serve did not start listening")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r,
    ):
        return r.status, await r.json()


async def _models(port: int) -> set[str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/v1/models") as r:
        return {m["id"] for m in (await r.json())["data"]}


async def test_serve_without_config_fronts_an_embedded_pool(serve_process: Any) -> None:
    proc, port = serve_process("--sim-profile", "tiny", "--sim-time-scale", "0.1")
    for _ in range(50):  # the first scrape makes the pool ready
        status, body = await _post(port, {"model": BASE, "prompt": "Hello", "max_tokens": 4})
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert "curl" in (proc.stdout.read() if proc.stdout else "")


async def test_config_reload_on_change_and_sighup(
    sim_cluster: Any, serve_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=2)
    path = tmp_path / "pool.yaml"
    pool = pool_doc(cluster.urls)
    path.write_text(yaml.safe_dump_all([pool]))
    proc, port = serve_process("--config", str(path))
    assert "first" not in await _models(port)

    # A new InferenceModel appears without a restart.
    path.write_text(yaml.safe_dump_all([pool, model_doc("first", {BASE: 1})]))
    for _ in range(60):
        if "first" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "first" in await _models(port)
    assert (await _post(port, {"model": "first", "prompt": "x", "max_tokens": 1}))[0] == 200

    # An invalid file is reported and the running configuration kept.
    path.write_text("kind: InferenceModel\napiVersion: inference.networking.x-k8s.io/v1alpha2\n")
    await asyncio.sleep(1.5)
    assert proc.poll() is None
    assert (await _post(port, {"model": "first", "prompt": "x", "max_tokens": 1}))[0] == 200

    # SIGHUP re-reads even when the modification time did not move.
    stat = path.stat()
    path.write_text(yaml.safe_dump_all([pool, model_doc("second", {BASE: 1})]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    proc.send_signal(signal.SIGHUP)
    for _ in range(60):
        if "second" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "second" in await _models(port)
    assert "first" not in await _models(port)


def test_serve_rejects_an_invalid_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
                "kind": "InferenceModel",
                "metadata": {"name": "m"},
                "spec": {"modelName": "m", "poolRef": {"name": "missing"}, "criticality": "Urgent"},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2
    assert "criticality" in result.stderr
    assert "document 1 (InferenceModel m)" in result.stderr


def test_serve_rejects_an_unknown_policy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--policy", "fastest"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "round-robin" in result.stderr  # the error lists the known presets


def test_serve_rejects_an_unknown_plugin_type(tmp_path: Path) -> None:
    path = tmp_path / "picker.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                pool_doc(["127.0.0.1:9"]),
                {
                    "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
                    "kind": "EndpointPickerConfig",
                    "plugins": [{"type": "fastest-scorer"}],
                    "schedulingProfiles": [
                        {"name": "p", "plugins": [{"pluginRef": "fastest-scorer"}]}
                    ],
                },
            ]
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2
    assert "unknown plugin type 'fastest-scorer'" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_rejects_a_bad_flow_control_policy_reference(tmp_path: Path) -> None:
    path = tmp_path / "picker.yaml"
    picker = load_preset("default").model_dump(by_alias=True, exclude_none=True)
    picker["featureGates"] = ["flowControl"]
    picker["flowControl"] = {"defaultPriorityBand": {"orderingPolicyRef": "queue-scorer"}}
    path.write_text(yaml.safe_dump_all([pool_doc(["127.0.0.1:9"]), picker]))
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2
    assert "orderingPolicyRef" in result.stderr
    assert "Traceback" not in result.stderr


async def test_reload_with_a_bad_plugin_keeps_the_running_config(
    sim_cluster: Any, serve_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=1)
    path = tmp_path / "pool.yaml"
    pool = pool_doc(cluster.urls)
    path.write_text(yaml.safe_dump_all([pool, model_doc("kept", {BASE: 1})]))
    proc, port = serve_process("--config", str(path))
    bad_picker = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer", "parameters": {"nonsense": 1}}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    path.write_text(yaml.safe_dump_all([pool, model_doc("dropped", {BASE: 1}), bad_picker]))
    await asyncio.sleep(2.0)
    assert "kept" in await _models(port)  # nothing of the bad file was applied
    assert "dropped" not in await _models(port)
    # The watcher is still alive: a good file is applied.
    path.write_text(yaml.safe_dump_all([pool, model_doc("later", {BASE: 1})]))
    for _ in range(60):
        if "later" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "later" in await _models(port)
    assert proc.poll() is None


async def test_a_failed_start_leaves_nothing_open() -> None:
    """The port is taken: start raises, and the upstream connection pool and the metrics
    scraper it started are closed again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = Gateway(embedded_config(["127.0.0.1:9"], None))
        with pytest.raises(OSError, match="address already in use"):
            await gateway.start("127.0.0.1", port)
    assert gateway.upstream is not None
    assert gateway.upstream.closed
    assert gateway.runtime.collector is None
