"""The director: one request's way from parsed body to chosen endpoint.

Synchronous and free of I/O, in the order of GIE's director (at 1748e829,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/requestcontrol/director.go):

1. :meth:`Director.admit` resolves the model — public name → pool, target model (weighted),
   priority — and builds the scheduling view of the request. A request no endpoint can
   serve is a 503 here, queueing or not: its pool has no endpoints, or every endpoint has
   listed its models and none lists the target (until the first listing, nothing is
   known and the request goes on);
2. :meth:`Director.submit` runs the admitters, then admission control:
   - flow control off for the pool: a sheddable request is refused (429) when the pool is
     saturated; everything else is scheduled at once;
   - flow control on: sheddable requests are refused when saturated, the rest queue in
     priority bands and leave as soon as an endpoint they may use has room;
3. candidates: the pool's endpoints that are not ejected, serve the target model (when
   known), have fresh metrics (stale ones are dropped unless all are stale) and — with flow
   control — have room;
4. data producers, the scheduler (filters → scorers → picker), pre-request hooks, in-flight
   accounting, and the body rewritten for the target model: a :class:`Dispatch`.

A request that waits is handed back through the :class:`Ticket` it was submitted with:
``dispatched`` when it leaves the queue, ``rejected`` when it cannot be served (time to
live, no endpoint). :meth:`Director.pump` must be called whenever room may have appeared
(a request finished, fresh metrics arrived), :meth:`Director.expire` at
:meth:`Director.next_deadline`, and :meth:`Director.reject_unservable` when the endpoint set
or a served-model list changed (queued requests nothing can serve any more are answered
503 at once instead of waiting out their time to live).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore, Pool
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.errors import GatewayError, bad_request, no_endpoint, shed, unknown_model
from sluicegate.flowcontrol.config import FlowControlSetup, build_flow_control
from sluicegate.flowcontrol.controller import FlowController
from sluicegate.flowcontrol.peers import PeerYield
from sluicegate.framework import (
    PREFETCH_PASS,
    RESPONSE_HEADERS,
    Admitter,
    CycleState,
    LLMRequest,
    PluginContext,
    QueueItem,
    SchedulingError,
)
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.jsonbytes import replace_top_level_string
from sluicegate.requestcontrol.models import ModelRoute, ModelTable
from sluicegate.requestcontrol.parse import ParsedRequest
from sluicegate.requestcontrol.refusals import empty_pool, never_served, not_served
from sluicegate.requestcontrol.waiting import Waiting, WaitingRoom
from sluicegate.scheduling.config import BuiltScheduler


@dataclass(slots=True)
class Admitted:
    """A request whose model resolved: what it is and which pool serves it."""

    request: LLMRequest
    pool: Pool
    parsed: ParsedRequest
    resolved_by_config: bool
    """True when an InferenceModel or the rewrite header named the target."""
    subset: frozenset[str] | None = None
    """``host:port`` addresses the request may go to (the proxy's subset hint), or None
    for any endpoint of the pool."""
    serving: list[Endpoint] | None = None
    """The endpoints serving the target model as admission found them, handed to the
    first :meth:`Director.candidates` call (scheduled at once, that is in the same
    event-loop step) and then dropped: later calls look again."""
    rewrite: ModelRoute | None = None
    """The InferenceModelRewrite route that chose the target, if one did."""


class Ticket(Protocol):
    """Whoever waits for a queued request: told exactly once how it went."""

    def dispatched(self, item: QueueItem, dispatch: Dispatch) -> None:
        """``item`` left the queue with an endpoint; the dispatch is the ticket holder's."""
        ...

    def rejected(self, item: QueueItem, error: GatewayError) -> None:
        """``item`` cannot be served (its time to live ran out, no endpoint is left)."""
        ...


class Director:
    """Routes requests for every pool of a :class:`Datastore`."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: BuiltScheduler,
        models: ModelTable,
        clock: Clock,
        staleness_s: float = 1.0,
        admitters: Sequence[Admitter] = (),
        flow: FlowControlSetup | None = None,
        prediction_default: bool = True,
    ) -> None:
        self.datastore = datastore
        self.prediction_default = prediction_default
        """Whether requests without an ``x-prediction-based-scheduling`` header are
        scheduled on latency predictions."""
        self.built = scheduler
        self.models = models
        self.clock = clock
        self.staleness_s = staleness_s
        self.admitters = list(admitters)
        self.flow = flow or build_flow_control(
            None, scheduler.plugins, PluginContext(clock), scheduler.registry
        )
        self._room = WaitingRoom()
        self.on_enqueue: Callable[[Admitted, str | None, float], None] | None = None
        """Told of each request flow control admitted to a queue (reason None) or refused
        (the GatewayError's reason), with the time it took (s), for metrics."""
        self.on_dispatch_cycle: Callable[[float], None] | None = None
        """Told how long each :meth:`pump` took (s), for metrics."""
        self.peer_yield: PeerYield | None = None
        """With other gateway replicas: the rule by which waiting requests hold for their
        higher bands (None: this replica dispatches on its own)."""
        datastore.on_removed(self._forget_endpoint)

    def _forget_endpoint(self, endpoint: Endpoint) -> None:
        for observer in self.built.observers:
            observer.forget_endpoint(endpoint)

    # ------------------------------------------------------------------ admission

    def admit(
        self,
        parsed: ParsedRequest,
        request_id: str,
        headers: Mapping[str, str] | None = None,
        subset: Collection[str] | None = None,
    ) -> Admitted:
        """Resolve the model; raises 404 for a model nothing serves, 503 for a pool without
        endpoints, a configured target every endpoint has listed its models without, or a
        ``subset`` (allowed ``host:port`` addresses) that names none of the pool's endpoints.
        """
        now = self.clock.now()
        # A model-less request (a passed-through route) has no model to route or rewrite.
        model_route = self.models.route(parsed.model) if parsed.model else None
        pool_name = model_route.pool if model_route is not None else self.models.default_pool
        if pool_name is None:
            if not parsed.model:  # a passed-through route without a model
                raise bad_request(
                    "this request names no 'model' and the gateway fronts several pools: "
                    "say which model it is for",
                    "model",
                )
            raise unknown_model(parsed.model)
        pool = self.datastore.pools.get(pool_name)
        if pool is None or not pool.endpoints:
            # Nothing can serve it until the endpoint set changes: answered now, even
            # with flow control (a queued request would only wait out its TTL).
            raise empty_pool(pool_name, pool)
        allowed = None if subset is None else frozenset(subset)
        if allowed is not None and not any(e.address in allowed for e in pool.endpoints):
            raise no_endpoint(
                "the endpoint subset hint is empty"
                if not allowed
                else f"no endpoint of pool '{pool_name}' is in the endpoint subset hint"
            )
        # An InferenceModelRewrite rule beats the trusted rewrite header, which beats an
        # InferenceModel's targets (GIE at 1748e829: pkg/epp/handlers/request.go takes
        # the header, then pkg/epp/requestcontrol/director.go applies a matching rule).
        rewrite = model_route if model_route is not None and model_route.rewrite else None
        if rewrite is not None:
            target = rewrite.next_target()
        elif parsed.model_rewrite:
            target = parsed.model_rewrite
        elif model_route is not None:
            target = model_route.next_target()
        else:
            target = parsed.model
        by_config = model_route is not None or bool(parsed.model_rewrite)
        # A model-less request (a passed-through route) may go to any ready endpoint.
        serving = self._serving(pool, target) if target else self._ready(pool)
        if serving is None:
            if not by_config:
                raise unknown_model(parsed.model)
            if target and never_served(pool, target):
                raise not_served(pool, parsed.model, target)
        request = LLMRequest(
            request_id=request_id,
            model=parsed.model,
            target_model=target,
            prompt=parsed.prompt,
            prompt_tokens=parsed.prompt_tokens,
            arrival=now,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            is_adapter=any(target in e.models.adapters for e in serving or ()),
            priority=self.models.priority(model_route, parsed.objective),
            fairness_id=parsed.fairness_id,
            objective=parsed.objective,
            slo_ttft_ms=parsed.slo_ttft_ms,
            slo_tpot_ms=parsed.slo_tpot_ms,
            cache_salt=parsed.cache_salt,
            headers=headers or {},
            body_bytes=parsed.body_bytes,
            model_label=self.models.label(parsed.model),
            prediction_based=(
                self.prediction_default
                if parsed.prediction_based is None
                else parsed.prediction_based
            ),
            kind=parsed.kind,
            body=parsed.body,
        )
        return Admitted(request, pool, parsed, by_config, allowed, serving or [], rewrite)

    def submit(
        self, admitted: Admitted, ticket: Ticket | None = None, state: CycleState | None = None
    ) -> Dispatch | QueueItem:
        """Schedule now (a Dispatch), or queue (a QueueItem, reported later to ``ticket`` —
        possibly before this returns); raises GatewayError when refused. A pool with flow
        control needs a ``ticket``.

        ``state`` carries what the scheduler's fetchers prefetched (see
        :meth:`prefetch`); the data producers run again over it.
        """
        request, pool = admitted.request, admitted.pool
        now = self.clock.now()
        candidates = self.candidates(admitted, now)
        state = CycleState() if state is None else state
        self.built.scheduler.prepare(request, state, candidates)
        for admitter in (*self.built.admitters, *self.admitters):
            admitter.admit(request, state, candidates)
        flow = self.flow
        ceiling = flow.usage_limit.ceiling(request.priority)
        if request.sheddable and flow.detector.saturation(candidates, now) >= ceiling:
            raise shed("system saturated, sheddable request dropped")
        controller = self._room.controller(pool, flow)
        if controller is None:
            if not candidates:
                # The client's name: the target is the gateway's business (and may be
                # an adapter the client was never told of).
                raise no_endpoint(
                    f"no ready endpoint serves model '{request.model}'"
                    if request.model
                    else f"pool '{pool.name}' has no ready endpoint"
                )
            return self.schedule(admitted, candidates, state)
        if ticket is None:
            raise RuntimeError(f"pool '{pool.name}' queues requests: submit() needs a ticket")
        started = time.perf_counter()
        try:
            item = controller.enqueue(request, now)
        except GatewayError as exc:
            if self.on_enqueue is not None:
                self.on_enqueue(admitted, exc.reason, time.perf_counter() - started)
            raise
        if self.on_enqueue is not None:
            self.on_enqueue(admitted, None, time.perf_counter() - started)
        self._room.add(item, Waiting(admitted, ticket, state))
        self.pump(now)
        return item

    async def prefetch(self, admitted: Admitted) -> CycleState | None:
        """Await the I/O-bound data producers (e.g. a remote latency predictor) for
        ``admitted``; the state to pass to :meth:`submit`, or None when there are none.

        Only the fetchers that fetch for this request and pool run (none: None, and
        nothing runs twice). The synchronous producers run first, with
        :data:`~sluicegate.framework.PREFETCH_PASS` set, so the fetchers see their output
        (the prefix-cache match), and run again in :meth:`submit`, the pass that counts.
        """
        request = admitted.request
        pool = admitted.pool.name
        fetchers = [f for f in self.built.fetchers if f.fetches_for(request, pool)]
        if not fetchers:
            return None
        candidates = self.candidates(admitted, self.clock.now())
        state = CycleState()
        if candidates:
            state.put(PREFETCH_PASS, True)
            self.built.scheduler.prepare(request, state, candidates)
            for fetcher in fetchers:
                await fetcher.prefetch(request, state, candidates)
            state.discard(PREFETCH_PASS)
        return state

    def route(
        self, parsed: ParsedRequest, request_id: str, headers: Mapping[str, str] | None = None
    ) -> Dispatch:
        """Admit and schedule at once, for pools without flow control."""
        result = self.submit(self.admit(parsed, request_id, headers))
        if isinstance(result, QueueItem):
            raise RuntimeError("route() is for pools without flow control; use submit()")
        return result

    # ------------------------------------------------------------------ flow control

    def set_flow(self, flow: FlowControlSetup) -> None:
        """Switch to new flow-control settings; requests already waiting stay queued."""
        self.flow = flow
        self._room.set_flow(flow)

    def pump(self, now: float | None = None) -> int:
        """Dispatch every waiting request that now has room; returns how many left."""
        if not self._room.controllers():
            return 0
        started = time.perf_counter()
        now = self.clock.now() if now is None else now
        left = self._room.pump(
            self.flow, now, self.candidates, self._dispatch_queued, self.peer_yield
        )
        if self.on_dispatch_cycle is not None:
            self.on_dispatch_cycle(time.perf_counter() - started)
        return left

    def _dispatch_queued(self, item: QueueItem, entry: Waiting) -> Dispatch | GatewayError:
        """Schedule a request leaving the queue over the endpoints with room now: its
        Dispatch, or the refusal to hand its ticket."""
        # The producers run again over them; what was prefetched at admission (remote
        # predictions) stays in the state.
        state = entry.state
        if state is not None:
            self.built.scheduler.prepare(item.request, state, entry.candidates)
        try:
            return self.schedule(entry.admitted, entry.candidates, state)
        except GatewayError as exc:
            return exc

    def expire(self, now: float | None = None) -> int:
        """Answer requests whose time to live ran out (503); returns how many."""
        return self._room.expire(self.clock.now() if now is None else now)

    def cancel(self, item: QueueItem) -> bool:
        """Forget a waiting request whose client went away (its ticket is not told);
        False when it already left the queue."""
        return self._room.cancel(item)

    def reject_unservable(self) -> int:
        """Answer at once (503) every waiting request no endpoint can serve any more: its
        pool has no endpoints left, or every endpoint lists its models and none has the
        request's target. Call it when the endpoint set or a served-model list changed;
        returns how many were answered."""
        return self._room.reject_unservable(self.datastore.pools)

    def waiting_requests(self) -> int:
        """Requests queued in every pool (each leaves through its ticket or a cancel)."""
        return len(self._room)

    def next_deadline(self) -> float | None:
        """The clock time of the next queue expiry, if any request waits with a TTL."""
        return self._room.next_deadline()

    def controllers(self) -> Mapping[str, FlowController]:
        """Flow controllers by pool name (for metrics)."""
        return self._room.controllers()

    # ------------------------------------------------------------------ scheduling

    def candidates(self, admitted: Admitted, now: float) -> list[Endpoint]:
        """Endpoints that may take the request: not ejected, serving its target model, in
        its subset hint (if any), with fresh metrics (all of them if every one is stale)."""
        serving = admitted.serving
        if serving is None:
            target = admitted.request.target_model
            serving = self._serving(admitted.pool, target) if target else self._ready(admitted.pool)
        else:
            admitted.serving = None
        if serving and admitted.subset is not None:
            allowed = admitted.subset
            serving = [e for e in serving if e.address in allowed]
        if not serving:
            return []
        fresh = [e for e in serving if not e.is_stale(now, self.staleness_s)]
        return fresh or serving

    def schedule(
        self, admitted: Admitted, candidates: Sequence[Endpoint], state: CycleState | None = None
    ) -> Dispatch:
        """Run the scheduler over ``candidates`` and dispatch; the data producers run first
        unless ``state`` already holds their output for these candidates."""
        request = admitted.request
        scheduler = self.built.scheduler
        if state is None:
            state = CycleState()
            scheduler.prepare(request, state, candidates)
        try:
            result = scheduler.schedule(request, state, candidates)
        except SchedulingError as exc:
            # Every candidate was filtered out: a deliberate refusal (429, as GIE's director).
            raise shed(
                f"failed to find target endpoint: {exc}", reason="rejected-no-endpoint"
            ) from None
        scheduler.notify_pre_request(request, state, result)
        targets = result.targets
        scores = result.profile_results[result.primary_profile].scores
        # Retries go to the endpoints the profile's filters kept, best score first.
        rest = [e for e in candidates if e not in targets and e.name in scores]
        if len(rest) > 1:
            rest.sort(key=lambda e: scores[e.name], reverse=True)
        dispatch = Dispatch(
            request=request,
            state=state,
            pool=admitted.pool,
            endpoint=targets[0],
            fallbacks=targets[1:] + rest,
            body=_rewritten_body(admitted.parsed, request.target_model),
            dispatched_at=self.clock.now(),
            response_headers=_response_headers(state),
            observers=self.built.response_observers,
        )
        dispatch._charge()
        return dispatch

    @staticmethod
    def _ready(pool: Pool) -> list[Endpoint]:
        """The pool's endpoints that are not ejected."""
        return [e for e in pool.endpoints if not e.health.ejected]

    def _serving(self, pool: Pool, target: str) -> list[Endpoint] | None:
        """Ready endpoints that serve ``target``; all of them if none has listed its models.

        None when every endpoint has listed its models and none serves ``target``; an
        empty list when the pool has no ready endpoint.
        """
        ready = self._ready(pool)
        if not ready or not any(e.models.known for e in ready):
            return ready
        serving = [e for e in ready if not e.models.known or e.models.serves(target)]
        return serving or None


def _response_headers(state: CycleState) -> dict[str, str]:
    headers = state.get(RESPONSE_HEADERS)
    return dict(headers) if headers else {}


def _rewritten_body(parsed: ParsedRequest, target: str) -> bytes | None:
    """The body as sent with its top-level ``model`` set to ``target`` (None when
    unchanged). Only those bytes change: big integers and every other field go upstream
    exactly as the client wrote them."""
    if target == parsed.model:
        return None
    return replace_top_level_string(parsed.raw, "model", target)


__all__ = ["Admitted", "Director", "Dispatch", "GatewayError", "Ticket"]
