"""sluicegate's ``/metrics`` (gateway and Envoy endpoint picker alike), under the reference
endpoint picker's names where they exist.

Names (GIE, https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/metrics/metrics.go):
``inference_objective_*`` per model,
``inference_pool_*`` per pool (computed when scraped), ``inference_extension_*`` for the
scheduler. sluicegate's own additions are prefixed ``sluicegate_``. Latencies are seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from sluicegate import __version__
from sluicegate import metric_buckets as buckets
from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework.plugin import Plugin
from sluicegate.instruments import (
    Counter,
    CounterSeries,
    Gauge,
    GaugeSeries,
    Histogram,
    HistogramSeries,
)
from sluicegate.live_metrics import (
    ClientCollector,
    ClientCounts,
    FlowCollector,
    FlowState,
    PoolCollector,
)
from sluicegate.metric_names import MetricNames, renamed_registry

_MODEL = ("model_name", "target_model_name")
UNKNOWN_MODEL_LABEL = "_unknown"
"""``model_name`` of requests refused because no endpoint serves the model they named."""
ANY_MODEL_LABEL = "_any"
"""``model_name`` of rewrite decisions by a rule without ``matches``: such a rule takes
any name a client sends, so the name is not a label (configured names only are); also
the ``model_name`` of the requests only such a rule takes."""
NO_MODEL_LABEL = "_none"
"""``model_name`` of model-less requests (passed-through routes whose body names none)."""


class GatewayMetrics:
    """Every metric the gateway exports, in its own registry."""

    def __init__(
        self,
        datastore: Datastore,
        clock: Clock,
        staleness_s: float,
        prefix_index_size: Callable[[], int] | None = None,
        flow: FlowState | None = None,
        names: MetricNames = "gateway-api",
    ) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.names: MetricNames = names
        """Which names ``/metrics`` uses (``metricsNames``): the reference's, llm-d's, both."""
        self._define_request_metrics(r)
        self._define_scheduler_metrics(r)
        self._define_upstream_metrics(r)
        self._define_flow_control_metrics(r)
        self._define_prediction_metrics(r)
        self._define_rewrite_metrics(r)
        self.attempt_success = self.scheduler_attempts.labels("success")
        self._series: dict[tuple[str, str], ModelSeries] = {}
        self._prediction_series: dict[tuple[str, str], PredictionSeries] = {}
        self._plugin_series: dict[tuple[str, str], HistogramSeries] = {}
        r.register(PoolCollector(datastore, clock, staleness_s, prefix_index_size))
        if flow is not None:
            r.register(FlowCollector(flow))

    def _define_request_metrics(self, r: CollectorRegistry) -> None:
        """Per model (``model_name``, ``target_model_name``): requests, errors, latencies,
        token counts, requests running."""
        self.requests = Counter(
            "inference_objective_request", "Requests received, by model.", _MODEL, registry=r
        )
        self.errors = Counter(
            "inference_objective_request_error",
            "Requests answered with an error, by model and code.",
            (*_MODEL, "error_code"),
            registry=r,
        )
        self.duration = Histogram(
            "inference_objective_request_duration_seconds",
            "End-to-end request latency in seconds.",
            _MODEL,
            buckets=buckets.LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "inference_objective_request_ttft_seconds",
            "Time to first byte of the response in seconds.",
            _MODEL,
            buckets=buckets.LATENCY,
            registry=r,
        )
        self.tpot = Histogram(
            "inference_objective_request_tpot_seconds",
            "Mean time per output token after the first, in seconds.",
            _MODEL,
            buckets=buckets.TPOT,
            registry=r,
        )
        self.input_tokens = Histogram(
            "inference_objective_input_tokens",
            "Prompt tokens per request (as the server counts).",
            _MODEL,
            buckets=buckets.INPUT_TOKENS,
            registry=r,
        )
        self.output_tokens = Histogram(
            "inference_objective_output_tokens",
            "Completion tokens per request.",
            _MODEL,
            buckets=buckets.OUTPUT_TOKENS,
            registry=r,
        )
        self.cached_tokens = Histogram(
            "inference_objective_prompt_cached_tokens",
            "Prompt tokens served from the prefix cache.",
            _MODEL,
            buckets=buckets.INPUT_TOKENS,
            registry=r,
        )
        self.ntpot = Histogram(
            "inference_objective_normalized_time_per_output_token_seconds",
            "End-to-end latency divided by the output tokens, in seconds.",
            _MODEL,
            buckets=buckets.NTPOT,
            registry=r,
        )
        self.request_sizes = Histogram(
            "inference_objective_request_sizes",
            "Request body size in bytes, as the client sent it.",
            _MODEL,
            buckets=buckets.REQUEST_BYTES,
            registry=r,
        )
        self.response_sizes = Histogram(
            "inference_objective_response_sizes",
            "Response body size in bytes, as the model server sent it.",
            _MODEL,
            buckets=buckets.RESPONSE_BYTES,
            registry=r,
        )
        self.running = Gauge(
            "inference_objective_running_requests",
            "Requests in flight, by model.",
            ("model_name",),
            registry=r,
        )

    def _define_scheduler_metrics(self, r: CollectorRegistry) -> None:
        """The scheduler's decisions: their duration, outcome, prefix hits; the gateway's
        own overhead."""
        self.scheduler_duration = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time to parse, resolve and schedule one request, in seconds.",
            buckets=buckets.MICRO,
            registry=r,
        )
        self.scheduler_attempts = Counter(
            "inference_extension_scheduler_attempts",
            "Scheduling attempts by outcome.",
            ("status",),
            registry=r,
        )
        self.plugin_duration = Histogram(
            "inference_extension_plugin_duration_seconds",
            "Time of one plugin call by extension point, plugin type and name, in seconds "
            f"(sampled: the calls of one scheduling cycle in {PLUGIN_TIMING_EVERY}).",
            ("extension_point", "plugin_type", "plugin_name"),
            buckets=buckets.MICRO,
            registry=r,
        )
        self.info = Gauge(
            "inference_extension_info",
            "Build of this gateway: always 1, labelled with its commit and version.",
            ("commit", "build_ref"),
            registry=r,
        )
        self.info.labels(*build_info()).set(1)
        self.prefix_hit_ratio = Histogram(
            "inference_extension_prefix_indexer_hit_ratio",
            "Share of a request's prompt blocks found on the chosen endpoint.",
            buckets=buckets.RATIO,
            registry=r,
        )
        self.overhead = Histogram(
            "sluicegate_gateway_overhead_seconds",
            "Time a request spends in the gateway itself (before the upstream is called), "
            "in seconds.",
            buckets=buckets.MICRO,
            registry=r,
        )

    def _define_upstream_metrics(self, r: CollectorRegistry) -> None:
        """What went wrong upstream: retries, failures by kind, ejections by reason."""
        self.retries = Counter(
            "sluicegate_upstream_retries",
            "Requests sent again to another endpoint after a failure.",
            registry=r,
        )
        self.upstream_failures = Counter(
            "sluicegate_upstream_failures",
            "Upstream failures by endpoint and kind.",
            ("endpoint", "kind"),
            registry=r,
        )
        self.ejections = Counter(
            "sluicegate_endpoint_ejections",
            "Endpoints taken out of scheduling, by reason (consecutive-5xx, "
            "consecutive-gateway-failure, success-rate, failure-percentage, "
            "probation-failure, stalled, scrape-failure).",
            ("pool", "endpoint", "reason"),
            registry=r,
        )

    def _define_flow_control_metrics(self, r: CollectorRegistry) -> None:
        """Waiting in flow control, and requests the gateway answered itself."""
        self.queue_wait = Histogram(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time requests spent in flow control, enqueue to outcome (Dispatched, "
            "RejectedCapacity, EvictedTTL, EvictedContextCancelled, ...), in seconds.",
            ("fairness_id", "priority", "outcome", "inference_pool", *_MODEL),
            buckets=buckets.QUEUE,
            registry=r,
        )
        self.enqueue_duration = Histogram(
            "inference_extension_flow_control_request_enqueue_duration_seconds",
            "Time to admit a request to a flow-control queue (capacity checks and "
            "insertion), by outcome (NotYetFinalized: queued), in seconds.",
            ("fairness_id", "priority", "outcome"),
            buckets=buckets.MICRO,
            registry=r,
        )
        self.dispatch_cycle = Histogram(
            "inference_extension_flow_control_dispatch_cycle_duration_seconds",
            "Time of one flow-control dispatch cycle (a pass over the waiting requests), "
            "in seconds.",
            buckets=buckets.MICRO,
            registry=r,
        )
        self.refused = Counter(
            "sluicegate_requests_refused",
            "Requests the gateway answered itself instead of serving, by reason "
            "(rejected-saturated, rejected-capacity, rejected-ttl-expired, no-endpoint, ...).",
            ("reason",),
            registry=r,
        )

    def _define_rewrite_metrics(self, r: CollectorRegistry) -> None:
        """InferenceModelRewrite decisions (GIE's name and labels, ``metrics.go`` at
        1748e829). Every label is a configured name: the rewrite, the matched model name
        (``_any`` for a rule without matches) and the chosen target."""
        self.rewrite_decisions = Counter(
            "inference_extension_model_rewrite_decisions",
            "Requests whose model an InferenceModelRewrite rewrote, by rewrite, requested "
            "model and chosen target.",
            ("model_rewrite_name", "model_name", "target_model"),
            registry=r,
        )

    def rewrite_decided(self, rewrite: str, matched: str, target: str) -> None:
        """Count one rewrite decision; ``matched`` is the rule's exact name, or "" for a
        rule without matches."""
        self.rewrite_decisions.labels(rewrite, matched or ANY_MODEL_LABEL, target).inc()

    def plugin_call(self, extension_point: str, plugin: Plugin, seconds: float) -> None:
        """Record one timed plugin call (the scheduler's :class:`PluginTiming` sink)."""
        key = (extension_point, plugin.name)
        series = self._plugin_series.get(key)
        if series is None:
            series = self.plugin_duration.labels(extension_point, plugin.type_name, plugin.name)
            if len(self._plugin_series) < _MAX_SERIES:
                self._plugin_series[key] = series
        series.observe(seconds)

    def endpoint_ejected(self, endpoint: Endpoint, reason: str) -> None:
        """Count an ejection (the outlier detector's and the collector's listener)."""
        self.ejections.labels(endpoint.pool, endpoint.name, reason).inc()

    def _define_prediction_metrics(self, r: CollectorRegistry) -> None:
        """Predicted latency of the chosen endpoint, prediction time, SLO violations and
        predictor fallbacks (names: GIE's ``inference_objective_`` ones, ``metrics.go``)."""
        self.predicted_ttft = Histogram(
            "inference_objective_request_predicted_ttft_seconds",
            "Predicted TTFT on the chosen endpoint, in seconds.",
            _MODEL,
            buckets=buckets.LATENCY,
            registry=r,
        )
        self.predicted_tpot = Histogram(
            "inference_objective_request_predicted_tpot_seconds",
            "Predicted TPOT on the chosen endpoint, in seconds.",
            _MODEL,
            buckets=buckets.TPOT,
            registry=r,
        )
        # GIE gives these 100 µs .. 5 s buckets; one batched call takes well under the
        # 5 ms latency floor, so they share the scheduler's 10 µs .. 1 s buckets.
        self.ttft_prediction_duration = Histogram(
            "inference_objective_request_ttft_prediction_duration_seconds",
            "Time the TTFT prediction for all candidates took, in seconds.",
            _MODEL,
            buckets=buckets.MICRO,
            registry=r,
        )
        self.tpot_prediction_duration = Histogram(
            "inference_objective_request_tpot_prediction_duration_seconds",
            "Time the TPOT prediction for all candidates took, in seconds.",
            _MODEL,
            buckets=buckets.MICRO,
            registry=r,
        )
        self.slo_violations = Counter(
            "inference_objective_request_slo_violation",
            "Streamed answers whose observed TTFT or TPOT exceeded the request's SLO header, "
            "by type (ttft, tpot).",
            (*_MODEL, "type"),
            registry=r,
        )
        self.predictor_fallbacks = Counter(
            "sluicegate_predictor_fallbacks",
            "Requests scheduled on the heuristic composite although predictions were wanted, "
            "by reason (warming-up: no model yet; unavailable: no prediction server answered).",
            ("reason",),
            registry=r,
        )

    def prediction_series(self, model: str, target: str) -> PredictionSeries:
        """The prediction children for ``model`` served as ``target``, made on first use so
        models never scheduled on predictions export no empty histograms."""
        key = (model, target)
        series = self._prediction_series.get(key)
        if series is None:
            if len(self._prediction_series) >= _MAX_SERIES:
                self._prediction_series.clear()
            labels = (model, target)
            series = self._prediction_series[key] = PredictionSeries(
                predicted_ttft=self.predicted_ttft.labels(*labels),
                predicted_tpot=self.predicted_tpot.labels(*labels),
                ttft_duration=self.ttft_prediction_duration.labels(*labels),
                tpot_duration=self.tpot_prediction_duration.labels(*labels),
            )
        return series

    def model_series(self, model: str, target: str) -> ModelSeries:
        """The per-model series for ``model`` served as ``target``: eight label lookups
        resolved once."""
        key = (model, target)
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= _MAX_SERIES:  # bounded; resolving again is cheap
                self._series.clear()
            labels = (model, target)
            series = self._series[key] = ModelSeries(
                requests=self.requests.labels(*labels),
                running=self.running.labels(model),
                duration=self.duration.labels(*labels),
                ttft=self.ttft.labels(*labels),
                tpot=self.tpot.labels(*labels),
                input_tokens=self.input_tokens.labels(*labels),
                output_tokens=self.output_tokens.labels(*labels),
                cached_tokens=self.cached_tokens.labels(*labels),
                ntpot=self.ntpot.labels(*labels),
                request_sizes=self.request_sizes.labels(*labels),
                response_sizes=self.response_sizes.labels(*labels),
            )
        return series

    def watch_client_connections(self, counts: ClientCounts) -> None:
        """Export the HTTP server's client-connection counters, read from ``counts`` when
        scraped (the standalone gateway; call once)."""
        self.registry.register(ClientCollector(counts))

    def render(self) -> bytes:
        """The exposition of every family, under the names ``names`` selects."""
        if self.names == "gateway-api":
            return generate_latest(self.registry)
        return generate_latest(renamed_registry(self.registry, self.names))


_MAX_SERIES = 4096

PLUGIN_TIMING_EVERY = 8
"""One scheduling cycle in this many has its plugin calls timed: timing a call costs
about 0.35 µs (two clock reads and an observation), which on every call would add a few
per cent to a request's scheduling."""


def build_info() -> tuple[str, str]:
    """(commit, build_ref) of this build: ``SLUICEGATE_COMMIT`` from the environment (set
    when the image is built; empty when unknown) and the package version."""
    return os.environ.get("SLUICEGATE_COMMIT", ""), __version__


@dataclass(frozen=True, slots=True)
class ModelSeries:
    """The labelled children of :class:`GatewayMetrics` for one (model, target) pair."""

    requests: CounterSeries
    running: GaugeSeries
    duration: HistogramSeries
    ttft: HistogramSeries
    tpot: HistogramSeries
    input_tokens: HistogramSeries
    output_tokens: HistogramSeries
    cached_tokens: HistogramSeries
    ntpot: HistogramSeries
    request_sizes: HistogramSeries
    response_sizes: HistogramSeries


@dataclass(frozen=True, slots=True)
class PredictionSeries:
    """The labelled prediction children of :class:`GatewayMetrics` for one (model, target)
    pair (seconds)."""

    predicted_ttft: HistogramSeries
    predicted_tpot: HistogramSeries
    ttft_duration: HistogramSeries
    tpot_duration: HistogramSeries


__all__ = [
    "ANY_MODEL_LABEL",
    "NO_MODEL_LABEL",
    "UNKNOWN_MODEL_LABEL",
    "GatewayMetrics",
    "ModelSeries",
    "PredictionSeries",
]
