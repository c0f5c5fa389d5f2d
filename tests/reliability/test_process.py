"""The gateway as a process: memory under stalled uploads, and configuration reloads.

``sluicegate serve`` runs in a child process (its RSS is read from /proc, reloads are
SIGHUP) in front of simulated servers running in the test's own process. Tests whose
docstring starts with "Issue 14" check the hardening work's promises.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Sequence
from typing import Any

import aiohttp
import yaml
from support import (
    AUTH,
    BASE,
    F_ALLOW_EMPTY_CONFIG,
    RELOAD_LOGGED,
    GatewayProcess,
    ServeFactory,
    close_quietly,
    fast_settings,
    gateway_doc,
    good_body,
    model_doc,
    pool_doc,
)

from sluicegate.sim.server import SimCluster

STALLED_CLIENTS = 20
ANNOUNCED_BYTES = 15 * 1024 * 1024
"""What each stalled client announces in Content-Length (under the 16 MiB default limit)."""
SEND_FOR_S = 3.0
"""How long each stalled client keeps writing its body before it stops (s)."""
RSS_GROWTH_BOUND = 64 * 1024 * 1024
"""Most the gateway's RSS may grow while 20 unauthenticated 15 MiB uploads stall
(bytes): the documented bound (docs/reliability.md)."""


async def _status(http: aiohttp.ClientSession, port: int, model: str, key: bool = True) -> int:
    headers = {"authorization": AUTH} if key else {}
    body = {**good_body(), "model": model}
    async with http.post(
        f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers
    ) as r:
        await r.read()
        return r.status


async def _until_served(http: aiohttp.ClientSession, port: int, model: str, key: bool) -> None:
    deadline = time.monotonic() + 10
    while await _status(http, port, model, key) != 200:
        assert time.monotonic() < deadline, f"{model} is not served"
        await asyncio.sleep(0.05)


async def _stall(port: int, sent: list[int], stop: asyncio.Event) -> None:
    """One unauthenticated client: announce a 15 MiB body, write it for SEND_FOR_S (as
    fast as the gateway reads), then hold the connection until ``stop``."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        sent.append(-1)  # refused at the door: fine
        return
    slice_ = b"x" * (256 * 1024)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % ANNOUNCED_BYTES
        )
        deadline = time.monotonic() + SEND_FOR_S
        total = 0
        while total + len(slice_) < ANNOUNCED_BYTES and time.monotonic() < deadline:
            writer.write(slice_)
            try:
                await asyncio.wait_for(writer.drain(), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                break  # the gateway stopped reading: stall here
            total += len(slice_)
        sent.append(total)
        await stop.wait()
    except (ConnectionError, OSError):
        sent.append(-1)  # the gateway closed the connection (as it should, at once)
    finally:
        close_quietly(writer)


def _docs(cluster: SimCluster, alias: str) -> list[dict[str, Any]]:
    return [
        gateway_doc(**fast_settings()),
        model_doc(alias, {BASE: 1}),
        pool_doc(cluster.urls),
    ]


def _text(docs: Sequence[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False)


async def _reload(gw: GatewayProcess, text: str) -> None:
    """Write ``text`` as the configuration, SIGHUP, and wait until the gateway has logged
    a line about its configuration (applied or refused: its serving, checked next, tells
    which)."""
    seen = len(gw.log)
    gw.config.write_text(text)
    gw.reload()
    for _ in range(60):  # up to 3 s
        if any(RELOAD_LOGGED in line for line in gw.log[seen:]):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.05)  # the rest of a multi-line message


async def _serving(
    sim_cluster: Any, served: ServeFactory, *extra: str
) -> tuple[GatewayProcess, SimCluster]:
    cluster: SimCluster = await sim_cluster(replicas=1)
    gw = await served(_docs(cluster, "alias-v1"), *extra)
    return gw, cluster


BROKEN = {
    "yaml-syntax": "kind: [unclosed\n  - {",
    "truncated-mid-document": (
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n  na"
    ),
    "invalid-value": (
        "apiVersion: sluicegate.dev/v1alpha1\nkind: GatewayConfig\nspec:\n  maxRetries: -4\n"
    ),
    "binary": "\x00\x01\x02 not yaml at all \xff",
}
"""Reloads that cannot be read as a configuration at all."""


async def test_a_broken_reload_keeps_the_running_config(
    sim_cluster: Any, served: ServeFactory
) -> None:
    """Each of BROKEN in turn: logged and refused, the gateway serves as before; a good
    file after them is applied."""
    gw, cluster = await _serving(sim_cluster, served)
    async with aiohttp.ClientSession() as http:
        await _until_served(http, gw.port, "alias-v1", key=False)
        for name, text in BROKEN.items():
            await _reload(gw, text)
            assert await _status(http, gw.port, "alias-v1", key=False) == 200, name
            assert await _status(http, gw.port, BASE, key=False) == 200, name
        await _reload(gw, _text(_docs(cluster, "alias-v2")))
        await _until_served(http, gw.port, "alias-v2", key=False)


# ---------------------------------------------------------------------------- issue 14
# The hardening work's promises: these fail until its branches are merged.


async def test_stalled_unauthenticated_uploads_leave_memory_bounded(
    sim_cluster: Any, served: ServeFactory
) -> None:
    """Issue 14: 20 clients announcing 15 MiB bodies without a key, then stalling, cost
    the gateway less than RSS_GROWTH_BOUND of memory (their bodies are never read: 401 on
    the head), and authenticated requests are served meanwhile."""
    cluster: SimCluster = await sim_cluster(replicas=1)
    gw: GatewayProcess = await served(
        [pool_doc(cluster.urls), gateway_doc(**fast_settings())], key_file=True
    )
    async with aiohttp.ClientSession() as http:
        await _until_served(http, gw.port, BASE, key=True)
        for _ in range(10):  # the code paths of a request, warmed before the baseline
            assert await _status(http, gw.port, BASE) == 200
        baseline = gw.rss_bytes()
        stop = asyncio.Event()
        sent: list[int] = []
        clients = [asyncio.create_task(_stall(gw.port, sent, stop)) for _ in range(STALLED_CLIENTS)]
        peak = baseline
        served_meanwhile = 0
        started = time.monotonic()
        try:
            while time.monotonic() - started < SEND_FOR_S + 0.5:
                assert await _status(http, gw.port, BASE) == 200
                served_meanwhile += 1
                peak = max(peak, gw.rss_bytes())
                await asyncio.sleep(0.05)
            peak = max(peak, gw.rss_bytes())
        finally:
            stop.set()
            await asyncio.gather(*clients, return_exceptions=True)
        assert served_meanwhile >= 10
        growth = peak - baseline
        assert growth <= RSS_GROWTH_BOUND, (
            f"RSS grew {growth / 2**20:.1f} MiB (baseline {baseline / 2**20:.1f} MiB); "
            f"clients wrote {sorted(sent)}"
        )
        assert await _status(http, gw.port, BASE, key=False) == 401


async def test_an_empty_or_truncated_reload_keeps_the_running_config(
    sim_cluster: Any, served: ServeFactory
) -> None:
    """Issue 14: a file that reads as a configuration without a pool (empty, blank, or
    cut before its InferencePool) is refused: the running one keeps serving."""
    gw, cluster = await _serving(sim_cluster, served)
    full = _text(_docs(cluster, "alias-v1"))
    cuts = {"empty": "", "whitespace": "\n\n   \n", "no-pool-left": full[: full.index("---")]}
    async with aiohttp.ClientSession() as http:
        await _until_served(http, gw.port, "alias-v1", key=False)
        for name, text in cuts.items():
            await _reload(gw, text)
            assert await _status(http, gw.port, "alias-v1", key=False) == 200, name
            assert await _status(http, gw.port, BASE, key=False) == 200, name


async def test_allow_empty_config_applies_an_empty_reload(
    sim_cluster: Any, served: ServeFactory
) -> None:
    """Issue 14: with --allow-empty-config an empty file is applied (nothing is served)."""
    gw, _ = await _serving(sim_cluster, served, F_ALLOW_EMPTY_CONFIG)
    async with aiohttp.ClientSession() as http:
        await _until_served(http, gw.port, "alias-v1", key=False)
        await _reload(gw, "")
        deadline = time.monotonic() + 3
        while await _status(http, gw.port, BASE, key=False) == 200:
            assert time.monotonic() < deadline, "the empty configuration was not applied"
            await asyncio.sleep(0.05)


def _bomb(inflated_mib: int) -> bytes:
    """A gzip body that inflates to ``inflated_mib`` MiB of one JSON string."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip format
    parts = [packer.compress(b'{"model": "%s", "prompt": "' % BASE.encode())]
    block = b"a" * (1 << 20)
    parts += [packer.compress(block) for _ in range(inflated_mib)]
    parts += [packer.compress(b'"}'), packer.flush()]
    return b"".join(parts)


async def test_a_zip_bomb_costs_bounded_memory(sim_cluster: Any, served: ServeFactory) -> None:
    """Issue 14: 256 MiB of JSON in ~255 KiB of gzip (far under maxBodyBytes on the wire)
    is a 413, and inflating it costs the gateway less than RSS_GROWTH_BOUND of memory: it
    stops at maxBodyBytes of output."""
    cluster: SimCluster = await sim_cluster(replicas=1)
    gw = await served([pool_doc(cluster.urls), gateway_doc(**fast_settings())])
    bomb = await asyncio.to_thread(_bomb, 256)
    async with aiohttp.ClientSession() as http:
        await _until_served(http, gw.port, BASE, key=False)
        for _ in range(10):
            assert await _status(http, gw.port, BASE, key=False) == 200
        baseline = peak = gw.rss_bytes()
        answered = asyncio.Event()

        async def watch() -> None:
            nonlocal peak
            while not answered.is_set():
                peak = max(peak, gw.rss_bytes())
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        headers = {"content-encoding": "gzip", "content-type": "application/json"}
        try:
            async with http.post(
                f"http://127.0.0.1:{gw.port}/v1/completions", data=bomb, headers=headers
            ) as r:
                status = r.status
                await r.read()
        finally:
            answered.set()
            await watcher
        peak = max(peak, gw.rss_bytes())
        assert status == 413
        growth = peak - baseline
        assert growth <= RSS_GROWTH_BOUND, f"RSS grew {growth / 2**20:.1f} MiB"
        assert await _status(http, gw.port, BASE, key=False) == 200
