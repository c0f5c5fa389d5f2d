"""Precise prefix routing against the simulator's own KV-cache events: simulated replicas
publish vLLM's protocol (``--kv-events-config``), the gateway subscribes to them, and the
``precise-prefix`` preset sends a prompt to the replica whose cache holds it — a cache the
gateway never filled itself, so no guess of its own could know it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from gw_support import gateway_doc, wait_until_scraped

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.runtime import RuntimeOptions
from sluicegate.scheduling.config import load_preset
from sluicegate.sim.kvevents import KVEventsConfig
from sluicegate.sim.server import SimCluster

BASE = "tiny-llama"
FREE_PORTS = KVEventsConfig(
    enable_kv_cache_events=True,
    publisher="zmq",
    endpoint="tcp://127.0.0.1:0",
    replay_endpoint="tcp://127.0.0.1:0",
)


def _prompt(name: str) -> str:
    """A prompt of 16 blocks of 16 built-in tokens, distinct from the first block on."""
    return "".join(f"{name[:1]}{i:03d}" for i in range(16 * 16))  # 4 bytes: one token each


def _pool(cluster: SimCluster) -> dict[str, Any]:
    endpoints = []
    for replica in cluster.replicas:
        publisher = replica.kv_publisher
        assert publisher is not None
        events = {"endpoint": publisher.pub_address, "replayEndpoint": publisher.replay_address}
        endpoints.append({"address": replica.url, "name": replica.pod_name, "kvEvents": events})
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {"targetPorts": [{"number": 8000}], "endpoints": endpoints, "kvEvents": {}},
    }


async def _complete(
    http: aiohttp.ClientSession, url: str, prompt: str, chat: bool = False
) -> aiohttp.ClientResponse:
    """A one-token answer to ``prompt``, sent as a completion or as a chat's user message."""
    body: dict[str, Any] = {"model": BASE, "max_tokens": 1}
    if chat:
        body["messages"] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": prompt},
        ]
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with http.post(f"{url}{path}", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_the_simulators_events_route_a_prompt_to_the_replica_that_cached_it(
    sim_cluster: Any, http: aiohttp.ClientSession, chat: bool
) -> None:
    """Chat too: the gateway's built-in tokenizer renders the messages as the simulator
    does, so their blocks are the ones the replica's events name."""
    cluster: SimCluster = await sim_cluster(replicas=2, kv_events=FREE_PORTS)
    config = build_config([_pool(cluster), gateway_doc(scrapeIntervalMs=20)])
    config.picker = load_preset("precise-prefix")
    gw = Gateway(config, GatewayOptions(RuntimeOptions()))
    await gw.start("127.0.0.1", 0)
    try:
        await wait_until_scraped(gw)
        index = gw.runtime.kv_events.service.pools["pool"].index
        names = [r.pod_name for r in cluster.replicas]
        # A PUB socket drops what it sends before a subscriber's connection is up (as
        # vLLM's does): warm each replica up, directly, until its events arrive.
        for attempt in range(200):
            cold = [r for r in cluster.replicas if index.size(r.pod_name) == 0]
            if not cold:
                break
            for replica in cold:
                await _complete(http, replica.url, f"warm-up {attempt:04d} " * 16)
        assert all(index.size(n) > 0 for n in names), [index.size(n) for n in names]

        # Each replica caches its own prompts, sent to it directly: the gateway learns of
        # them only from the replica's events. Asked in an order no load balancing or
        # tie-break of its own would follow (the second replica's prompts first).
        cached = {"a": names[1], "b": names[1], "c": names[0], "d": names[0]}
        before = {n: index.size(n) for n in names}
        for letter, name in cached.items():
            replica = next(r for r in cluster.replicas if r.pod_name == name)
            await _complete(http, replica.url, _prompt(letter), chat)
        for _ in range(500):
            if all(index.size(n) >= before[n] + 32 for n in names):
                break
            await asyncio.sleep(0.01)
        assert all(index.size(n) >= before[n] + 32 for n in names)

        addresses = {r.pod_name: r.url.removeprefix("http://") for r in cluster.replicas}
        gateway_url = f"http://127.0.0.1:{gw.port}"
        for _ in range(3):
            for letter, name in cached.items():
                response = await _complete(http, gateway_url, _prompt(letter), chat)
                served = response.headers["x-gateway-destination-endpoint-served"]
                assert served == addresses[name], (letter, name, served)
    finally:
        await gw.stop()
