"""Endpoint hardware end to end: /metrics shows it, /health names a mixed pool that a
hardware-blind scheduler routes, and a hardware-aware plugin silences the notice."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from gw_support import gateway_doc, wait_until_scraped

from sluicegate.api.loader import build_config
from sluicegate.framework.plugin import Plugin
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.runtime import RuntimeOptions
from sluicegate.scheduling.config import BuiltScheduler


def _pool(urls: list[str], classes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "hardware": {"costPerHourByAccelerator": {"h100-80gb": 2.99}},
            "endpoints": [
                {"address": u, "name": f"sim-{i}", "accelerator": c}
                for i, (u, c) in enumerate(zip(urls, classes, strict=True))
            ],
        },
    }


async def _gateway(urls: list[str], classes: list[str]) -> Gateway:
    config = build_config([_pool(urls, classes), gateway_doc(scrapeIntervalMs=20)])
    gw = Gateway(config, GatewayOptions(RuntimeOptions()))
    await gw.start("127.0.0.1", 0)
    await wait_until_scraped(gw)
    return gw


async def _get(http: aiohttp.ClientSession, gw: Gateway, path: str) -> tuple[int, str]:
    async with http.get(f"http://127.0.0.1:{gw.port}{path}") as r:
        return r.status, await r.text()


async def test_mixed_pool_under_a_blind_scheduler_is_degraded_and_metrics_show_classes(
    sim_cluster: Any, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=3)
    gw = await _gateway(cluster.urls, ["NVIDIA-H100-80GB-HBM3", "a100-80gb", "a100-80gb"])
    try:
        status, body = await _get(http, gw, "/health")
        assert status == 200  # alive: it serves, only badly balanced
        assert '"status":"degraded"' in body
        assert '"mixed_hardware":[{"pool":"pool","classes":["a100-80gb","h100-80gb"]}]' in body
        status, text = await _get(http, gw, "/metrics")
        assert (
            'sluicegate_endpoint_hardware_info{accelerator="h100-80gb",model_server_pod="sim-0",'
            'name="pool"} 1.0' in text
        )
        assert 'accelerator="a100-80gb",model_server_pod="sim-2"' in text
        assert (
            'sluicegate_endpoint_cost_per_hour{model_server_pod="sim-0",name="pool"} 2.99' in text
        )
        assert 'sluicegate_endpoint_cost_per_hour{model_server_pod="sim-1"' not in text
    finally:
        await gw.stop()


async def test_a_homogeneous_pool_is_healthy(sim_cluster: Any, http: aiohttp.ClientSession) -> None:
    cluster = await sim_cluster(replicas=2)
    gw = await _gateway(cluster.urls, ["a100-80gb", "a100-80gb"])
    try:
        assert await _get(http, gw, "/health") == (200, '{"status":"ok"}')
    finally:
        await gw.stop()


class _Aware(Plugin):
    type_name = "test-aware"

    @property
    def hardware_aware(self) -> bool:
        return True


async def test_a_hardware_aware_plugin_makes_the_scheduler_aware(
    sim_cluster: Any, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    gw = await _gateway(cluster.urls, ["h100-80gb", "a100-80gb"])
    try:
        built = gw.runtime.built
        assert not built.hardware_aware  # every built-in heuristic is blind
        plugins: dict[str, Plugin] = {**built.plugins}
        plugins["aware"] = _Aware("aware", next(iter(plugins.values())).context)
        aware = BuiltScheduler(built.scheduler, plugins, built.registry)
        assert aware.hardware_aware
        gw.runtime.built = aware
        assert await _get(http, gw, "/health") == (200, '{"status":"ok"}')
    finally:
        await gw.stop()


async def test_when_a_class_leaves_its_series_and_the_notice_go(
    sim_cluster: Any, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = await sim_cluster(replicas=3)
    caplog.set_level(logging.WARNING, "sluicegate.runtime")
    gw = await _gateway(cluster.urls, ["h100-80gb", "a100-80gb", "a100-80gb"])
    try:
        assert sum("mixes hardware classes" in r.message for r in caplog.records) == 1
        # Every A100 server leaves: the pool is of one class again.
        only = build_config([_pool(cluster.urls[:1], ["h100-80gb"]), gateway_doc()])
        gw.runtime.apply_config(only)
        assert await _get(http, gw, "/health") == (200, '{"status":"ok"}')
        _, text = await _get(http, gw, "/metrics")
        assert 'accelerator="h100-80gb"' in text
        assert "a100-80gb" not in text
        # They come back: said once more.
        mixed = _pool(cluster.urls, ["h100-80gb", "a100-80gb", "a100-80gb"])
        gw.runtime.apply_config(build_config([mixed, gateway_doc()]))
        assert sum("mixes hardware classes" in r.message for r in caplog.records) == 2
        assert '"mixed_hardware"' in (await _get(http, gw, "/health"))[1]
    finally:
        await gw.stop()
