"""The shipped Grafana dashboard lights up on the Envoy endpoint picker too (all but the
standalone gateway's client-connection panels)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from ep_support import (
    BASE,
    completion,
    model_doc,
    request_body,
    request_headers,
    response_body,
    response_headers,
)

from dashboard_support import families, panel_names, resolve, unbounded_labels, without_help

GATEWAY_ONLY = {
    # The standalone gateway's own HTTP server; Envoy holds the client connections here.
    "sluicegate_client_connections",
    "sluicegate_client_connections_refused_total",
    "sluicegate_request_body_buffered_bytes",
}
PICKER_SERIES = {
    "inference_objective_request_total",
    "inference_objective_request_duration_seconds_bucket",
    "inference_objective_request_ttft_seconds_bucket",
    "inference_objective_request_tpot_seconds_bucket",
    "inference_objective_normalized_time_per_output_token_seconds_bucket",
    "inference_objective_request_sizes_bucket",
    "inference_objective_response_sizes_bucket",
    "inference_objective_output_tokens_bucket",
    "inference_extension_scheduler_e2e_duration_seconds_bucket",
    "inference_extension_plugin_duration_seconds_bucket",
    "inference_extension_flow_control_request_queue_duration_seconds_bucket",
    "inference_extension_flow_control_request_enqueue_duration_seconds_bucket",
    "inference_extension_flow_control_dispatch_cycle_duration_seconds_bucket",
    "inference_extension_info",
}


def sse_answer(tokens: int) -> bytes:
    events = [{"model": BASE, "choices": [{"text": "a"}]} for _ in range(tokens)] + [
        {"model": BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}
    ]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


async def test_every_dashboard_metric_is_exported(sim_cluster: Any, picker: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    p = await picker(cluster, docs=[model_doc("food-review", {BASE: 1})], queueing=True)
    for stream in (True, False):
        ex = p.exchange()
        await ex.send(request_headers(), request_body(completion("food-review", stream=stream)))
        await ex.recv(2)
        headers = {"content-type": "text/event-stream"} if stream else {}
        await ex.send(response_headers(headers=headers))
        await ex.recv()
        data = sse_answer(4) if stream else orjson.dumps({"usage": {"completion_tokens": 4}})
        await ex.send(response_body(data, end_of_stream=True))
        await ex.recv()
        await ex.finish()
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{p.server.metrics_port}/metrics") as r,
    ):
        assert r.status == 200
        exposed = families(await r.text())
    wanted = {n: t for n, t in panel_names().items() if n not in GATEWAY_ONLY}
    missing = {name: panels for name, panels in wanted.items() if resolve(name, exposed) is None}
    assert not missing, f"dashboard panels read metrics the picker lacks: {missing}"
    assert set(wanted) >= PICKER_SERIES
    for name in PICKER_SERIES:
        family = resolve(name, exposed)
        assert family is not None, name
        assert family.samples, f"{name}: no samples after traffic"
    assert not without_help(exposed)
    assert not unbounded_labels(exposed), "labels nobody argued are bounded"
    sizes = resolve("inference_objective_response_sizes_bucket", exposed)
    assert sizes is not None
    (total,) = [s.value for s in sizes.samples if s.name.endswith("_sum")]
    assert total == len(sse_answer(4)) + len(orjson.dumps({"usage": {"completion_tokens": 4}}))
