"""Starting real ``sluicegate serve`` processes for the replica tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(
    path: Path,
    urls: list[str],
    gateway: dict[str, Any] | None = None,
    extra: list[dict[str, Any]] | None = None,
) -> Path:
    """One pool over ``urls``, a GatewayConfig (``gateway`` fields added) and ``extra``
    documents (InferenceModels, an EndpointPickerConfig)."""
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
        *(extra or []),
    ]
    path.write_text(yaml.safe_dump_all(docs))
    return path


def start_serve(config: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """``sluicegate serve --config CONFIG ARGS`` on a free port, once it listens. Its stderr
    goes to ``serve-PORT.stderr`` beside CONFIG (a file: a pipe nobody reads would block
    the server once 64 KiB of log lines are written). Killed if it does not start."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "SLUICEGATE_API_KEYS"}
    port_args = ["--port", str(port), *args]
    err_path = config.parent / f"serve-{port}.stderr"
    with err_path.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--config", str(config), *port_args],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env={**env, "PYTHONPATH": SRC, "COLUMNS": "200"},
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {err_path.read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return proc, port
            except OSError:
                time.sleep(0.05)
        raise AssertionError("serve did not start listening within 30 s")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        raise
