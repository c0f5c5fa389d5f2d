"""Forwarding a routed request to its endpoint, and the answer back to the client.

- Streaming answers are passed through chunk by chunk as they arrive; nothing is buffered
  except, when the model name must be rewritten back, the tail of an incomplete SSE event.
- Non-streaming answers are read whole, so a failure anywhere before the client has seen a
  byte is retried on the next endpoint — a server dying mid-generation costs the client
  nothing but time. A streaming request is retried only until its first byte is forwarded;
  after that a failure ends the stream with an SSE error event.
- Retried: connection failures and upstream 429/502/503/504 answers, up to ``max_retries``
  other endpoints. A timeout waiting for a byte is a 504 and is not retried (the request
  may still be running there).
- A client disconnect cancels the handler, which closes the upstream connection so the
  model server aborts the request too.

Requests go out over :class:`~sluicegate.upstream.UpstreamPool`'s keep-alive connections.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluicegate.clock import Clock
from sluicegate.datalayer.collector import Collector
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
        collector: Collector | None,
        metrics: GatewayMetrics,
        settings: ProxySettings,
        clock: Clock,
    ) -> None:
        self.upstream = upstream
        self.clock = clock
        self.collector = collector
        self.metrics = metrics
        self.settings = settings

    async def forward(
        self,
        target: str,
        responder: Responder,
        dispatch: Dispatch,
        raw: bytes,
        headers: dict[str, str],
    ) -> Outcome:
        """Relay ``dispatch`` to ``target`` (path and query) on its endpoint, answer the
        client through ``responder``, and say what happened."""
        body = dispatch.body if dispatch.body is not None else raw
        path = target
        outcome = Outcome()
        header_items = headers.items()
        retries_left = self.settings.max_retries
        while True:
            endpoint = dispatch.endpoint
            try:
                upstream = await self.upstream.request(
                    endpoint.scheme, endpoint.host, endpoint.port, "POST", path, header_items, body
                )
            except UpstreamTimeoutError:
                raise _upstream_timeout() from None
            except UpstreamError as exc:
                stage = "connect" if isinstance(exc, UpstreamConnectError) else "read"
                failure = f"{stage}: {type(exc).__name__}"
            else:
                if (
                    upstream.status in RETRYABLE_STATUS
                    and retries_left > 0
                    and dispatch.has_fallback()
                ):
                    failure = f"status {upstream.status}"
                    upstream.close()
                else:
                    try:
                        if dispatch.request.stream:
                            await self._relay_stream(responder, dispatch, upstream, outcome)
                        else:
                            await self._relay_whole(responder, dispatch, upstream, outcome)
                        return outcome
                    except _RetryableError as exc:
                        failure = str(exc)
                    finally:
                        upstream.release()  # closes a half-read answer: the server aborts it
            self.metrics.upstream_failures.labels(endpoint.name, failure.split(":")[0]).inc()
            if self.collector is not None and not failure.startswith("status"):
                self.collector.record_failure(endpoint, failure)
            if retries_left <= 0 or dispatch.retry_next() is None:
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
        except UpstreamTimeoutError:
            raise _upstream_timeout() from None
        except UpstreamError as exc:
            raise _RetryableError(f"read: {type(exc).__name__}") from None
        dispatch.mark_first_byte(self.clock.now())
        outcome.status = upstream.status
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
        except UpstreamTimeoutError:
            raise _upstream_timeout() from None
        except UpstreamError as exc:
            raise _RetryableError(f"read: {type(exc).__name__}") from None
        responder.stream(upstream.status, _client_headers(upstream.headers, dispatch))
        if first:
            dispatch.mark_first_byte(self.clock.now())
        chunk = first
        last = b""  # the final piece, written with the end of the stream
        try:
            while chunk:
                outcome.observe_stream_chunk(chunk)
                piece = rewrite.feed(chunk) if rewrite is not None else chunk
                if upstream.at_eof:
                    last = piece
                    break
                await responder.write(piece)
                chunk = await upstream.read_chunk()
                if chunk:  # the engine just ended an iteration: a latency-model feature
                    dispatch.mark_token(self.clock.now())
        except UpstreamError as exc:
            outcome.error = f"stream: {type(exc).__name__}"
            if rewrite is not None:
                rewrite.discard()  # an incomplete event cannot precede the error event
            error = GatewayError(
                502,
                "the model server failed while streaming",
                code="upstream_error",
                reason="upstream-failure",
            )
            await responder.write(b"data: " + error.body() + b"\n\n")
        outcome.end_stream()
        if rewrite is not None:
            last += rewrite.flush()
        await responder.end(last)


def _upstream_timeout() -> GatewayError:
    return GatewayError(
        504,
        "the model server did not answer in time",
        code="upstream_timeout",
        reason="upstream-timeout",
    )


class _RetryableError(Exception):
    """The upstream failed before anything reached the client."""


__all__ = ["ModelNameRewriter", "Outcome", "Proxy", "ProxySettings", "upstream_headers"]
