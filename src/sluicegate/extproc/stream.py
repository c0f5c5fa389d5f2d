"""One ext_proc stream: one HTTP request and its response as Envoy reports them.

Request side (as GIE's https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/handlers/server.go):

- ``request_headers``: record them. Without a body (``end_of_stream``, e.g. ``GET
  /v1/responses/{id}``) the request is decided at once, as one with an empty body, and
  the answer is a headers response alone. Otherwise:
  in FULL_DUPLEX_STREAMED mode nothing is answered yet; in BUFFERED mode the headers are
  let through (Envoy holds them until the body is answered); in the other modes
  (STREAMED, BUFFERED_PARTIAL, NONE) Envoy would send the headers upstream before the body
  could be read, so the picker asks it to buffer the body instead (``mode_override``,
  which Envoy honours with ``allow_mode_override: true``).
- ``request_body``: buffered, at most ``max_body_bytes`` (more is a 413). At its end (or
  at the request trailers) the request is decided. Paths follow the gateway's rules
  (:mod:`sluicegate.requestcontrol.routes`): ``POST /v1/completions`` and
  ``/v1/chat/completions`` are parsed as such (one dict lookup: the hot path); ``GET
  /v1/models`` and ``/v1/models/{id}`` are answered by the picker with the fleet's merged
  list (:mod:`sluicegate.requestcontrol.models_list`); any other passed path is parsed by
  :func:`~sluicegate.requestcontrol.parse.parse_other`; a refused one is the gateway's
  404. The runtime routes the parsed request, and the answer goes
  back: the destination header and ``envoy.lb`` metadata, ``X-Gateway-Model-Name``,
  ``Content-Length``, the control headers removed, ``clear_route_cache``; then the body
  (rewritten when the target model differs) in pieces of at most 62,000 bytes. The
  routing-control headers (objective, model-name rewrite) are honoured only with
  ``trustControlHeaders`` (the proxy strips them from clients); the request's
  ``x-request-id`` is replaced when absent or unusable (see
  :func:`~sluicegate.requestcontrol.ids.request_id_from`).
- every refusal is an ``ImmediateResponse`` with the status and OpenAI-style body the
  standalone gateway would send (400, 404, 405, 413, 429, 503; 500 for faults).

Response side: the status, the endpoint that served it (when the proxy says), the first
body byte (TTFT), usage and token events, the model name restored; the runtime is told the
request ended at the end of the body (or trailers, or headers without a body) — or, when
the stream ends first (the client left, Envoy reset it, the picker is shutting down),
by :meth:`ExtProcStream.close`, which the servicer always calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sluicegate.errors import GatewayError, no_endpoint
from sluicegate.extproc.metrics import ExtProcMetrics
from sluicegate.extproc.protocol import (
    BUFFERED,
    BUFFERED_PARTIAL,
    DESTINATION_HEADER,
    FULL_DUPLEX_STREAMED,
    MODEL_NAME_HEADER,
    NONE,
    SERVED_KEY,
    body_response,
    buffer_request_body,
    header_dict,
    headers_response,
    immediate_answer,
    immediate_response,
    mode_name,
    pick_headers,
    served_endpoint,
    streamed_body,
    subset_hint,
    trailers_response,
)
from sluicegate.extproc.response import DEFAULT_BUFFER_LIMIT, ResponseRelay
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.ids import request_id_from
from sluicegate.requestcontrol.models_list import (
    MODEL_PREFIX,
    MODELS_PATH,
    model_entries,
    model_entry,
)
from sluicegate.requestcontrol.parse import (
    CONTROL_HEADERS,
    parse_other,
    parse_request,
    without_routing_headers,
)
from sluicegate.requestcontrol.responses import Usage
from sluicegate.requestcontrol.routes import GENERATION_ROUTES, check_passed, generates
from sluicegate.runtime import Runtime

log = logging.getLogger("sluicegate.extproc")

_REMOVABLE = tuple(sorted(CONTROL_HEADERS - {DESTINATION_HEADER}))
_RESPONSE_HEADERS = frozenset({":status", "content-type", "content-length", SERVED_KEY})


@dataclass(slots=True)
class StreamSettings:
    """How streams are processed. Sizes in bytes."""

    max_body_bytes: int | None = None
    """Largest request body accepted; larger is a 413. None: the configuration's
    GatewayConfig ``maxBodyBytes`` (16 MiB by default), as it is when the body arrives."""
    fallback_endpoints: int = 0
    """Fallback endpoints listed after the primary in the destination (``ip:port,...``).
    Envoy's ORIGINAL_DST cluster accepts exactly one ``ip:port``, hence 0 by default."""
    response_buffer_bytes: int = DEFAULT_BUFFER_LIMIT
    """Bytes of a non-streamed answer kept to read its usage (see ResponseRelay)."""
    accepting: Callable[[], bool] | None = None
    """False while the picker cannot route yet (Kubernetes discovery not synced): every
    request is then a 503."""


class ExtProcStream:
    """The state of one ext_proc stream; see the module docstring."""

    __slots__ = (
        "_body",
        "_configured_mode",
        "_generated_id",
        "_headers",
        "_relay",
        "_request_mode",
        "_response_mode",
        "_started",
        "_status",
        "_subset",
        "decided",
        "dispatch",
        "metrics",
        "request_id",
        "response_ended",
        "runtime",
        "settings",
    )

    def __init__(self, runtime: Runtime, settings: StreamSettings, metrics: ExtProcMetrics) -> None:
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self._started = time.perf_counter()
        self._request_mode = FULL_DUPLEX_STREAMED
        self._configured_mode = FULL_DUPLEX_STREAMED
        self._response_mode = FULL_DUPLEX_STREAMED
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._subset: list[str] | None = None
        self._generated_id = False
        self._status = 0
        self._relay: ResponseRelay | None = None
        self.request_id = ""
        self.decided = False
        """The request was answered: routed, or refused with an immediate response."""
        self.dispatch: Dispatch | None = None
        self.response_ended = False

    # ------------------------------------------------------------------ entry points

    async def handle(self, message: Any) -> list[Any]:
        """The responses to send for one ``ProcessingRequest`` (possibly none)."""
        kind = message.WhichOneof("request")
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "request_headers":
            answer = self._request_headers(message)
            # None: the headers ended the request, which is decided now.
            return answer if answer is not None else await self._decide(False, bodyless=True)
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "request_trailers":
            return await self._request_trailers()
        if kind == "response_trailers":
            self._end_response()
            return [trailers_response("response_trailers")]
        return []

    def fail(self, message: Any) -> list[Any]:
        """The answer to ``message`` after :meth:`handle` raised unexpectedly: a 500 while
        the request is undecided; afterwards the response passes through untouched."""
        kind = message.WhichOneof("request") or "unknown"
        phase = "request" if kind.startswith("request") else "response"
        self.metrics.internal_errors.labels(phase).inc()
        if not self.decided:
            self._release(0)
            return self._refuse(
                GatewayError(500, "internal error in the endpoint picker", code="internal_error")
            )
        if kind in ("request_trailers", "response_trailers"):
            return [trailers_response(kind)]
        if kind == "response_headers":
            return [headers_response(kind)]
        if kind == "response_body":
            held = self._relay.abort() if self._relay is not None else b""
            body = message.response_body
            chunk = body.body
            out = held + chunk if held else chunk
            return self._body_out("response_body", out, chunk, body.end_of_stream)
        return []

    def close(self) -> None:
        """The stream ended: release the dispatch if the response did not end normally
        (status 0 — nothing complete reached the client — unless the proxy sends no
        response body to the picker, where the status seen is all there is)."""
        if self.dispatch is None or self.response_ended:
            return
        complete = self._status and self._response_mode == NONE
        self._release(self._status if complete else 0)

    # ------------------------------------------------------------------ request

    def _request_headers(self, message: Any) -> list[Any] | None:
        self._started = time.perf_counter()
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self._request_mode = self._configured_mode = config.request_body_mode
            self._response_mode = config.response_body_mode
        self._headers = headers = header_dict(message.request_headers.headers)
        sent_id = headers.get("x-request-id")
        self.request_id = request_id_from(sent_id)
        self._generated_id = self.request_id != sent_id  # absent or unusable: replaced
        self._subset = subset_hint(message)
        if self.settings.accepting is not None and not self.settings.accepting():
            return self._refuse(no_endpoint("the endpoint picker has not synced its pool yet"))
        if message.request_headers.end_of_stream:
            return None
        if self._request_mode == FULL_DUPLEX_STREAMED:
            return []
        if self._request_mode == BUFFERED:
            return [headers_response("request_headers")]
        # The headers would go upstream before the body is seen: ask for BUFFERED.
        log.debug("request body mode %s: asking for BUFFERED", mode_name(self._request_mode))
        self._configured_mode, self._request_mode = self._request_mode, BUFFERED
        return [
            headers_response(
                "request_headers", mode_override=buffer_request_body(self._response_mode)
            )
        ]

    async def _request_body(self, body: Any) -> list[Any]:
        if self.decided:
            return []
        chunk = body.body
        if chunk:
            limit = self.settings.max_body_bytes or self.runtime.config.gateway.max_body_bytes
            if len(self._body) + len(chunk) > limit:
                self._body = bytearray()
                return self._refuse(
                    GatewayError(
                        413,
                        f"request body is larger than {limit} bytes",
                        code="body_too_large",
                        reason="body-too-large",
                    )
                )
            self._body += chunk
        if body.end_of_stream:
            return await self._decide(ended_by_trailers=False)
        if self._request_mode != FULL_DUPLEX_STREAMED:
            return self._refuse(_unsupported_mode(self._configured_mode))
        return []

    async def _request_trailers(self) -> list[Any]:
        if self.decided:
            return [trailers_response("request_trailers")]
        answer = await self._decide(ended_by_trailers=True)
        if self.dispatch is None:  # refused: the immediate response ends the stream
            return answer
        return [*answer, trailers_response("request_trailers")]

    async def _decide(self, ended_by_trailers: bool, bodyless: bool = False) -> list[Any]:
        """Parse, route and answer with the destination (or refuse, or answer the model
        list). ``bodyless``: the request headers ended the request."""
        raw = bytes(self._body)
        self._body = bytearray()
        headers: Mapping[str, str] = self._headers
        try:
            method = headers.get(":method", "GET")
            path = headers.get(":path", "").partition("?")[0]
            kind = GENERATION_ROUTES.get(path)
            if kind is None:  # off the hot path: the rules the gateway routes by
                if path == MODELS_PATH or path.startswith(MODEL_PREFIX):
                    return self._model_list(method, path)
                check_passed(method, path)  # a 404 for a path not passed through
                kind = "other"
            elif method != "POST":
                raise GatewayError(
                    405, f"{path} takes POST, not {method}", code="method_not_allowed"
                )
            # Routing-control headers count only when the proxy vouches for them
            # (trustControlHeaders); either way they are removed before going upstream.
            if not self.runtime.config.gateway.trust_control_headers:
                headers = without_routing_headers(headers)
            parsed = (
                parse_other(raw, headers, generates(path))
                if kind == "other"
                else parse_request(kind, raw, headers)
            )
            dispatch = await self.runtime.acquire(
                parsed, self.request_id, headers, self._started, self._subset
            )
        except GatewayError as exc:
            return self._refuse(exc)
        self.dispatch = dispatch
        body = dispatch.body if dispatch.body is not None else raw
        destination = ",".join(
            [
                dispatch.endpoint.address,
                *(e.address for e in dispatch.fallbacks[: self.settings.fallback_endpoints]),
            ]
        )
        set_headers = {DESTINATION_HEADER: destination}
        if parsed.model:  # not for a model-less pass-through
            set_headers[MODEL_NAME_HEADER] = parsed.model
        if not bodyless:
            set_headers["content-length"] = str(len(body))
        if self._generated_id:
            set_headers["x-request-id"] = self.request_id
        remove = [h for h in _REMOVABLE if h in self._headers]
        if bodyless or self._request_mode == FULL_DUPLEX_STREAMED:
            answer = [
                headers_response(
                    "request_headers",
                    set_headers,
                    remove,
                    clear_route_cache=True,
                    destination=destination,
                ),
                *(() if bodyless else streamed_body("request_body", body, not ended_by_trailers)),
            ]
        else:  # BUFFERED: the headers wait for this answer; the body is replaced whole
            answer = [
                body_response(
                    "request_body",
                    set_headers,
                    remove,
                    body=dispatch.body,
                    clear_route_cache=True,
                    destination=destination,
                )
            ]
        # The time the request spent in the picker (body upload and queueing included).
        self.runtime.metrics.overhead.observe(time.perf_counter() - self._started)
        self.decided = True
        return answer

    def _model_list(self, method: str, path: str) -> list[Any]:
        """``GET /v1/models`` and ``/v1/models/{id}``: the fleet's merged list, answered by
        the picker itself as the gateway answers it (no server has the whole list)."""
        if method not in ("GET", "HEAD"):
            raise GatewayError(405, f"{path} takes GET, not {method}", code="method_not_allowed")
        endpoints = self.runtime.datastore.all_endpoints()
        routes = self.runtime.director.models.routes
        if path == MODELS_PATH:
            body = orjson.dumps({"object": "list", "data": model_entries(endpoints, routes)})
        else:
            body = orjson.dumps(model_entry(path, endpoints, routes))
        self.decided = True
        return [immediate_answer(200, body, self.request_id, details="sluicegate_model_list")]

    def _refuse(self, error: GatewayError) -> list[Any]:
        self.decided = True
        self.metrics.immediate.labels(str(error.status), error.reason).inc()
        if error.status >= 500:
            log.debug("request %s refused: %s", self.request_id, error.message)
        return [immediate_response(error, self.request_id)]

    # ------------------------------------------------------------------ response

    def _response_headers(self, message: Any) -> list[Any]:
        response = message.response_headers
        headers = pick_headers(response.headers, _RESPONSE_HEADERS)
        try:
            self._status = int(headers.get(":status", "0"))
        except ValueError:
            self._status = 0
        dispatch = self.dispatch
        if dispatch is None or self.response_ended:
            return [headers_response("response_headers")]
        served = served_endpoint(message, headers)
        if served is not None and served != dispatch.endpoint.address:
            _follow_fallback(dispatch, served)
        streaming = dispatch.request.stream or headers.get("content-type", "").startswith(
            "text/event-stream"
        )
        self._relay = ResponseRelay(dispatch, streaming, self.settings.response_buffer_bytes)
        set_headers = dict(dispatch.response_headers)
        remove = (
            ["content-length"] if dispatch.rewrites_model and "content-length" in headers else []
        )
        if response.end_of_stream:  # no body: nothing generated
            dispatch.mark_first_byte(self.runtime.clock.now(), generated=False)
            self._end_response()
        return [headers_response("response_headers", set_headers, remove)]

    def _response_body(self, body: Any) -> list[Any]:
        chunk, end = body.body, body.end_of_stream
        relay = self._relay
        if relay is None or self.response_ended:
            return self._body_out("response_body", chunk, chunk, end)
        dispatch = self.dispatch
        if chunk and dispatch is not None:
            # Every streamed chunk times the endpoint's iterations for the latency models.
            generated = 200 <= self._status < 300  # tokens, not an error body
            if dispatch.first_byte_at is None:
                dispatch.mark_first_byte(self.runtime.clock.now(), generated)
            else:
                dispatch.mark_token(self.runtime.clock.now(), generated)
        out = relay.feed(chunk, end)
        if end:
            self._end_response()
        return self._body_out("response_body", out, chunk, end)

    def _body_out(self, phase: str, out: bytes, chunk: bytes, end: bool) -> list[Any]:
        """Pass ``out`` on in place of ``chunk`` (the body piece Envoy sent), in the
        stream's mode: as streamed pieces, or one answer replacing the chunk if changed."""
        if self._response_mode == FULL_DUPLEX_STREAMED:
            return streamed_body(phase, out, end)
        return [body_response(phase, body=None if out is chunk else out)]

    def _end_response(self) -> None:
        if self.response_ended:
            return
        self.response_ended = True
        relay = self._relay
        self._release(self._status, relay.stats.usage() if relay is not None else Usage())

    def _release(self, status: int, usage: Usage | None = None) -> None:
        if self.dispatch is not None:
            self.runtime.release(self.dispatch, status, usage)


def _follow_fallback(dispatch: Dispatch, served: str) -> None:
    """The proxy used a fallback: move the in-flight charge to the endpoint that served."""
    if any(e.address == served for e in dispatch.fallbacks):
        while dispatch.endpoint.address != served and dispatch.retry_next() is not None:
            pass


def _unsupported_mode(mode: int) -> GatewayError:
    message = (
        "the request body is larger than the proxy's buffer (BUFFERED_PARTIAL mode)"
        if mode == BUFFERED_PARTIAL
        else f"the proxy streams the request body in {mode_name(mode)} mode, so the "
        "headers went upstream before the body could be read; configure the ext_proc "
        "filter with request_body_mode FULL_DUPLEX_STREAMED (or BUFFERED), or set "
        "allow_mode_override: true"
    )
    status = 413 if mode == BUFFERED_PARTIAL else 500
    return GatewayError(status, message, code="unsupported_body_mode", reason="body-mode")
