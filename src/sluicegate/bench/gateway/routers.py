"""The routers the gateway benchmark compares, started on the router core.

- ``sluicegate serve --config pool.yaml --policy PRESET`` (:func:`start_gateway`), over an
  InferencePool of the given replicas, with default settings otherwise;
- ``vllm-router --policy POLICY`` (:func:`start_vllm_router`), the Rust router, from
  ``$SLUICEGATE_VLLM_ROUTER``, ``.venv-bench/`` (``scripts/bench-setup``) or the PATH;
- ``direct``: no router, the load straight to a replica (the ceiling of the load
  generator and mock).

Each runs alone on core ``GATEWAY_CPU`` and is returned once it answers; :data:`ROUTERS`
lists every (kind, policy, label) the throughput runs measure.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from sluicegate.bench.gateway.settings import (
    GATEWAY_CPU,
    GATEWAY_POLICIES,
    ROOT,
    ROUTER_POLICIES,
)
from sluicegate.bench.processes import Processes, free_port_block, wait_ready


def write_pool_config(path: Path, urls: Sequence[str]) -> None:
    """An InferencePool ``bench-pool`` of the replicas at ``urls``, written to ``path``."""
    doc = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "bench-pool"},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "endpoints": [{"address": u, "name": f"replica-{i}"} for i, u in enumerate(urls)],
        },
    }
    path.write_bytes(orjson.dumps(doc))  # JSON is YAML


def start_gateway(procs: Processes, name: str, config: Path, policy: str) -> str:
    """``sluicegate serve`` on core ``GATEWAY_CPU``; returns its base URL once ready."""
    port = free_port_block(1)
    cmd = [
        sys.executable,
        "-m",
        "sluicegate",
        "--log-level",
        "warning",
        "serve",
        "--config",
        str(config),
        "--policy",
        policy,
        "--port",
        str(port),
    ]
    procs.start(name, cmd, GATEWAY_CPU)
    url = f"http://127.0.0.1:{port}"
    wait_ready(procs, name, f"{url}/ready")
    return url


def vllm_router_binary() -> str | None:
    """``vllm-router`` from $SLUICEGATE_VLLM_ROUTER, ``.venv-bench/`` or the PATH."""
    env = os.environ.get("SLUICEGATE_VLLM_ROUTER")
    if env:
        return env if os.path.exists(env) else None
    local = ROOT / ".venv-bench" / "bin" / "vllm-router"
    if local.exists():
        return str(local)
    return shutil.which("vllm-router")


def start_vllm_router(procs: Processes, name: str, urls: Sequence[str], policy: str) -> str:
    """``vllm-router --policy policy`` over ``urls`` on core ``GATEWAY_CPU``; its base URL.

    Its logs are at ``warning`` (ours print nothing per request either); its Prometheus
    exporter stays on (sluicegate records metrics too) on a port of its own.
    """
    binary = vllm_router_binary()
    if binary is None:
        raise RuntimeError("vllm-router is not installed (scripts/bench-setup installs it)")
    base = free_port_block(2)
    cmd = [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(base),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(base + 1),
        "--worker-urls",
        *urls,
        "--policy",
        policy,
        "--worker-startup-check-interval",
        "1",
        "--log-level",
        "warning",
    ]
    procs.start(name, cmd, GATEWAY_CPU)
    url = f"http://127.0.0.1:{base}"
    wait_ready(procs, name, f"{url}/v1/models")
    return url


ROUTERS: tuple[tuple[str, str, str], ...] = (
    ("direct", "", "direct (ceiling)"),
    *(("sluicegate", p, f"sluicegate {p}") for p in GATEWAY_POLICIES),
    *(("vllm-router", p, f"vllm-router {p}") for p in ROUTER_POLICIES),
)
"""(kind, policy, label) of every router the throughput runs compare."""


def start_router(
    procs: Processes, workdir: Path, kind: str, policy: str, urls: Sequence[str]
) -> str:
    """Start one router over ``urls``; returns the URL wrk should load."""
    if kind == "direct":
        return urls[0]
    name = f"{kind}-{policy}"
    if kind == "sluicegate":
        config = workdir / f"mock-{len(procs.procs)}-{time.monotonic_ns()}.yaml"
        write_pool_config(config, urls)
        return start_gateway(procs, name, config, policy)
    return start_vllm_router(procs, name, urls, policy)
