"""The director: one request's way from parsed body to chosen endpoint, and back.

``Director.route`` runs, synchronously and without I/O (reference anchors, section A,
"Director order"):

1. resolve the model: public name → pool, target model (weighted) and priority;
2. admission: the configured :class:`Admission` may reject (shed) the request;
3. candidates: the pool's endpoints that are not ejected, serve the target model (when
   known) and have fresh metrics (stale ones are dropped unless all are stale — stale is
   never idle);
4. data producers, then the scheduler (filters → scorers → picker);
5. pre-request hooks, in-flight accounting, and the body rewritten for the target model.

It returns a :class:`Dispatch` the proxy (standalone gateway, Envoy ext_proc or the
discrete-event simulation) drives through the request's life: first byte, retries on the
next endpoint, completion. Every path releases what it charged, so in-flight counts never
drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore, Pool
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.requestcontrol.errors import GatewayError, no_endpoint, shed, unknown_model
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import ParsedRequest
from sluicegate.scheduling.config import BuiltScheduler
from sluicegate.scheduling.framework import (
    RESPONSE_HEADERS,
    CycleState,
    LLMRequest,
    SchedulingError,
)
from sluicegate.scheduling.plugins.prefix_cache import PREFIX_MATCH

# Expected output when the request sets no max_tokens: 1.5 × the prompt, as the anchor's
# in-flight load producer estimates it (section D), capped.
_OUTPUT_RATIO = 1.5
_MAX_OUTPUT_ESTIMATE = 4096


class Admission(Protocol):
    """Decides whether a request may be scheduled now; raises GatewayError to shed it."""

    def admit(self, request: LLMRequest, pool: Pool, candidates: Sequence[Endpoint]) -> None: ...


class AdmitAll:
    """No admission control."""

    def admit(self, request: LLMRequest, pool: Pool, candidates: Sequence[Endpoint]) -> None:
        return None


@dataclass(slots=True, eq=False)
class Dispatch:
    """One routed request. Times are clock seconds."""

    request: LLMRequest
    state: CycleState
    pool: Pool
    endpoint: Endpoint
    fallbacks: list[Endpoint]
    body: bytes | None
    """Request body to send upstream when it differs from the client's (``model``
    rewritten to the target); None to send the client's body unchanged."""
    dispatched_at: float
    response_headers: dict[str, str] = field(default_factory=dict)
    attempts: int = 1
    first_byte_at: float | None = None
    finished_at: float | None = None
    _charged_prompt: int = 0
    _charged_decode: int = 0
    _released_prompt: bool = False
    _holding: bool = False
    """Whether ``endpoint``'s in-flight counters currently carry this request."""

    @property
    def rewrites_model(self) -> bool:
        return self.request.target_model != self.request.model

    def _charge(self) -> None:
        match = self.state.get(PREFIX_MATCH)
        cached_share = match.score(self.endpoint.name) if match is not None else 0.0
        self._charged_prompt = round(self.request.prompt_tokens * (1.0 - cached_share))
        max_tokens = self.request.max_tokens
        self._charged_decode = (
            max_tokens
            if max_tokens is not None
            else min(_MAX_OUTPUT_ESTIMATE, round(self.request.prompt_tokens * _OUTPUT_RATIO))
        )
        self._released_prompt = False
        self.endpoint.inflight.dispatch(self._charged_prompt, self._charged_decode)
        self._holding = True

    def _release(self) -> None:
        if not self._holding:
            return
        self._holding = False
        prompt_left = 0 if self._released_prompt else self._charged_prompt
        self.endpoint.inflight.complete(prompt_left, self._charged_decode)

    def mark_first_byte(self, now: float) -> None:
        """The upstream answered: its prefill is done (prompt tokens leave the queue)."""
        if self.first_byte_at is None:
            self.first_byte_at = now
            if self._holding:  # after finish() everything is released already
                self.endpoint.inflight.first_token(self._charged_prompt)
                self._released_prompt = True

    def has_fallback(self) -> bool:
        """Whether a retry has somewhere to go."""
        return any(not e.health.ejected for e in self.fallbacks)

    def retry_next(self) -> Endpoint | None:
        """Move to the next fallback after a failure before the first byte, or None."""
        if self.finished_at is not None or self.first_byte_at is not None:
            return None
        self._release()
        while self.fallbacks:
            candidate = self.fallbacks.pop(0)
            if not candidate.health.ejected:
                self.endpoint = candidate
                self.attempts += 1
                self._charge()
                return candidate
        return None  # nothing left: the caller answers the failure

    def finish(self, now: float) -> None:
        """The request is over (success, failure or cancellation); release its charges."""
        if self.finished_at is not None:
            return
        self.finished_at = now
        self._release()


class Director:
    """Routes requests for every pool of a :class:`Datastore`."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: BuiltScheduler,
        models: ModelTable,
        clock: Clock,
        staleness_s: float = 1.0,
        admission: Admission | None = None,
    ) -> None:
        self.datastore = datastore
        self.built = scheduler
        self.models = models
        self.clock = clock
        self.staleness_s = staleness_s
        self.admission: Admission = admission or AdmitAll()
        datastore.on_removed(self._forget_endpoint)

    def _forget_endpoint(self, endpoint: Endpoint) -> None:
        for observer in self.built.observers:
            observer.forget_endpoint(endpoint)

    def route(
        self, parsed: ParsedRequest, request_id: str, headers: Mapping[str, str] | None = None
    ) -> Dispatch:
        """Choose an endpoint for ``parsed``; raises GatewayError when it is answered here."""
        now = self.clock.now()
        model_route = self.models.route(parsed.model)
        pool_name = model_route.pool if model_route is not None else self.models.default_pool
        if pool_name is None:
            raise unknown_model(parsed.model)
        if pool_name not in self.datastore.pools:
            raise no_endpoint(f"pool '{pool_name}' has no endpoints")
        pool = self.datastore.pools[pool_name]
        if parsed.model_rewrite:
            target = parsed.model_rewrite
        elif model_route is not None:
            target = model_route.next_target()
        else:
            target = parsed.model
        ready = [e for e in pool.endpoints if not e.health.ejected]
        serving = self._serving(ready, target)
        if serving is None:
            if model_route is None and not parsed.model_rewrite:
                raise unknown_model(parsed.model)
            raise no_endpoint(f"no ready endpoint serves model '{target}'")
        is_adapter = any(target in e.models.adapters for e in serving)
        request = LLMRequest(
            request_id=request_id,
            model=parsed.model,
            target_model=target,
            prompt=parsed.prompt,
            prompt_tokens=parsed.prompt_tokens,
            arrival=now,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            is_adapter=is_adapter,
            priority=self.models.priority(model_route, parsed.objective),
            fairness_id=parsed.fairness_id,
            objective=parsed.objective,
            slo_ttft_ms=parsed.slo_ttft_ms,
            slo_tpot_ms=parsed.slo_tpot_ms,
            cache_salt=parsed.cache_salt,
            headers=headers or {},
            body_bytes=parsed.body_bytes,
        )
        candidates = self._fresh(serving, now)
        self.admission.admit(request, pool, candidates)
        if not candidates:
            if request.sheddable:
                raise shed("no endpoint available for a sheddable request")
            raise no_endpoint()
        return self.schedule(request, pool, candidates, parsed)

    def schedule(
        self,
        request: LLMRequest,
        pool: Pool,
        candidates: Sequence[Endpoint],
        parsed: ParsedRequest,
    ) -> Dispatch:
        """Run producers and the scheduler for an admitted request and dispatch it."""
        state = CycleState()
        scheduler = self.built.scheduler
        scheduler.prepare(request, state, candidates)
        try:
            result = scheduler.schedule(request, state, candidates)
        except SchedulingError as exc:
            # Every candidate was filtered out: a deliberate refusal (anchors A: 429).
            raise shed(
                f"failed to find target endpoint: {exc}", reason="rejected-no-endpoint"
            ) from None
        scheduler.notify_pre_request(request, state, result)
        targets = result.targets
        scores = result.profile_results[result.primary_profile].scores
        # Retries go to the endpoints the profile's filters kept, best score first.
        rest = sorted(
            (e for e in candidates if e.name in scores and e not in targets),
            key=lambda e: scores[e.name],
            reverse=True,
        )
        dispatch = Dispatch(
            request=request,
            state=state,
            pool=pool,
            endpoint=targets[0],
            fallbacks=targets[1:] + rest,
            body=_rewritten_body(parsed, request.target_model),
            dispatched_at=self.clock.now(),
            response_headers=_response_headers(state),
        )
        dispatch._charge()
        return dispatch

    def _serving(self, endpoints: list[Endpoint], target: str) -> list[Endpoint] | None:
        """Endpoints that serve ``target``; all of them if none has listed its models yet.

        None when every endpoint has listed its models and none serves ``target``.
        """
        if not endpoints:
            return []
        known = [e for e in endpoints if e.models.known]
        if not known:
            return endpoints
        serving = [e for e in endpoints if not e.models.known or e.models.serves(target)]
        return serving or None

    def _fresh(self, endpoints: list[Endpoint], now: float) -> list[Endpoint]:
        fresh = [e for e in endpoints if not e.is_stale(now, self.staleness_s)]
        return fresh or endpoints


def _response_headers(state: CycleState) -> dict[str, str]:
    headers = state.get(RESPONSE_HEADERS)
    return dict(headers) if headers else {}


def _rewritten_body(parsed: ParsedRequest, target: str) -> bytes | None:
    if target == parsed.model:
        return None
    body = dict(parsed.body)
    body["model"] = target
    return orjson.dumps(body)


__all__ = ["Admission", "AdmitAll", "Director", "Dispatch", "GatewayError"]
