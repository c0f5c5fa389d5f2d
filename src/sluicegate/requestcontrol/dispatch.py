"""One routed request and what it charges to its endpoint.

A :class:`Dispatch` is what the director hands the proxy (the standalone gateway, the Envoy
endpoint picker, or the discrete-event simulation): the chosen endpoint, ordered fallbacks,
the body to send, and the in-flight load charged to the endpoint. The proxy drives it
through the request's life — first byte, retries on the next endpoint, completion — and
every path releases exactly what it charged, so in-flight counts never drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sluicegate.datalayer.datastore import Pool
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    PREFIX_MATCH,
    CycleState,
    LLMRequest,
    ResponseObserver,
    ResponseOutcome,
)


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
    reported_attempt: int = 0
    """The last attempt whose result was reported to the outlier detector (each attempt is
    reported once: by the proxy, or, for hosts without one, by ``Runtime.release``)."""
    first_byte_at: float | None = None
    finished_at: float | None = None
    _charged_prompt: int = 0
    _charged_decode: int = 0
    _released_prompt: bool = False
    _epoch: int = 0
    """The endpoint's token epoch when the request was queued there (``InFlight``)."""
    _counter_at_dispatch: float | None = None
    """The endpoint's generated-token counter in its last scrape when the request was
    dispatched there (``InFlight.relayed``)."""
    _holding: bool = False
    """Whether ``endpoint``'s in-flight counters currently carry this request."""
    observers: Sequence[ResponseObserver] = ()
    """Plugins told of the first byte and the end (e.g. to train latency models)."""

    @property
    def rewrites_model(self) -> bool:
        return self.request.target_model != self.request.model

    def _charge(self) -> None:
        match = self.state.get(PREFIX_MATCH)
        cached_share = match.score(self.endpoint.name) if match is not None else 0.0
        self._charged_prompt = round(self.request.prompt_tokens * (1.0 - cached_share))
        self._charged_decode = self.request.expected_output_tokens
        self._released_prompt = False
        inflight = self.endpoint.inflight
        inflight.dispatch(self._charged_prompt, self._charged_decode)
        self._epoch = inflight.prefill_queued(self.request.prompt_tokens)
        metrics = self.endpoint.metrics
        self._counter_at_dispatch = metrics.generation_tokens if metrics is not None else None
        self._holding = True

    def _release(self) -> None:
        if not self._holding:
            return
        self._holding = False
        inflight = self.endpoint.inflight
        if self._released_prompt:
            inflight.complete(0, self._charged_decode)
        else:
            inflight.complete(self._charged_prompt, self._charged_decode)
            inflight.prefill_done(self.request.prompt_tokens, self._epoch)

    def mark_first_byte(self, now: float, generated: bool = True) -> None:
        """The upstream answered: its prefill is done (prompt tokens leave the queue).
        ``generated``: the answer is a success, so the server generated tokens for it."""
        if generated:
            self.endpoint.inflight.relayed(self._counter_at_dispatch)
        if self.first_byte_at is None:
            self.first_byte_at = now
            self.endpoint.inflight.token(now)
            if self._holding:  # after finish() everything is released already
                self.endpoint.inflight.first_token(self._charged_prompt)
                self.endpoint.inflight.prefill_done(self.request.prompt_tokens, self._epoch)
                self._released_prompt = True
                for observer in self.observers:
                    observer.on_first_token(self.request, self.state, self.endpoint, now)

    def mark_token(self, now: float, generated: bool = True) -> None:
        """A streamed chunk arrived from the endpoint at ``now``: it times the engine's
        iterations for the latency models (``InFlight.token``). ``generated`` as for
        :meth:`mark_first_byte`."""
        if generated:
            self.endpoint.inflight.relayed(self._counter_at_dispatch)
        self.endpoint.inflight.token(now)

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

    def finish(self, now: float, output_tokens: int | None = None, ok: bool = True) -> None:
        """The request is over (success, failure or cancellation): release its charges and
        tell the observers. ``output_tokens`` as the server reported them, if known."""
        if self.finished_at is not None:
            return
        self.finished_at = now
        self._release()
        if self.observers:
            outcome = ResponseOutcome(
                self.endpoint, self.dispatched_at, self.first_byte_at, now, output_tokens, ok
            )
            for observer in self.observers:
                observer.on_complete(self.request, self.state, outcome)
