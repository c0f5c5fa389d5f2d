"""What the runtime tells the exported metrics about routing: each request refused,
queued, dispatched or answered, the latency predictor's part, the sampled plugin timings,
and the flow-control and prefix-index state read when ``/metrics`` is scraped.

Times are in seconds (the clock's), token counts in tokens, sizes in bytes.
"""

from __future__ import annotations

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.observe import FairnessLabels, band_flows, queue_outcome
from sluicegate.framework import (
    PREDICTIONS,
    PREFIX_MATCH,
    PredictionOutcome,
    PrefixIndexer,
    QueueItem,
)
from sluicegate.metrics import PLUGIN_TIMING_EVERY, UNKNOWN_MODEL_LABEL, GatewayMetrics
from sluicegate.requestcontrol.director import Admitted, Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.responses import Usage
from sluicegate.scheduling.config import BuiltScheduler
from sluicegate.scheduling.scheduler import PluginTiming

FlowState = list[tuple[str, float, list[tuple[int, str, int, int]]]]
"""Per pool with a flow controller: its name, its saturation and its flows' rows."""


class RequestMetrics:
    """Records what happens to routed requests into ``metrics``."""

    def __init__(self, metrics: GatewayMetrics, clock: Clock) -> None:
        self.metrics = metrics
        self.clock = clock
        self._fairness_label = FairnessLabels()

    def refused(self, error: GatewayError, models: ModelTable, model: str) -> None:
        """``acquire`` refused a request for ``model`` (the client's name) with ``error``."""
        metrics = self.metrics
        metrics.scheduler_attempts.labels("failure").inc()
        metrics.refused.labels(error.reason).inc()
        # A model nothing serves is the client's word: one label for all of them, so
        # made-up names cannot use up the label sets real models' errors need.
        label = UNKNOWN_MODEL_LABEL if error.reason == "unknown-model" else models.label(model)
        metrics.errors.labels(label, "", str(error.status)).inc()

    def dispatched(self, dispatch: Dispatch) -> None:
        """``acquire`` routed a request: counted as running until :meth:`ended`."""
        metrics = self.metrics
        metrics.attempt_success.inc()
        match = dispatch.state.get(PREFIX_MATCH)
        if match is not None and match.hashes:
            metrics.prefix_hit_ratio.observe(match.score(dispatch.endpoint.name))
        request = dispatch.request
        series = metrics.model_series(request.model_label, request.target_model)
        series.requests.inc()
        series.running.inc()
        series.request_sizes.observe(request.body_bytes)

    def ended(self, dispatch: Dispatch, status: int, ok: bool, usage: Usage | None) -> None:
        """The response to ``dispatch`` ended with HTTP ``status`` (0: none); ``ok`` is a
        success, whose latencies and token counts are recorded."""
        request = dispatch.request
        self.metrics.model_series(request.model_label, request.target_model).running.dec()
        if ok:
            self.completed(dispatch, usage or Usage())
        elif status:
            self.metrics.errors.labels(request.model_label, request.target_model, str(status)).inc()

    def wait(self, item: QueueItem, pool: str, reason: str) -> None:
        """A queued request left the queue (``reason``: dispatched, cancelled or its
        refusal's)."""
        request = item.request
        self.metrics.queue_wait.labels(
            self._fairness_label(request.fairness_id),
            str(request.priority),
            queue_outcome(reason, queued=True),
            pool,
            request.model_label,
            request.target_model,
        ).observe(self.clock.now() - item.enqueued_at)

    def enqueue(self, admitted: Admitted, refused: str | None, took_s: float) -> None:
        """Flow control queued ``admitted`` (``refused`` None) or refused it at the door:
        the enqueue time, and for a refusal its (zero) time in flow control."""
        request = admitted.request
        priority = str(request.priority)
        outcome = "NotYetFinalized" if refused is None else queue_outcome(refused, queued=False)
        fairness = self._fairness_label(request.fairness_id)
        self.metrics.enqueue_duration.labels(fairness, priority, outcome).observe(took_s)
        if refused is not None:
            self.metrics.queue_wait.labels(
                fairness,
                priority,
                outcome,
                admitted.pool.name,
                request.model_label,
                request.target_model,
            ).observe(0.0)

    def prediction(self, dispatch: Dispatch, outcome: PredictionOutcome) -> None:
        """What the predicted-latency producer did for a dispatched request: the chosen
        endpoint's predictions and the call's duration, or a fallback (opted-out requests
        count as neither)."""
        metrics = self.metrics
        if outcome.fallback:
            metrics.predictor_fallbacks.labels(outcome.status).inc()
            return
        if outcome.status != "predicted":
            return
        request = dispatch.request
        series = metrics.prediction_series(request.model_label, request.target_model)
        # One batched call predicts both targets: its duration is each one's (as GIE does).
        series.ttft_duration.observe(outcome.duration_s)
        chosen = (dispatch.state.get(PREDICTIONS) or {}).get(dispatch.endpoint.name)
        if chosen is None:  # e.g. an endpoint whose prediction was not finite
            return
        series.predicted_ttft.observe(chosen.ttft_ms / 1000.0)
        if chosen.tpot_ms > 0:  # 0 until a TPOT model exists: nothing was predicted
            series.tpot_duration.observe(outcome.duration_s)
            series.predicted_tpot.observe(chosen.tpot_ms / 1000.0)

    def completed(self, dispatch: Dispatch, usage: Usage) -> None:
        """A successful response: its latencies (TTFT and TPOT of streamed ones, judged
        against the request's SLOs), token counts and size."""
        m = self.metrics.model_series(dispatch.request.model_label, dispatch.request.target_model)
        finished = dispatch.finished_at or self.clock.now()
        e2e = finished - dispatch.request.arrival
        m.duration.observe(e2e)
        output_tokens = usage.output_tokens
        request = dispatch.request
        if dispatch.first_byte_at is not None and request.stream:
            ttft = dispatch.first_byte_at - request.arrival
            m.ttft.observe(ttft)
            if request.slo_ttft_ms is not None and ttft * 1000.0 > request.slo_ttft_ms:
                self._slo_violated(request.model_label, request.target_model, "ttft")
            if output_tokens > 1:
                tpot = (e2e - ttft) / (output_tokens - 1)
                m.tpot.observe(tpot)
                if request.slo_tpot_ms is not None and tpot * 1000.0 > request.slo_tpot_ms:
                    self._slo_violated(request.model_label, request.target_model, "tpot")
        if usage.prompt_tokens is not None:
            m.input_tokens.observe(usage.prompt_tokens)
        if output_tokens:
            m.output_tokens.observe(output_tokens)
            # As the reference: the whole latency over all output tokens (not TPOT's).
            m.ntpot.observe(e2e / output_tokens)
        if usage.response_bytes is not None:
            m.response_sizes.observe(usage.response_bytes)
        if usage.cached_tokens is not None:
            m.cached_tokens.observe(usage.cached_tokens)

    def _slo_violated(self, model: str, target: str, kind: str) -> None:
        # Only streamed answers: the gateway sees no first token of a non-streamed one,
        # so its TTFT (and TPOT) cannot be judged against the SLO.
        self.metrics.slo_violations.labels(model, target, kind).inc()


def time_plugins(built: BuiltScheduler, metrics: GatewayMetrics) -> None:
    """Have the scheduler time its plugin calls (sampled) into ``metrics``."""
    built.scheduler.timing = PluginTiming(metrics.plugin_call, every=PLUGIN_TIMING_EVERY)


def flow_state(director: Director, datastore: Datastore, now: float) -> FlowState:
    """Each flow-controlled pool's saturation (over its endpoints that are not ejected)
    and its flows, as the metrics read them when scraped."""
    out = []
    for name, controller in director.controllers().items():
        pool = datastore.pools.get(name)
        endpoints = [e for e in pool.endpoints if not e.health.ejected] if pool else []
        flows: list[tuple[int, str, int, int]] = []
        for band in controller.bands():
            flows.extend(band_flows(band))
        out.append((name, director.flow.detector.saturation(endpoints, now), flows))
    return out


def prefix_index_size(built: BuiltScheduler) -> int:
    """Blocks held by the scheduler's prefix indexes."""
    return sum(p.indexed_blocks() for p in built.plugins.values() if isinstance(p, PrefixIndexer))


__all__ = ["FlowState", "RequestMetrics", "flow_state", "prefix_index_size", "time_plugins"]
