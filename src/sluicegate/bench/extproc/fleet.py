"""What the ext_proc benchmark measures against: simulated replicas, the picker, requests.

Both measurements (:mod:`~sluicegate.bench.extproc.decisions`,
:mod:`~sluicegate.bench.extproc.envoy_latency`) run the picker on ``PICKER_CPU`` and
everything else — the replicas, Envoy, this process's client — on ``OTHER_CPU``, so the
picker has a core of its own. The replicas are one ``sluicegate sim`` process serving
``REPLICAS`` consecutive ports (profile ``tiny``); the picker reads them from a pool file
and scrapes them every ``scrape_ms`` (50 ms in production). Requests are non-streamed
completions of ~1 KB whose prompts share one of ``PREFIXES`` long prefixes, so the
picker's prefix index is walked as in production.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from sluicegate.bench.processes import (
    Processes,
    can_pin,
    free_port_block,
    wait_listening,
    wait_ready,
)

MODEL = "tiny-llama"
REPLICAS = 10
PREFIXES = 16
PROMPT_BYTES = 1024
PICKER_CPU = 0
OTHER_CPU = 1
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def request_bodies() -> list[bytes]:
    """256 completion bodies (~1 KB prompts, 3/4 of each one of ``PREFIXES`` prefixes)."""
    prefixes = [(f"shared prefix {i} " * 64)[: PROMPT_BYTES * 3 // 4] for i in range(PREFIXES)]
    return [
        orjson.dumps(
            {
                "model": MODEL,
                "prompt": prefixes[i % PREFIXES] + f" question {i} " * 16,
                "max_tokens": 16,
            }
        )
        for i in range(256)
    ]


@dataclass
class Pool:
    """The simulated replicas and a configuration file naming them."""

    pid: int
    ports: list[int]
    config: Path


def _pool_config(ports: list[int], scrape_ms: float) -> str:
    """An InferencePool of ``ports`` and a GatewayConfig scraping every ``scrape_ms``."""
    return yaml.safe_dump_all(
        [
            {
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": "bench"},
                "spec": {
                    "targetPorts": [{"number": 8000}],
                    "endpoints": [
                        {"address": f"http://127.0.0.1:{p}", "name": f"sim-{i}"}
                        for i, p in enumerate(ports)
                    ],
                },
            },
            {
                "apiVersion": "sluicegate.dev/v1alpha1",
                "kind": "GatewayConfig",
                "spec": {
                    "scrapeIntervalMs": scrape_ms,
                    "metricsStalenessMs": max(2000.0, 4 * scrape_ms),
                },
            },
        ]
    )


@contextlib.contextmanager
def sim_pool(procs: Processes, time_scale: float, scrape_ms: float = 50.0) -> Iterator[Pool]:
    """``REPLICAS`` simulated replicas on ``OTHER_CPU`` at ``time_scale``, and a pool file
    for the picker (in ``procs.workdir``); stopped on exit."""
    base = free_port_block(REPLICAS)
    ports = [base + i for i in range(REPLICAS)]
    pid = procs.start(
        "sim",
        [
            *(sys.executable, "-m", "sluicegate", "--log-level", "warning", "sim"),
            *("--replicas", str(REPLICAS), "--port", str(base), "--profile", "tiny"),
            *("--time-scale", str(time_scale), "--no-prefix-caching"),
        ],
        OTHER_CPU,
    )
    try:
        for port in ports:
            wait_listening(procs, "sim", port, START_TIMEOUT_S)
        config = procs.workdir / "pool.yaml"
        config.write_text(_pool_config(ports, scrape_ms))
        yield Pool(pid, ports, config)
    finally:
        procs.stop("sim", STOP_TIMEOUT_S)


@dataclass
class Picker:
    """A running ``sluicegate extproc`` and whether it is pinned to ``PICKER_CPU``."""

    pid: int
    grpc_port: int
    metrics_port: int
    pinned: bool


@contextlib.contextmanager
def picker(
    procs: Processes, config: Path, policy: str | None = None, name: str = "extproc"
) -> Iterator[Picker]:
    """``sluicegate extproc`` on ``PICKER_CPU`` for the pool in ``config``, once it has
    scraped the replicas (``/readyz``); stopped on exit. ``name``: its name among
    ``procs`` (one per picker when several run)."""
    grpc_port = free_port_block(3)
    health_port, metrics_port = grpc_port + 1, grpc_port + 2
    pid = procs.start(
        name,
        [
            *(sys.executable, "-m", "sluicegate", "--log-level", "warning", "extproc"),
            *("--config", str(config), "--host", "127.0.0.1", "--grace-period", "1"),
            *("--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port)),
            *("--metrics-port", str(metrics_port)),
            *(("--policy", policy) if policy else ()),
        ],
        PICKER_CPU,
    )
    try:
        wait_listening(procs, name, grpc_port, START_TIMEOUT_S)
        url = f"http://127.0.0.1:{metrics_port}/readyz"
        wait_ready(procs, name, url, START_TIMEOUT_S)
        yield Picker(pid, grpc_port, metrics_port, can_pin(PICKER_CPU))
    finally:
        procs.stop(name, STOP_TIMEOUT_S)
