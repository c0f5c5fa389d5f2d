"""Forwarding a routed request to its endpoint, and the answer back to the client.

- Streaming answers are passed through chunk by chunk as they arrive; nothing is buffered
  except, when the model name must be rewritten back, the tail of an incomplete SSE event.
- Non-streaming answers are read whole, so a failure anywhere before the client has seen a
  byte is retried on the next endpoint — a server dying mid-generation costs the client
  nothing but time. A streaming request is retried only until its first byte is forwarded;
  after that a failure ends the stream with an SSE error event.
- Retried: connection failures, drops, first-byte timeouts and upstream 429/502/503/504
  answers, up to ``max_retries`` other endpoints. Drops include the exchanges the gateway
  aborts itself when their endpoint stalled (``UpstreamAbortedError``; see
  :mod:`sluicegate.datalayer.stall`): that is how a non-streaming request held by a hung
  server leaves it after ``stallTimeoutMs`` rather than ``requestTimeoutMs``. The
  first-byte timeout bounds the wait for the status and the first body chunk
  (``first_byte_timeout_s`` for streams, whose headers vLLM sends before the first token;
  ``non_streaming_first_byte_timeout_s`` for the others, whose first byte comes with the
  whole answer): a server that shows no sign
  of work by then costs one attempt, which is abandoned (the connection is closed, so the
  server drops it) and sent elsewhere. For a non-streaming request that duplicates the
  work done so far — the price of not waiting on a hung server. A later timeout (no byte
  within the read timeout) is a 504 and is not retried; so is a first-byte timeout on the
  last endpoint tried.
- Every attempt's result goes to the outlier detector once (``report``: success, 5xx,
  connect error, reset, timeout; 429 counts as neither).
- A client disconnect cancels the handler, which closes the upstream connection so the
  model server aborts the request too.

Requests go out over :class:`~sluicegate.upstream.UpstreamPool`'s keep-alive connections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sluicegate.clock import Clock
from sluicegate.datalayer.outlier import Result, classify_status
from sluicegate.errors import GatewayError
from sluicegate.gateway.http import Responder
from sluicegate.metrics import GatewayMetrics
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.responses import (
    EventRewriter,
    ModelNameRewriter,
    ResponseStats,
    json_or_none,
    restore_model_name,
)
from sluicegate.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamFirstByteTimeoutError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
)

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
SERVED_HEADER = "x-gateway-destination-endpoint-served"

# Hop-by-hop and recomputed headers are not forwarded in either direction.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass(slots=True)
class ProxySettings:
    """How hard the proxy tries (timeouts are the upstream pool's)."""

    max_retries: int = 2
    """Other endpoints a failed request may be retried on."""
    first_byte_timeout_s: float | None = 30.0
    """Bound on a streamed answer's status and first chunk (s); None: the read timeout."""
    non_streaming_first_byte_timeout_s: float | None = None
    """The same for non-streamed answers (s); None: the read timeout."""


Reporter = Callable[[Dispatch, Result, str], None]
"""Told how each attempt ended (``Runtime.report``: the outlier detector)."""


@dataclass(slots=True)
class Outcome(ResponseStats):
    """What happened upstream, for metrics and logs. Token counts as the server reports
    (:class:`~sluicegate.requestcontrol.responses.ResponseStats`)."""

    status: int = 0
    error: str | None = None


def upstream_headers(
    client: Mapping[str, str], strip: frozenset[str], request_id: str, strip_authorization: bool
) -> dict[str, str]:
    """Client headers to forward: minus hop-by-hop, routing-control and (if ours) auth."""
    out: dict[str, str] = {}
    for name, value in client.items():
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower in strip:
            continue
        if lower == "x-request-id" or (strip_authorization and lower == "authorization"):
            continue
        out[name] = value
    out["x-request-id"] = request_id
    if not any(name.lower() == "accept-encoding" for name in out):
        # Otherwise the HTTP client would offer gzip itself, and the gateway does not
        # decompress: answers are relayed in the encoding the client asked for.
        out["Accept-Encoding"] = "identity"
    return out


def _client_headers(
    upstream: Iterable[tuple[str, str]], dispatch: Dispatch
) -> list[tuple[str, str]]:
    """The answer's headers for the client: the endpoint's, minus hop-by-hop and those the
    gateway sets (which it sets last)."""
    own = {SERVED_HEADER: dispatch.endpoint.address, "x-request-id": dispatch.request.request_id}
    for name, value in dispatch.response_headers.items():
        own[name.lower()] = value
    out = []
    for name, value in upstream:
        lower = name.lower()
        if lower not in _HOP_BY_HOP and lower not in own:
            out.append((name, value))
    out.extend(own.items())
    return out


class Proxy:
    """Sends dispatches upstream with retries, and relays answers."""

    def __init__(
        self,
        upstream: UpstreamPool,
        report: Reporter | None,
        metrics: GatewayMetrics,
        settings: ProxySettings,
        clock: Clock,
    ) -> None:
        self.upstream = upstream
        self.clock = clock
        self.report = report or _ignore
        self.metrics = metrics
        self.settings = settings

    async def forward(
        self,
        target: str,
        responder: Responder,
        dispatch: Dispatch,
        raw: bytes,
        headers: dict[str, str],
        method: str = "POST",
    ) -> Outcome:
        """Relay ``dispatch`` to ``target`` (path and query) on its endpoint with
        ``method``, answer the client through ``responder``, and say what happened. A
        ``HEAD`` goes upstream as a ``GET`` (the client's answer carries no body either
        way), so every answer the HTTP client reads has the body its head announces."""
        body = dispatch.body if dispatch.body is not None else raw
        path = target
        if method == "HEAD":
            method = "GET"
        outcome = Outcome()
        header_items = headers.items()
        retries_left = self.settings.max_retries
        stream = dispatch.request.stream
        first_byte_s = (
            self.settings.first_byte_timeout_s
            if stream
            else self.settings.non_streaming_first_byte_timeout_s
        )
        while True:
            endpoint = dispatch.endpoint
            try:
                upstream = await self.upstream.request(
                    endpoint.scheme,
                    endpoint.host,
                    endpoint.port,
                    method,
                    path,
                    header_items,
                    body,
                    first_byte_s,
                )
            except UpstreamFirstByteTimeoutError:
                failure, result = "timeout: first byte", Result.TIMEOUT
            except UpstreamTimeoutError:
                self.report(dispatch, Result.TIMEOUT, "timeout: no byte")
                raise _upstream_timeout() from None
            except UpstreamError as exc:
                if isinstance(exc, UpstreamConnectError):
                    failure, result = f"connect: {type(exc).__name__}", Result.CONNECT_ERROR
                else:
                    failure, result = f"read: {type(exc).__name__}", Result.RESET
            else:
                if (
                    upstream.status in RETRYABLE_STATUS
                    and retries_left > 0
                    and dispatch.has_fallback()
                ):
                    failure = f"status {upstream.status}"
                    result = classify_status(upstream.status)
                    upstream.close()
                else:
                    try:
                        if stream:
                            await self._relay_stream(responder, dispatch, upstream, outcome)
                        else:
                            await self._relay_whole(responder, dispatch, upstream, outcome)
                        return outcome
                    except _RetryableError as exc:
                        failure, result = str(exc), exc.result
                    finally:
                        upstream.release()  # closes a half-read answer: the server aborts it
            self.report(dispatch, result, failure)
            self.metrics.upstream_failures.labels(endpoint.name, failure.split(":")[0]).inc()
            if retries_left <= 0 or dispatch.retry_next() is None:
                if result is Result.TIMEOUT:
                    raise _upstream_timeout()
                raise GatewayError(
                    502,
                    f"upstream {endpoint.address} failed: {failure}",
                    code="upstream_error",
                    reason="upstream-failure",
                )
            retries_left -= 1
            self.metrics.retries.inc()

    async def _relay_whole(
        self,
        responder: Responder,
        dispatch: Dispatch,
        upstream: UpstreamResponse,
        outcome: Outcome,
    ) -> None:
        try:
            data = await upstream.read()
        except UpstreamError as exc:
            raise self._before_first_byte(dispatch, exc) from None
        outcome.status = upstream.status
        outcome.response_bytes = len(data)
        dispatch.mark_first_byte(self.clock.now(), 200 <= upstream.status < 300)
        self.report(dispatch, classify_status(upstream.status), f"status {upstream.status}")
        payload = json_or_none(data)
        outcome.observe_json(payload)
        if dispatch.rewrites_model:
            request = dispatch.request
            data = restore_model_name(payload, data, request.target_model, request.model) or data
        responder.send(upstream.status, _client_headers(upstream.headers, dispatch), data)

    async def _relay_stream(
        self,
        responder: Responder,
        dispatch: Dispatch,
        upstream: UpstreamResponse,
        outcome: Outcome,
    ) -> None:
        outcome.status = upstream.status
        rewrite = (
            EventRewriter(ModelNameRewriter(dispatch.request.target_model, dispatch.request.model))
            if dispatch.rewrites_model
            else None
        )
        try:
            first = await upstream.read_chunk()
        except UpstreamError as exc:
            raise self._before_first_byte(dispatch, exc) from None
        responder.stream(upstream.status, _client_headers(upstream.headers, dispatch))
        generated = 200 <= upstream.status < 300  # tokens, not an error body
        if first:
            dispatch.mark_first_byte(self.clock.now(), generated)
        chunk = first
        last = b""  # the final piece, written with the end of the stream
        try:
            while chunk:
                outcome.response_bytes += len(chunk)
                outcome.observe_stream_chunk(chunk)
                piece = rewrite.feed(chunk) if rewrite is not None else chunk
                if upstream.at_eof:
                    last = piece
                    break
                await responder.write(piece)
                chunk = await upstream.read_chunk()
                if chunk:  # the engine just ended an iteration: a latency-model feature
                    dispatch.mark_token(self.clock.now(), generated)
        except UpstreamError as exc:
            outcome.error = f"stream: {type(exc).__name__}"
            timeout = isinstance(exc, UpstreamTimeoutError)
            self.report(dispatch, Result.TIMEOUT if timeout else Result.RESET, outcome.error)
            if rewrite is not None:
                rewrite.discard()  # an incomplete event cannot precede the error event
            error = GatewayError(
                502,
                "the model server failed while streaming",
                code="upstream_error",
                reason="upstream-failure",
            )
            await responder.write(b"data: " + error.body() + b"\n\n")
        else:
            self.report(dispatch, classify_status(upstream.status), f"status {upstream.status}")
        outcome.end_stream()
        if rewrite is not None:
            last += rewrite.flush()
        await responder.end(last)

    def _before_first_byte(self, dispatch: Dispatch, exc: UpstreamError) -> Exception:
        """What a read failure before anything reached the client becomes: a retry for a
        drop or a first-byte timeout, a 504 for a later timeout (reported here)."""
        if isinstance(exc, UpstreamFirstByteTimeoutError):
            return _RetryableError("timeout: first byte", Result.TIMEOUT)
        if isinstance(exc, UpstreamTimeoutError):
            self.report(dispatch, Result.TIMEOUT, "timeout: no byte")
            return _upstream_timeout()
        return _RetryableError(f"read: {type(exc).__name__}", Result.RESET)


def _ignore(dispatch: Dispatch, result: Result, detail: str) -> None:
    """The reporter of a proxy without outlier detection."""


def _upstream_timeout() -> GatewayError:
    return GatewayError(
        504,
        "the model server did not answer in time",
        code="upstream_timeout",
        reason="upstream-timeout",
    )


class _RetryableError(Exception):
    """The upstream failed before anything reached the client."""

    def __init__(self, message: str, result: Result) -> None:
        super().__init__(message)
        self.result = result


__all__ = ["ModelNameRewriter", "Outcome", "Proxy", "ProxySettings", "upstream_headers"]
