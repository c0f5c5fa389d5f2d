"""The endpoint picker without its front door: what both hosts share.

A :class:`Runtime` holds the endpoint set and its metrics collector, the scheduler, the
director with flow control, and the exported metrics. Its hosts — the standalone gateway
(:mod:`sluicegate.gateway`, which proxies the request itself) and the Envoy endpoint picker
(:mod:`sluicegate.extproc`, which tells Envoy where to send it) — call :meth:`acquire` with
a parsed request to get a :class:`~sluicegate.requestcontrol.dispatch.Dispatch` (waiting in
flow control when the pool is saturated) and :meth:`release` when the response has ended,
however it ended.

Everything here runs on one event loop; nothing blocks it. What it tells the exported
metrics is in :mod:`~sluicegate.runtime.observe`, what it logs for requests nothing can
serve in :mod:`~sluicegate.runtime.notices`, how requests wait in flow control in
:mod:`~sluicegate.runtime.waiting`. With ``sharedState`` in the GatewayConfig, the
prefix index, in-flight counts and flow control's waiting counts are shared with the other
replicas through Redis (:mod:`~sluicegate.runtime.shared` and
:mod:`~sluicegate.runtime.shared_backlog`, loaded only then; ``docs/replicas.md``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluicegate.api.loader import Config
from sluicegate.builtins import default_registry
from sluicegate.clock import Clock, MonotonicClock
from sluicegate.datalayer.collector import Collector, CollectorSettings
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.kvevents.service import KV_EVENTS_SERVICE
from sluicegate.datalayer.outlier import OutlierDetector, Result, classify_status
from sluicegate.datalayer.pools import EndpointsByPool, static_endpoints, sync_pools
from sluicegate.datalayer.sharing import SHARED_PREFIX_SERVICE
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import FlowControlSetup, build_flow_control
from sluicegate.framework import PREDICTION_OUTCOME, PREDICTOR_SERVICE, PluginContext, QueueItem
from sluicegate.latency.host import PredictorHost
from sluicegate.metrics import GatewayMetrics
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import ParsedRequest
from sluicegate.requestcontrol.responses import Usage as Usage  # re-exported
from sluicegate.runtime.kvevents import KVEventsCollector, KVEventsHost
from sluicegate.runtime.notices import Notices, mixed_hardware_pools
from sluicegate.runtime.observe import RequestMetrics, flow_state, prefix_index_size, time_plugins
from sluicegate.runtime.outliers import outlier_settings, tick
from sluicegate.runtime.tokenization import TokenizerCollector, TokenizersHost
from sluicegate.runtime.waiting import FlowWaits
from sluicegate.scheduling.config import BuiltScheduler, build_scheduler
from sluicegate.tokenization.base import TOKENIZER_SERVICE, PoolTokenizer, TokenizerService
from sluicegate.upstream import UpstreamPool

if TYPE_CHECKING:
    from sluicegate.runtime.shared import SharedState
    from sluicegate.runtime.shared_backlog import BacklogSync

log = logging.getLogger("sluicegate.runtime")


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
        self.kv_events = KVEventsHost(self.clock)
        """The servers' KV-cache event streams (idle unless a pool has ``kvEvents``)."""
        self._services.setdefault(KV_EVENTS_SERVICE, self.kv_events.service)
        self.tokenizers = TokenizersHost(config)
        """The pools' tokenizers (none unless a pool's ``spec.tokenizer`` is not builtin)."""
        self._services.setdefault(TOKENIZER_SERVICE, self.tokenizers.service)
        self.staleness_s = config.gateway.metrics_staleness_ms / 1000.0
        self.datastore = Datastore()
        self.shared: SharedState | None = None
        """The link to the other replicas' state (``sharedState``; None: off)."""
        if config.gateway.shared_state is not None:
            self.shared = _shared_state(config, self.datastore)
            if self.shared.share is not None:
                self._services.setdefault(SHARED_PREFIX_SERVICE, self.shared.share)
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
        self.backlog: BacklogSync | None = None
        """Flow control's waiting counts shared with the other replicas (None: off)."""
        if self.shared is not None and self.shared.settings.backlog:
            from sluicegate.runtime.shared_backlog import share_backlog

            self.backlog = share_backlog(self.shared, self.director, self.clock)
        self.metrics = GatewayMetrics(
            self.datastore,
            self.clock,
            self.staleness_s,
            lambda: prefix_index_size(self.built),
            lambda: flow_state(self.director, self.datastore, self.clock.now()),
            names=config.gateway.metrics_names,
        )
        self.observe = RequestMetrics(self.metrics, self.clock)
        """Records each request's way into the metrics."""
        self._waits = FlowWaits(self.director, self.observe, self.clock)
        """Requests waiting in flow control, and the timer at the queue's next deadline."""
        self.director.on_enqueue = self.observe.enqueue
        self.director.on_dispatch_cycle = self.metrics.dispatch_cycle.observe
        time_plugins(self.built, self.metrics)
        if self.predictor is not None:
            self.predictor.register_metrics(self.metrics.registry)
        self.metrics.registry.register(KVEventsCollector(self.kv_events))
        self.metrics.registry.register(TokenizerCollector(self.tokenizers.service))
        if self.shared is not None:
            from sluicegate.runtime.shared_metrics import PeerYieldCollector, SharedStateCollector

            self.metrics.registry.register(SharedStateCollector(self.shared))
            if self.backlog is not None:
                director = self.director
                collector = PeerYieldCollector(
                    self.backlog, lambda: director.peer_yield, self.clock
                )
                self.metrics.registry.register(collector)
        self.collector: Collector | None = None
        self.outlier: OutlierDetector | None = None
        """Ejects endpoints whose requests fail (None when ``outlierDetection`` is off)."""
        self._outlier_task: asyncio.Task[None] | None = None
        self._discovered: EndpointsByPool | None = None
        self._notices = Notices()
        sync_pools(self.datastore, config, static_endpoints(config))
        self.kv_events.request_sync(config, self.datastore)

    # ------------------------------------------------------------------ lifecycle

    def _context(self) -> PluginContext:
        return PluginContext(self.clock, self.options.seed, services=self._services)

    def _build_scheduler(self, config: Config) -> BuiltScheduler:
        return build_scheduler(config.picker, self._context(), self.registry)

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
        if self.kv_events.active:
            self.collector.on_scrape.append(self.kv_events.on_scrape)
        self.kv_events.start()
        self.collector.on_models.append(self._on_models)
        self.collector.on_eject.append(self.metrics.endpoint_ejected)
        self.collector.start()
        if self.shared is not None:
            self.shared.start()
        if self.backlog is not None:
            self.backlog.start()
        if settings.outlier_detection.enabled:
            self.outlier = OutlierDetector(
                self.datastore, self.clock, outlier_settings(settings.outlier_detection)
            )
            self.outlier.on_eject.append(self.metrics.endpoint_ejected)
            self.collector.on_reachable.append(self.outlier.reachable_again)
            self._outlier_task = asyncio.create_task(tick(self.outlier), name="outlier")
        self._notices.empty_pools(self.datastore, self.config)
        self._notices.mixed_hardware(self.datastore, self.built.hardware_aware)

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
        self._waits.stop()
        if self.collector is not None:
            await self.collector.stop()
            self.collector = None
        if self.predictor is not None:
            await self.predictor.stop()
        await self.kv_events.stop()
        await self.tokenizers.stop()
        if self.backlog is not None:
            await self.backlog.stop()
        if self.shared is not None:
            await self.shared.stop()

    async def reload(self, config: Config, endpoints: EndpointsByPool | None = None) -> None:
        """:meth:`apply_config` with the pools' tokenizers built first in a worker thread
        (reading ``tokenizer.json`` and checking it takes up to seconds): the event loop
        keeps serving meanwhile. Raises as :meth:`apply_config`."""
        tokenizers = await asyncio.to_thread(self.tokenizers.prepare, config)
        self.apply_config(config, endpoints, tokenizers)

    def apply_config(
        self,
        config: Config,
        endpoints: EndpointsByPool | None = None,
        tokenizers: dict[str, PoolTokenizer] | None = None,
    ) -> None:
        """Switch to ``config`` (and, from discovery, ``endpoints`` by pool) without dropping
        requests in flight.

        Without ``endpoints`` the pools' endpoints are the configuration's static lists, or
        the last ones discovery delivered. Endpoints that stay keep their state; the
        scheduler is rebuilt only when the EndpointPickerConfig changed (rebuilding starts
        its prefix index afresh). Raises (changing nothing) when the new scheduler cannot
        be built. ``tokenizers``: the pools' tokenizers already built for ``config``
        (:meth:`reload`); else they are built here, on the caller's thread.
        """
        old_picker, new_picker = self.config.picker, config.picker
        same = (old_picker.model_dump() if old_picker else None) == (
            new_picker.model_dump() if new_picker else None
        )
        # Build everything that can fail before changing anything. The scheduler is
        # rebuilt too when a pool's tokenizer starts or stops needing I/O (which
        # producers prefetch is decided when it is built).
        if tokenizers is None:
            tokenizers = self.tokenizers.prepare(config)
        service = self.tokenizers.service
        old_tokenizers = service.pools
        service.pools = tokenizers
        same = same and service.fetching == TokenizerService(old_tokenizers).fetching
        try:
            built = self.built if same else self._build_scheduler(config)
            flow = self.director.flow if same else self._build_flow(config, built)
        finally:
            service.pools = old_tokenizers
        models = ModelTable(config)
        new_predictor = config.gateway.latency_predictor
        live = {"prediction_based_scheduling_default"}  # read per request: applied now
        old_predictor = self.config.gateway.latency_predictor
        if new_predictor.model_dump(exclude=live) != old_predictor.model_dump(exclude=live):
            log.warning("latencyPredictor changes take effect at the next restart")
        if config.gateway.shared_state != self.config.gateway.shared_state:
            log.warning("sharedState changes take effect at the next restart")
        if endpoints is not None:
            self._discovered = endpoints
        if self.outlier is not None:  # thresholds apply now; turning it on or off: restart
            self.outlier.settings = outlier_settings(config.gateway.outlier_detection)
        self.config = config
        self.tokenizers.apply(tokenizers)
        self.director.models = models
        self.director.prediction_default = new_predictor.prediction_based_scheduling_default
        discovered = self._discovered is not None
        sync_pools(
            self.datastore,
            config,
            self._discovered if self._discovered is not None else static_endpoints(config),
            discovered=discovered,
        )
        was_active = self.kv_events.active
        self.kv_events.request_sync(config, self.datastore)
        if self.collector is not None and self.kv_events.active and not was_active:
            self.collector.on_scrape.append(self.kv_events.on_scrape)
        if not same:
            time_plugins(built, self.metrics)
        self.metrics.names = config.gateway.metrics_names
        self.built = self.director.built = built
        self.director.set_flow(flow)
        self._notices.reloaded()
        self.director.reject_unservable()
        if not discovered and self.collector is not None:  # started: a reload of the file
            self._notices.empty_pools(self.datastore, self.config)
        if self.collector is not None:
            self._notices.mixed_hardware(self.datastore, built.hardware_aware)
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
            ticket = self._waits.ticket(admitted.pool.name)
            result = self.director.submit(admitted, ticket, state)
            if isinstance(result, QueueItem):
                at_once = ticket.future.done()  # dispatched without waiting (or refused)
                dispatch = await self._waits.wait(result, ticket)
                if at_once:
                    metrics.scheduler_duration.observe(time.perf_counter() - started)
            else:
                dispatch = result
                metrics.scheduler_duration.observe(time.perf_counter() - started)
        except GatewayError as exc:
            self.observe.refused(exc, self.director.models, parsed.model)
            if exc.detail:
                self._notices.refusal(exc)
            raise
        self.observe.dispatched(dispatch)
        outcome = dispatch.state.get(PREDICTION_OUTCOME)
        if outcome is not None:
            self.observe.prediction(dispatch, outcome)
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
        self.observe.ended(dispatch, status, ok, usage)
        if self.director.controllers():
            self.director.pump()  # its place may be someone else's now
            self._waits.arm()

    def ready_endpoints(self) -> int:
        """Endpoints that can take traffic now (not ejected, metrics fresh)."""
        now = self.clock.now()
        return sum(
            1
            for e in self.datastore.all_endpoints()
            if not e.health.ejected and not e.is_stale(now, self.staleness_s)
        )

    def _on_models(self, endpoint: Endpoint) -> None:
        """A served-model list changed: queued requests for a target no endpoint lists
        any more are answered now."""
        if self.director.waiting_requests():
            self.director.reject_unservable()

    def empty_pools(self) -> list[str]:
        """Pools with no endpoint at all (none configured or discovered), by name."""
        return sorted(name for name, pool in self.datastore.pools.items() if not pool.endpoints)

    def mixed_hardware(self) -> list[dict[str, object]]:
        """For ``/health``: pools mixing hardware classes under a hardware-blind
        scheduler, each with its classes (empty when the scheduler is hardware-aware)."""
        if self.built.hardware_aware:
            return []
        return [{"pool": p, "classes": c} for p, c in mixed_hardware_pools(self.datastore)]

    def _on_scrape(self, endpoint: Endpoint) -> None:
        """Fresh metrics may show room for waiting requests."""
        if self.director.controllers():
            self.director.pump()


def _shared_state(config: Config, datastore: Datastore) -> SharedState:
    """The shared-state link ``config`` asks for; a clear error without the Redis client."""
    settings = config.gateway.shared_state
    assert settings is not None
    try:
        from sluicegate.runtime.shared import SharedState
    except ImportError as exc:
        raise RuntimeError(
            "sharedState needs the Redis client: install sluicegate[redis] (the 'redis' "
            f"package): {exc}"
        ) from exc
    return SharedState(settings, datastore)


__all__ = ["Runtime", "RuntimeOptions", "Usage", "outlier_settings"]
