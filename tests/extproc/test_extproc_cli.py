"""``sluicegate extproc`` as a user runs it: flags checked, a configuration file (reloaded
on change), Kubernetes discovery (against an in-process API server speaking the real
list/watch protocol, the one ``tests/k8s`` uses), readiness, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from ep_support import (
    BASE,
    DESTINATION,
    completion,
    free_port,
    gateway_doc,
    immediate,
    kind,
    model_doc,
    new_stub,
    pool_doc,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
)
from ep_support import Exchange as _Exchange
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).parents[1] / "k8s"))  # the fake API server
from k8s_fake_apiserver import FakeApiServer, pod, pool_v1
from k8s_fake_apiserver import model as k8s_model

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "extproc", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_flags_are_checked(tmp_path: Path) -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "--config is required" in result.stderr
    result = run_cli("--config", "x.yaml", "--pool-name", "p")
    assert result.returncode == 2
    assert "need --kubernetes" in result.stderr
    no_pool = tmp_path / "no-pool.yaml"
    no_pool.write_text(yaml.safe_dump(gateway_doc(maxRetries=1)))
    result = run_cli("--config", str(no_pool))
    assert result.returncode == 2
    assert "defines no InferencePool" in result.stderr
    assert "--allow-empty-config" in result.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("# filled in by a config tool\n")
    # With --kubernetes the pools come from the API server, but a file holding nothing
    # (not even settings) is still taken for a truncated one; checked before connecting.
    result = run_cli("--kubernetes", "--config", str(empty))
    assert result.returncode == 2
    assert f"{empty} holds no document (empty or only comments)" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(model_doc("m", {BASE: 1})))  # its pool does not exist
    result = run_cli("--config", str(bad))
    assert result.returncode == 2
    assert "pool" in result.stderr
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump(pool_doc(["http://127.0.0.1:1"])))
    result = run_cli("--config", str(pools), "--policy", "no-such-preset")
    assert result.returncode == 2
    assert "no-such-preset" in result.stderr
    result = run_cli("--config", str(pools), "--grpc-port", "9100", "--metrics-port", "9100")
    assert result.returncode == 2
    assert "must differ" in result.stderr


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    health_port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def extproc_process(tmp_path: Path) -> Iterator[Any]:
    procs: list[Running] = []

    def start(*args: str) -> Running:
        grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
        log = tmp_path / f"extproc-{len(procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "sluicegate", "extproc", "--host", "127.0.0.1"),
                    *("--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port)),
                    *("--metrics-port", str(metrics_port), "--grace-period", "2", *args),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "200"},
            )
        running = Running(proc, grpc_port, health_port, log)
        procs.append(running)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"extproc exited: {running.output()}"
            try:
                with socket.create_connection(("127.0.0.1", health_port), timeout=0.2):
                    return running
            except OSError:
                time.sleep(0.1)
        raise AssertionError("extproc did not start listening")

    yield start
    for running in procs:
        if running.proc.poll() is None:
            running.proc.send_signal(signal.SIGTERM)
            try:
                running.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                running.proc.kill()
                running.proc.wait()


async def readiness(port: int, service: str = "readiness") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(reply.status)


async def wait_ready(port: int, ready: bool = True) -> None:
    """Poll readiness for up to 20 s until it is (or is not) SERVING."""
    for _ in range(200):
        if (await readiness(port) == SERVING) == ready:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"readiness did not become {'SERVING' if ready else 'NOT_SERVING'}")


async def ask(port: int, body: bytes) -> Any:
    """One request through the picker at ``port``: its first answer."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        ex = _Exchange(new_stub(channel))
        await ex.send(request_headers(), request_body(body))
        (answer,) = await ex.recv()
        ex.cancel()
        return answer


async def test_config_file_reloaded_and_sigterm_stops(
    sim_cluster: Any, extproc_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=2)
    path = tmp_path / "pool.yaml"
    pool = pool_doc(cluster.urls)
    path.write_text(yaml.safe_dump_all([pool]))
    running = extproc_process("--config", str(path))
    await wait_ready(running.health_port)
    addresses = [u.removeprefix("http://") for u in cluster.urls]
    answer = await ask(running.grpc_port, completion())
    assert set_headers(answer)[DESTINATION] in addresses
    assert immediate(await ask(running.grpc_port, completion(model="first"))).status == 404

    # A new InferenceModel takes effect without a restart.
    path.write_text(yaml.safe_dump_all([pool, model_doc("first", {BASE: 1})]))
    for _ in range(100):
        answer = await ask(running.grpc_port, completion(model="first"))
        if kind(answer) == "request_headers":
            break
        await asyncio.sleep(0.2)
    assert set_headers(answer)["x-gateway-model-name"] == "first"

    running.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(running.proc.wait, 15) == 0
    assert "draining" in running.output()


async def test_sigterm_drains_streams_in_flight_then_exits(
    sim_cluster: Any, extproc_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=1)
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump_all([pool_doc(cluster.urls)]))
    running = extproc_process(
        *("--config", str(path), "--drain-delay", "1.5", "--grace-period", "20")
    )
    await wait_ready(running.health_port)
    assert await readiness(running.health_port, "accepting") == SERVING
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
        ex = _Exchange(new_stub(channel))  # a request whose response is still streaming
        await ex.send(request_headers(), request_body(completion()))
        await ex.recv(2)
        await ex.send(response_headers())
        await ex.recv()
        sent = time.monotonic()
        running.proc.send_signal(signal.SIGTERM)
        # At once (as soon as the process has run its signal handler, which a loaded
        # machine can delay past the first health query): not ready, not accepting; alive.
        for service in ("readiness", "accepting"):
            while await readiness(running.health_port, service) != NOT_SERVING:
                assert time.monotonic() - sent < 1.0, f"{service} still SERVING"
                await asyncio.sleep(0.02)
        assert await readiness(running.health_port, "liveness") == SERVING
        assert time.monotonic() - sent < 1.5
        # Within the drain delay new streams are still routed...
        assert kind(await ask(running.grpc_port, completion())) == "request_headers"
        await asyncio.sleep(max(0.0, sent + 2.0 - time.monotonic()))
        # ...after it they are refused, while the health port still answers.
        with pytest.raises(grpc.aio.AioRpcError):
            await ask(running.grpc_port, completion())
        assert await readiness(running.health_port) == NOT_SERVING
        assert running.proc.poll() is None  # the stream in flight holds the exit
        await ex.send(response_body(b'{"choices": []}'))
        await ex.recv()
        await ex.finish()
    assert await asyncio.to_thread(running.proc.wait, 15) == 0
    assert time.monotonic() - sent < 10  # it did not wait out the 20 s grace period


async def test_kubernetes_discovery(sim_cluster: Any, extproc_process: Any, tmp_path: Path) -> None:
    cluster = await sim_cluster(replicas=1)
    sim_port = cluster.replicas[0].port
    apiserver = FakeApiServer()
    await apiserver.start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": apiserver.url}}],
                    "users": [{"name": "tester", "user": {"token": "unused"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "tester"}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        running = extproc_process(
            "--kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", "default",
            "--pool-name", "llama",
        )  # fmt: skip
        # The pool does not exist yet: not ready, and requests are refused.
        await asyncio.sleep(0.5)
        assert await readiness(running.health_port) != SERVING
        assert immediate(await ask(running.grpc_port, completion())).status == 503

        apiserver.apply(pool_v1("llama", {"app": "sim"}, [sim_port]))
        apiserver.apply(pod("sim-0", {"app": "sim"}, ip="127.0.0.1"))
        apiserver.apply(k8s_model("food", "food-review", "llama", "Critical", [(BASE, 1)]))
        await wait_ready(running.health_port)
        answer = await ask(running.grpc_port, completion(model="food-review"))
        assert set_headers(answer)[DESTINATION] == f"127.0.0.1:{sim_port}"

        # The pod goes away: requests are answered 503; the picker stays ready (synced),
        # as the reference endpoint picker reports it.
        apiserver.delete("v1", "Pod", "sim-0")
        for _ in range(100):
            answer = await ask(running.grpc_port, completion(model="food-review"))
            if kind(answer) == "immediate_response":
                break
            await asyncio.sleep(0.1)
        assert immediate(answer).status == 503
        assert await readiness(running.health_port) == SERVING
    finally:
        await apiserver.stop()
