"""The endpoint picker without its front door: what both hosts share.

A :class:`Runtime` holds the endpoint set and its metrics collector, the scheduler, the
director with flow control, and the exported metrics. Its hosts — the standalone gateway
(:mod:`sluicegate.gateway`, which proxies the request itself) and the Envoy endpoint picker
(:mod:`sluicegate.extproc`, which tells Envoy where to send it) — call :meth:`acquire` with
a parsed request to get a :class:`~sluicegate.requestcontrol.dispatch.Dispatch` (waiting in
flow control when the pool is saturated) and :meth:`release` when the response has ended,
however it ended.

Everything here runs on one event loop; nothing blocks it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from sluicegate.api.loader import Config
from sluicegate.api.resources import OutlierDetectionSettings
from sluicegate.builtins import default_registry
from sluicegate.clock import Clock, MonotonicClock
from sluicegate.datalayer.collector import Collector, CollectorSettings
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.outlier import OutlierDetector, OutlierSettings, Result, classify_status
from sluicegate.datalayer.pools import EndpointsByPool, static_endpoints, sync_pools
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import FlowControlSetup, build_flow_control
from sluicegate.flowcontrol.observe import FairnessLabels, band_flows, queue_outcome
from sluicegate.framework import (
    PREDICTION_OUTCOME,
    PREDICTIONS,
    PREDICTOR_SERVICE,
    PREFIX_MATCH,
    PluginContext,
    PredictionOutcome,
    PrefixIndexer,
    QueueItem,
)
from sluicegate.latency.host import PredictorHost
from sluicegate.metrics import PLUGIN_TIMING_EVERY, UNKNOWN_MODEL_LABEL, GatewayMetrics
from sluicegate.requestcontrol.director import Admitted, Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import ParsedRequest
from sluicegate.requestcontrol.responses import Usage as Usage  # re-exported
from sluicegate.scheduling.config import BuiltScheduler, build_scheduler
from sluicegate.scheduling.scheduler import PluginTiming
from sluicegate.upstream import UpstreamPool

log = logging.getLogger("sluicegate.runtime")


class _Waiter:
    """The ticket of a request waiting in flow control: its task awaits ``future``."""

    __slots__ = ("future", "pool", "runtime")

    def __init__(self, runtime: Runtime, future: asyncio.Future[Dispatch], pool: str) -> None:
        self.runtime = runtime
        self.future = future
        self.pool = pool

    def dispatched(self, item: QueueItem, dispatch: Dispatch) -> None:
        self.runtime._observe_wait(item, self.pool, "dispatched")
        if self.future.done():  # its client left while it was being scheduled
            dispatch.finish(self.runtime.clock.now(), ok=False)
        else:
            self.future.set_result(dispatch)

    def rejected(self, item: QueueItem, error: GatewayError) -> None:
        self.runtime._observe_wait(item, self.pool, error.reason)
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True)
class RuntimeOptions:
    """How the picker runs, beyond what the configuration says."""

    seed: int = 0
    """Seeds every random choice the plugins make (random pickers, tie breaks)."""
    services: Mapping[str, object] = field(default_factory=dict)
    """Shared services plugins look up by name (e.g. the latency predictor)."""
    latency_model_dir: str | None = None
    """Overrides ``latencyPredictor.modelDir`` (``--latency-model-dir``)."""
    latency_trace: str | None = None
    """A recorded trace the in-process models train on at start (``--latency-trace``)."""


class Runtime:
    """Discovery state, scheduler, director and metrics for one configuration."""

    def __init__(
        self, config: Config, options: RuntimeOptions | None = None, clock: Clock | None = None
    ) -> None:
        self.options = options or RuntimeOptions()
        self.clock = clock or MonotonicClock()
        self.config = config
        self.predictor: PredictorHost | None = None
        """The latency predictor, unless the options provide one."""
        self.registry = default_registry()
        """The plugin types schedulers and flow control are built from."""
        self._services = dict(self.options.services)
        if PREDICTOR_SERVICE not in self._services:
            self.predictor = PredictorHost(
                config.gateway.latency_predictor,
                self.clock,
                model_dir=self.options.latency_model_dir,
                trace=self.options.latency_trace,
            )
            self._services[PREDICTOR_SERVICE] = self.predictor.service
        self.staleness_s = config.gateway.metrics_staleness_ms / 1000.0
        self.datastore = Datastore()
        self.built = self._build_scheduler(config)
        self.director = Director(
            self.datastore,
            self.built,
            ModelTable(config),
            self.clock,
            self.staleness_s,
            flow=self._build_flow(config, self.built),
            prediction_default=config.gateway.latency_predictor.prediction_based_scheduling_default,
        )
        self.metrics = GatewayMetrics(
            self.datastore,
            self.clock,
            self.staleness_s,
            self._prefix_index_size,
            self._flow_state,
            names=config.gateway.metrics_names,
        )
        self._fairness_label = FairnessLabels()
        self.director.on_enqueue = self._observe_enqueue
        self.director.on_dispatch_cycle = self.metrics.dispatch_cycle.observe
        self._time_plugins(self.built)
        if self.predictor is not None:
            self.predictor.register_metrics(self.metrics.registry)
        self.collector: Collector | None = None
        self.outlier: OutlierDetector | None = None
        """Ejects endpoints whose requests fail (None when ``outlierDetection`` is off)."""
        self._outlier_task: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._discovered: EndpointsByPool | None = None
        self._warned_empty: set[str] = set()
        """Pools whose emptiness has been logged (logged again once they had endpoints)."""
        self._logged_unserved: set[str] = set()
        """Not-served refusals already logged (bounded; emptied on every reload)."""
        sync_pools(self.datastore, config, static_endpoints(config))

    # ------------------------------------------------------------------ lifecycle

    def _context(self) -> PluginContext:
        return PluginContext(self.clock, self.options.seed, services=self._services)

    def _build_scheduler(self, config: Config) -> BuiltScheduler:
        return build_scheduler(config.picker, self._context(), self.registry)

    def _time_plugins(self, built: BuiltScheduler) -> None:
        """Have the scheduler time its plugin calls (sampled) into the metrics."""
        built.scheduler.timing = PluginTiming(self.metrics.plugin_call, every=PLUGIN_TIMING_EVERY)

    def _build_flow(self, config: Config, built: BuiltScheduler) -> FlowControlSetup:
        return build_flow_control(config.picker, built.plugins, self._context(), self.registry)

    async def start(self, upstream: UpstreamPool) -> None:
        """Start scraping every endpoint's metrics over ``upstream``, and the latency
        predictor (loading saved models, training, or connecting to its servers)."""
        if self.predictor is not None:
            await self.predictor.start()
        settings = self.config.gateway
        self.collector = Collector(
            self.datastore,
            upstream,
            self.clock,
            CollectorSettings(
                scrape_interval_s=settings.scrape_interval_ms / 1000.0,
                scrape_timeout_s=settings.scrape_timeout_ms / 1000.0,
                models_interval_s=settings.models_refresh_interval_ms / 1000.0,
                eject_after=settings.eject_after_failures,
                frozen_after_s=self.staleness_s,
            ),
        )
        self.collector.on_scrape.append(self._on_scrape)
        self.collector.on_models.append(self._on_models)
        self.collector.on_eject.append(self.metrics.endpoint_ejected)
        self.collector.start()
        if settings.outlier_detection.enabled:
            self.outlier = OutlierDetector(
                self.datastore, self.clock, outlier_settings(settings.outlier_detection)
            )
            self.outlier.on_eject.append(self.metrics.endpoint_ejected)
            self.collector.on_reachable.append(self.outlier.reachable_again)
            self._outlier_task = asyncio.create_task(self._outlier_loop(), name="outlier")
        self._warn_empty_pools()

    async def _outlier_loop(self) -> None:
        detector = self.outlier
        assert detector is not None
        while True:
            await asyncio.sleep(detector.settings.tick_s)
            try:
                detector.tick()
            except Exception:  # a bug must not end ejections (and returns) for good
                log.exception("outlier detection failed")

    def report(self, dispatch: Dispatch, result: Result, detail: str = "") -> None:
        """The current attempt of ``dispatch`` ended with ``result``: tell the outlier
        detector, once per attempt."""
        if dispatch.reported_attempt == dispatch.attempts:
            return
        dispatch.reported_attempt = dispatch.attempts
        if self.outlier is not None:
            self.outlier.record(dispatch.endpoint, result, detail)

    async def stop(self) -> None:
        if self._outlier_task is not None:
            self._outlier_task.cancel()
            await asyncio.gather(self._outlier_task, return_exceptions=True)
            self._outlier_task = None
            self.outlier = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.collector is not None:
            await self.collector.stop()
            self.collector = None
        if self.predictor is not None:
            await self.predictor.stop()

    def apply_config(self, config: Config, endpoints: EndpointsByPool | None = None) -> None:
        """Switch to ``config`` (and, from discovery, ``endpoints`` by pool) without dropping
        requests in flight.

        Without ``endpoints`` the pools' endpoints are the configuration's static lists, or
        the last ones discovery delivered. Endpoints that stay keep their state; the
        scheduler is rebuilt only when the EndpointPickerConfig changed (rebuilding starts
        its prefix index afresh). Raises (changing nothing) when the new scheduler cannot
        be built.
        """
        old_picker, new_picker = self.config.picker, config.picker
        same = (old_picker.model_dump() if old_picker else None) == (
            new_picker.model_dump() if new_picker else None
        )
        # Build everything that can fail before changing anything.
        built = self.built if same else self._build_scheduler(config)
        flow = self.director.flow if same else self._build_flow(config, built)
        models = ModelTable(config)
        new_predictor = config.gateway.latency_predictor
        live = {"prediction_based_scheduling_default"}  # read per request: applied now
        old_predictor = self.config.gateway.latency_predictor
        if new_predictor.model_dump(exclude=live) != old_predictor.model_dump(exclude=live):
            log.warning("latencyPredictor changes take effect at the next restart")
        if endpoints is not None:
            self._discovered = endpoints
        if self.outlier is not None:  # thresholds apply now; turning it on or off: restart
            self.outlier.settings = outlier_settings(config.gateway.outlier_detection)
        self.config = config
        self.director.models = models
        self.director.prediction_default = new_predictor.prediction_based_scheduling_default
        discovered = self._discovered is not None
        sync_pools(
            self.datastore,
            config,
            self._discovered if self._discovered is not None else static_endpoints(config),
            discovered=discovered,
        )
        if not same:
            self._time_plugins(built)
        self.metrics.names = config.gateway.metrics_names
        self.built = self.director.built = built
        self.director.set_flow(flow)
        self._logged_unserved.clear()
        self.director.reject_unservable()
        if not discovered and self.collector is not None:  # started: a reload of the file
            self._warn_empty_pools()
        log.info(
            "configuration applied: %d pool(s), %d model(s), %d endpoint(s)%s",
            len(self.datastore.pools),
            len(config.models),
            len(self.datastore.all_endpoints()),
            "" if same else ", scheduler rebuilt",
        )

    # ------------------------------------------------------------------ requests

    async def acquire(
        self,
        parsed: ParsedRequest,
        request_id: str,
        headers: Mapping[str, str],
        started: float | None = None,
        subset: Collection[str] | None = None,
    ) -> Dispatch:
        """Route ``parsed``: an endpoint now, or after a wait in flow control.

        Raises :class:`~sluicegate.errors.GatewayError` when the request is refused
        (unknown model, shed, queue timeout, no endpoint). Cancelling the awaiting task
        (the client went away) gives up its place in the queue. ``started`` is the
        ``time.perf_counter()`` reading when the request arrived, for the scheduling-time
        metric. ``subset``, when given, lists the ``host:port`` addresses the request may
        go to (the endpoint-picker protocol's subset hint; empty = none, a 503). Every
        returned Dispatch must be handed to :meth:`release`.
        """
        metrics = self.metrics
        started = time.perf_counter() if started is None else started
        try:
            admitted = self.director.admit(parsed, request_id, headers, subset)
            rewrite = admitted.rewrite
            if rewrite is not None and rewrite.rewrite is not None:
                target = admitted.request.target_model
                metrics.rewrite_decided(rewrite.rewrite, rewrite.public_name, target)
            state = await self.director.prefetch(admitted) if self.built.fetchers else None
            waiter: asyncio.Future[Dispatch] = asyncio.get_running_loop().create_future()
            ticket = _Waiter(self, waiter, admitted.pool.name)
            result = self.director.submit(admitted, ticket, state)
            if isinstance(result, QueueItem):
                at_once = waiter.done()  # dispatched without waiting (or refused)
                dispatch = await self._wait(result, ticket)
                if at_once:
                    metrics.scheduler_duration.observe(time.perf_counter() - started)
            else:
                dispatch = result
                metrics.scheduler_duration.observe(time.perf_counter() - started)
        except GatewayError as exc:
            metrics.scheduler_attempts.labels("failure").inc()
            metrics.refused.labels(exc.reason).inc()
            # A model nothing serves is the client's word: one label for all of them, so
            # made-up names cannot use up the label sets real models' errors need.
            model = (
                UNKNOWN_MODEL_LABEL
                if exc.reason == "unknown-model"
                else self.director.models.label(parsed.model)
            )
            metrics.errors.labels(model, "", str(exc.status)).inc()
            if exc.detail:
                self._log_refusal(exc)
            raise
        metrics.attempt_success.inc()
        match = dispatch.state.get(PREFIX_MATCH)
        if match is not None and match.hashes:
            metrics.prefix_hit_ratio.observe(match.score(dispatch.endpoint.name))
        series = metrics.model_series(dispatch.request.model_label, dispatch.request.target_model)
        series.requests.inc()
        series.running.inc()
        series.request_sizes.observe(dispatch.request.body_bytes)
        outcome = dispatch.state.get(PREDICTION_OUTCOME)
        if outcome is not None:
            self._observe_prediction(dispatch, outcome)
        return dispatch

    def release(self, dispatch: Dispatch, status: int, usage: Usage | None = None) -> None:
        """The response to ``dispatch`` has ended with HTTP ``status`` (0 = no response:
        the client left or the upstream failed before answering). Frees its in-flight
        charge, tells the response observers, records the latency metrics on success and
        lets waiting requests take the room. Calling it again does nothing."""
        if dispatch.finished_at is not None:
            return
        if status:  # a host without a proxy (Envoy's) sees only the final status
            self.report(dispatch, classify_status(status), f"status {status}")
        ok = 200 <= status < 400
        dispatch.finish(self.clock.now(), usage.output_tokens if usage and ok else None, ok)
        request = dispatch.request
        self.metrics.model_series(request.model_label, request.target_model).running.dec()
        if ok:
            self._observe(dispatch, usage or Usage())
        elif status:
            self.metrics.errors.labels(request.model_label, request.target_model, str(status)).inc()
        if self.director.controllers():
            self.director.pump()  # its place may be someone else's now
            self._arm_expiry()

    def ready_endpoints(self) -> int:
        """Endpoints that can take traffic now (not ejected, metrics fresh)."""
        now = self.clock.now()
        return sum(
            1
            for e in self.datastore.all_endpoints()
            if not e.health.ejected and not e.is_stale(now, self.staleness_s)
        )

    # ------------------------------------------------------------------ flow control

    async def _wait(self, item: QueueItem, ticket: _Waiter) -> Dispatch:
        """Wait for a queued request to be dispatched (or refused)."""
        self._arm_expiry()
        waiter = ticket.future
        try:
            return await waiter
        except asyncio.CancelledError:
            # The client left: free its place in the queue. If it was dispatched just
            # before (the result set, this task not resumed yet), release the dispatch.
            if self.director.cancel(item):
                self._observe_wait(item, ticket.pool, "cancelled")
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().finish(self.clock.now(), ok=False)
                self.director.pump()
            raise

    def _observe_wait(self, item: QueueItem, pool: str, reason: str) -> None:
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

    def _observe_enqueue(self, admitted: Admitted, refused: str | None, took_s: float) -> None:
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

    def _arm_expiry(self) -> None:
        """Make sure a timer fires at the next queue deadline."""
        if self._expiry is not None:
            return
        deadline = self.director.next_deadline()
        if deadline is None:
            return
        delay = max(0.0, deadline - self.clock.now())
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        self.director.expire()
        self._arm_expiry()

    def _on_models(self, endpoint: Endpoint) -> None:
        """A served-model list changed: queued requests for a target no endpoint lists
        any more are answered now."""
        if self.director.waiting_requests():
            self.director.reject_unservable()

    def _log_refusal(self, error: GatewayError) -> None:
        """Log a refusal's operator detail once per distinct message (bounded)."""
        key = f"{error.message} {error.detail}"
        if key in self._logged_unserved or len(self._logged_unserved) >= _MAX_LOGGED:
            return
        self._logged_unserved.add(key)
        log.warning("%s (%s)", error.message, error.detail)

    def _warn_empty_pools(self) -> None:
        """One log line for each configured pool without endpoints, saying what is missing
        and how to fix it (again only after it had endpoints in between)."""
        for name, pool in self.datastore.pools.items():
            if pool.endpoints:
                self._warned_empty.discard(name)
            elif name not in self._warned_empty:
                self._warned_empty.add(name)
                resource = self.config.pools.get(name)
                labels = resource.spec.match_labels if resource is not None else {}
                selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                log.warning(
                    "InferencePool '%s'%s has no endpoints, so its requests are answered 503: %s",
                    name,
                    f" (selector {selector})" if selector else "",
                    pool.empty_hint,
                )

    def empty_pools(self) -> list[str]:
        """Pools with no endpoint at all (none configured or discovered), by name."""
        return sorted(name for name, pool in self.datastore.pools.items() if not pool.endpoints)

    def _on_scrape(self, endpoint: Endpoint) -> None:
        """Fresh metrics may show room for waiting requests."""
        if self.director.controllers():
            self.director.pump()

    # ------------------------------------------------------------------ metrics

    def _flow_state(self) -> list[tuple[str, float, list[tuple[int, str, int, int]]]]:
        now = self.clock.now()
        out = []
        for name, controller in self.director.controllers().items():
            pool = self.datastore.pools.get(name)
            endpoints = [e for e in pool.endpoints if not e.health.ejected] if pool else []
            flows: list[tuple[int, str, int, int]] = []
            for band in controller.bands():
                flows.extend(band_flows(band))
            out.append((name, self.director.flow.detector.saturation(endpoints, now), flows))
        return out

    def _prefix_index_size(self) -> int:
        return sum(
            p.indexed_blocks() for p in self.built.plugins.values() if isinstance(p, PrefixIndexer)
        )

    def _observe_prediction(self, dispatch: Dispatch, outcome: PredictionOutcome) -> None:
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

    def _observe(self, dispatch: Dispatch, usage: Usage) -> None:
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


_MAX_LOGGED = 256
"""Distinct refusal details logged between two reloads."""


def outlier_settings(spec: OutlierDetectionSettings) -> OutlierSettings:
    """The detector's settings from the configuration's (ms to s)."""
    return OutlierSettings(
        consecutive_5xx=spec.consecutive_5xx,
        consecutive_gateway_failure=spec.consecutive_gateway_failure,
        interval_s=spec.interval_ms / 1000.0,
        base_ejection_s=spec.base_ejection_time_ms / 1000.0,
        max_ejection_s=spec.max_ejection_time_ms / 1000.0,
        max_ejection_percent=spec.max_ejection_percent,
        success_rate_minimum_hosts=spec.success_rate_minimum_hosts,
        success_rate_request_volume=spec.success_rate_request_volume,
        success_rate_stdev_factor=spec.success_rate_stdev_factor,
        failure_percentage_threshold=spec.failure_percentage_threshold,
        failure_percentage_minimum_hosts=spec.failure_percentage_minimum_hosts,
        failure_percentage_request_volume=spec.failure_percentage_request_volume,
        stall_timeout_s=spec.stall_timeout_ms / 1000.0,
    )
