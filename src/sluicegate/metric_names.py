"""The ``metricsNames`` setting: ``/metrics`` under the Gateway API Inference Extension's
names (``gateway-api``, the default), under llm-d-router's ``llm_d_epp_`` names
(``llm-d``), or under both.

The families are counted once, under the reference names; the other names are made when
``/metrics`` is scraped, by renaming the collected families (nothing per request). The
mapping follows llm-d-router's metric catalogue
(https://github.com/llm-d/llm-d-router/blob/02d6c2ee/docs/metrics.md), which lists the
``inference_extension_*`` names as the deprecated twins of its ``llm_d_epp_*`` ones.
Families with no llm-d counterpart (``sluicegate_*``) keep their name in every mode.
Label names stay as they are except where llm-d renamed them (``model_server_pod``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

MetricNames = Literal["gateway-api", "llm-d", "both"]

LLM_D_NAMES: dict[str, str] = {
    # request and latency (counter names without their _total)
    "inference_objective_request": "llm_d_epp_request",
    "inference_objective_request_error": "llm_d_epp_request_error",
    "inference_objective_request_duration_seconds": "llm_d_epp_request_duration_seconds",
    "inference_objective_request_sizes": "llm_d_epp_request_size_bytes",
    "inference_objective_response_sizes": "llm_d_epp_response_size_bytes",
    "inference_objective_input_tokens": "llm_d_epp_request_input_tokens",
    "inference_objective_output_tokens": "llm_d_epp_request_output_tokens",
    "inference_objective_prompt_cached_tokens": "llm_d_epp_request_cached_tokens",
    "inference_objective_running_requests": "llm_d_epp_request_running",
    "inference_objective_normalized_time_per_output_token_seconds": (
        "llm_d_epp_request_ntpot_seconds"
    ),
    "inference_objective_request_ttft_seconds": "llm_d_epp_request_ttft_seconds",
    "inference_objective_request_tpot_seconds": "llm_d_epp_request_streaming_tpot_seconds",
    # predicted latency and SLO
    "inference_objective_request_predicted_ttft_seconds": (
        "llm_d_epp_request_predicted_ttft_seconds"
    ),
    "inference_objective_request_predicted_tpot_seconds": (
        "llm_d_epp_request_predicted_tpot_seconds"
    ),
    "inference_objective_request_ttft_prediction_duration_seconds": (
        "llm_d_epp_request_ttft_prediction_duration_seconds"
    ),
    "inference_objective_request_tpot_prediction_duration_seconds": (
        "llm_d_epp_request_tpot_prediction_duration_seconds"
    ),
    "inference_objective_request_slo_violation": "llm_d_epp_request_slo_violation",
    # inference pool
    "inference_pool_average_kv_cache_utilization": "llm_d_epp_average_kv_cache_utilization",
    "inference_pool_average_queue_size": "llm_d_epp_average_queue_size",
    "inference_pool_average_running_requests": "llm_d_epp_average_running_requests",
    "inference_pool_ready_pods": "llm_d_epp_ready_endpoints",
    "inference_pool_per_pod_queue_size": "llm_d_epp_per_endpoint_queue_size",
    # scheduler, plugins, info, prefix indexer
    "inference_extension_scheduler_e2e_duration_seconds": (
        "llm_d_epp_scheduler_e2e_duration_seconds"
    ),
    "inference_extension_scheduler_attempts": "llm_d_epp_scheduler_attempts",
    "inference_extension_plugin_duration_seconds": "llm_d_epp_plugin_duration_seconds",
    "inference_extension_info": "llm_d_epp_info",
    "inference_extension_prefix_indexer_size": "llm_d_epp_prefix_indexer_size",
    "inference_extension_prefix_indexer_hit_ratio": "llm_d_epp_prefix_indexer_hit_ratio",
    # the ext_proc server (sluicegate extproc)
    "sluicegate_extproc_active_streams": "llm_d_epp_extproc_streams_inflight",
    # flow control
    **{
        f"inference_extension_flow_control_{name}": f"llm_d_epp_flow_control_{name}"
        for name in (
            "request_queue_duration_seconds",
            "request_enqueue_duration_seconds",
            "dispatch_cycle_duration_seconds",
            "queue_size",
            "queue_bytes",
            "pool_saturation",
        )
    },
}
"""Reference family name → llm-d-router family name."""

LLM_D_LABELS: dict[str, dict[str, str]] = {
    "llm_d_epp_per_endpoint_queue_size": {"model_server_pod": "model_server_endpoint"},
}
"""Label renames of an llm-d family (by its llm-d name)."""


def renamed(family: Metric, name: str) -> Metric:
    """A copy of ``family`` named ``name``: its samples' suffixes (``_total``,
    ``_bucket``, ...) kept, labels renamed as llm-d names them."""
    labels = LLM_D_LABELS.get(name, {})
    out = Metric(name, family.documentation, family.type, family.unit)
    old = len(family.name)
    for s in family.samples:
        sample_labels = {labels.get(k, k): v for k, v in s.labels.items()} if labels else s.labels
        out.samples.append(s._replace(name=name + s.name[old:], labels=sample_labels))
    return out


class _Renamed(Collector):
    """The families of ``source`` under llm-d's names (and, for ``both``, their own)."""

    def __init__(self, source: CollectorRegistry, names: MetricNames) -> None:
        self._source = source
        self._keep = names == "both"

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            name = LLM_D_NAMES.get(family.name)
            if name is None or self._keep:
                yield family
            if name is not None:
                yield renamed(family, name)


def renamed_registry(source: CollectorRegistry, names: MetricNames) -> CollectorRegistry:
    """A registry whose collection is ``source``'s under ``names`` (made per scrape: it
    holds nothing but the view)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Renamed(source, names))
    return registry


__all__ = ["LLM_D_LABELS", "LLM_D_NAMES", "MetricNames", "renamed", "renamed_registry"]
