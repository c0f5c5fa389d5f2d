"""The shipped Grafana dashboard lights up on a running gateway, and what ``/metrics``
exports is documented and bounded: every family has help text, every label is one whose
values cannot grow with what clients send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from gw_support import QUEUEING_ANNOTATION, gateway_doc, model_doc, pool_doc, wait_until_scraped

from dashboard_support import families, panel_names, resolve, unbounded_labels, without_help
from sluicegate.api.loader import Config, build_config
from sluicegate.gateway.app import Gateway
from sluicegate.metric_names import LLM_D_NAMES
from sluicegate.metrics import UNKNOWN_MODEL_LABEL
from sluicegate.sim.server import SimCluster

BASE = "tiny-llama"
PUBLIC = "food-review"
GATEWAY_SERIES = {
    # Observed on the request path of the traffic below: they must have samples, not
    # just a HELP line.
    "inference_objective_request_total",
    "inference_objective_request_error_total",
    "inference_objective_request_duration_seconds_bucket",
    "inference_objective_request_ttft_seconds_bucket",
    "inference_objective_request_tpot_seconds_bucket",
    "inference_objective_normalized_time_per_output_token_seconds_bucket",
    "inference_objective_request_sizes_bucket",
    "inference_objective_response_sizes_bucket",
    "inference_objective_input_tokens_bucket",
    "inference_objective_output_tokens_bucket",
    "inference_extension_scheduler_e2e_duration_seconds_bucket",
    "inference_extension_scheduler_attempts_total",
    "inference_extension_plugin_duration_seconds_bucket",
    "inference_extension_flow_control_request_queue_duration_seconds_bucket",
    "inference_extension_flow_control_request_enqueue_duration_seconds_bucket",
    "inference_extension_flow_control_dispatch_cycle_duration_seconds_bucket",
    "inference_extension_flow_control_queue_size",
    "inference_extension_info",
    "inference_pool_average_kv_cache_utilization",
    "inference_pool_ready_pods",
    "sluicegate_requests_refused_total",
    "sluicegate_client_connections",
}


PICKER_ONLY = {"sluicegate_extproc_active_streams"}
"""Mapped families only the Envoy endpoint picker has."""


@pytest.fixture
async def queueing_gateway() -> AsyncIterator[list[Gateway]]:
    started: list[Gateway] = []
    yield started
    for gw in reversed(started):
        await gw.stop()


def config(cluster: SimCluster, **spec: Any) -> Config:
    """A queueing pool of ``cluster``, one InferenceModel, GatewayConfig ``spec``."""
    return build_config(
        [
            pool_doc(cluster.urls, annotations={QUEUEING_ANNOTATION: "true"}),
            gateway_doc(scrapeIntervalMs=20, metricsStalenessMs=2000, **spec),
            model_doc(PUBLIC, {BASE: 1}),
        ]
    )


async def start(cluster: SimCluster, started: list[Gateway], **spec: Any) -> Gateway:
    gw = Gateway(config(cluster, **spec))
    await gw.start("127.0.0.1", 0)
    started.append(gw)
    await wait_until_scraped(gw)
    return gw


async def traffic(http: aiohttp.ClientSession, gw: Gateway) -> None:
    """Streamed and whole answers, an error and a refusal, from two flows."""
    url = f"http://127.0.0.1:{gw.port}/v1/completions"

    async def one(body: dict[str, Any], flow: str) -> int:
        headers = {"x-gateway-inference-fairness-id": flow}
        async with http.post(url, json=body, headers=headers) as r:
            await r.read()
            return r.status

    ok = {"model": PUBLIC, "prompt": "Hello there", "max_tokens": 5}
    statuses = await asyncio.gather(
        *(one({**ok, "stream": i % 2 == 0}, f"tenant-{i % 2}") for i in range(12))
    )
    assert statuses == [200] * 12
    assert await one({"model": "no-such-model", "prompt": "x"}, "tenant-0") == 404
    assert await one({"model": PUBLIC, "prompt": "x", "max_tokens": -1}, "tenant-0") == 400


async def scrape(http: aiohttp.ClientSession, gw: Gateway) -> str:
    async with http.get(f"http://127.0.0.1:{gw.port}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def test_every_dashboard_metric_is_exported(
    sim_cluster: Any, queueing_gateway: list[Gateway], http: aiohttp.ClientSession
) -> None:
    gw = await start(await sim_cluster(replicas=2), queueing_gateway)
    await traffic(http, gw)
    text = await scrape(http, gw)
    exposed = families(text)
    wanted = panel_names()
    assert len(wanted) >= 40  # the names were found at all
    missing = {name: panels for name, panels in wanted.items() if resolve(name, exposed) is None}
    assert not missing, f"dashboard panels read metrics /metrics lacks: {missing}"
    assert set(wanted) >= GATEWAY_SERIES
    for name in GATEWAY_SERIES:
        family = resolve(name, exposed)
        assert family is not None, name
        assert family.samples, f"{name}: no samples after traffic"


async def test_every_family_has_help_and_bounded_labels(
    sim_cluster: Any, queueing_gateway: list[Gateway], http: aiohttp.ClientSession
) -> None:
    gw = await start(await sim_cluster(replicas=1), queueing_gateway)
    await traffic(http, gw)
    url = f"http://127.0.0.1:{gw.port}/v1/completions"
    for i in range(20):  # made-up model names: the client's word, one label for all
        async with http.post(url, json={"model": f"made-up-{i}", "prompt": "x"}) as r:
            assert r.status == 404
    exposed = families(await scrape(http, gw))
    assert not without_help(exposed)
    assert not unbounded_labels(exposed), "labels nobody argued are bounded"
    models = {
        s.labels["model_name"]
        for family in exposed.values()
        for s in family.samples
        if "model_name" in s.labels
    }
    assert models <= {PUBLIC, BASE, UNKNOWN_MODEL_LABEL}, models
    assert UNKNOWN_MODEL_LABEL in models


async def test_llm_d_names_are_served_with_metrics_names(
    sim_cluster: Any, queueing_gateway: list[Gateway], http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1)
    gw = await start(cluster, queueing_gateway, metricsNames="both")
    await traffic(http, gw)
    both = families(await scrape(http, gw))
    for reference, llm_d in LLM_D_NAMES.items():
        if reference in PICKER_ONLY:
            continue
        assert reference in both, reference
        assert llm_d in both, llm_d
        ours, theirs = both[reference], both[llm_d]
        assert ours.type == theirs.type
        assert [s.value for s in ours.samples] == [s.value for s in theirs.samples], llm_d
    per_endpoint = both["llm_d_epp_per_endpoint_queue_size"].samples
    assert per_endpoint
    assert all("model_server_endpoint" in s.labels for s in per_endpoint)

    gw.runtime.apply_config(config(cluster, metricsNames="llm-d"))  # a reload: applies now
    only = families(await scrape(http, gw))
    assert not set(LLM_D_NAMES) & set(only)
    assert {v for k, v in LLM_D_NAMES.items() if k not in PICKER_ONLY} <= set(only)
    assert "sluicegate_requests_refused" in only  # no llm-d twin: kept as it is
