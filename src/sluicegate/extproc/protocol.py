"""The endpoint-picker protocol on Envoy's ext_proc messages: names, limits, builders.

Protocol facts (Gateway API Inference Extension, GIE, endpoint picker protocol, at 1748e829:
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/docs/proposals/004-endpoint-picker-protocol/README.md):

- the picked endpoint goes back as the request header ``x-gateway-destination-endpoint``
  **and** as ``dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]``, with the
  same value: ``ip:port``, or ``ip:port,ip:port,…`` (primary, then ordered fallbacks);
- the proxy may restrict the choice with
  ``metadata_context.filter_metadata["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"]``
  (a list of ``ip:port``; an empty list means nothing is eligible: 503);
- the proxy may report the endpoint that actually served the request in
  ``metadata_context.filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]``;
- bodies sent back in ``FULL_DUPLEX_STREAMED`` mode are cut into pieces of at most 62,000
  bytes (GIE at the same commit, ``pkg/common/envoy/chunking.go``), below the 64 KiB
  limit some Envoy builds enforce on one message.

Header values arrive in ``raw_value`` (bytes) from current Envoy releases and in ``value``
from older ones; both are read, and mutations are written as ``raw_value``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from sluicegate.errors import GatewayError

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
MODEL_NAME_HEADER = "x-gateway-model-name"
"""Set from the body's ``model`` so HTTPRoutes can match on it (as body-based routing does)."""
BODY_CHUNK_BYTES = 62_000
"""Largest body piece sent back in one message, in bytes (reference endpoint picker,
``pkg/common/envoy/chunking.go``)."""

ProcessingMode = processing_mode_pb2.ProcessingMode
NONE = ProcessingMode.NONE
STREAMED = ProcessingMode.STREAMED
BUFFERED = ProcessingMode.BUFFERED
BUFFERED_PARTIAL = ProcessingMode.BUFFERED_PARTIAL
FULL_DUPLEX_STREAMED = ProcessingMode.FULL_DUPLEX_STREAMED

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_STATUS_CODES = frozenset(v.number for v in http_status_pb2.StatusCode.DESCRIPTOR.values)


def mode_name(mode: int) -> str:
    """``FULL_DUPLEX_STREAMED`` for 4, and so on."""
    return str(ProcessingMode.BodySendMode.Name(mode))


# ---------------------------------------------------------------------------- reading


def header_dict(header_map: Any) -> dict[str, str]:
    """A ``HeaderMap``'s headers by lower-case name (the last value wins)."""
    out: dict[str, str] = {}
    for header in header_map.headers:
        raw = header.raw_value
        out[header.key.lower()] = raw.decode("utf-8", "replace") if raw else header.value
    return out


def pick_headers(header_map: Any, names: frozenset[str]) -> dict[str, str]:
    """Only the headers of ``header_map`` named in ``names`` (lower-case)."""
    out: dict[str, str] = {}
    for header in header_map.headers:
        key = header.key.lower()
        if key in names:
            raw = header.raw_value
            out[key] = raw.decode("utf-8", "replace") if raw else header.value
    return out


def _metadata_value(request: Any, namespace: str, key: str) -> Any:
    """The protobuf ``Value`` under ``filter_metadata[namespace][key]``, or None."""
    if not request.HasField("metadata_context"):
        return None
    struct = request.metadata_context.filter_metadata.get(namespace)
    return None if struct is None else struct.fields.get(key)


def _addresses(value: Any) -> list[str]:
    """``ip:port`` strings from a list value, or from a comma-separated string value."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value.strip() for v in value.list_value.values if v.string_value]
    if kind == "string_value":
        return [a.strip() for a in value.string_value.split(",") if a.strip()]
    return []


def subset_hint(request: Any) -> list[str] | None:
    """The endpoint subset the proxy allows for this request (``ip:port`` each), or None
    when it sent no hint. An empty list means no endpoint is allowed."""
    value = _metadata_value(request, SUBSET_NAMESPACE, SUBSET_KEY)
    return None if value is None else _addresses(value)


def served_endpoint(request: Any, headers: Mapping[str, str] | None = None) -> str | None:
    """The endpoint that served the request as the proxy reports it: the ``envoy.lb``
    metadata, else a response header of the same name (some proxies use one)."""
    value = _metadata_value(request, LB_NAMESPACE, SERVED_KEY)
    if value is not None:
        addresses = _addresses(value)
        if addresses:
            return addresses[0]
    if headers is not None:
        served = headers.get(SERVED_KEY, "").split(",")[0].strip()
        if served:
            return served
    return None


# ---------------------------------------------------------------------------- building
#
# Messages are filled in place (``response.request_body.response...``) rather than built
# from nested constructors: measured about three times cheaper with the upb runtime, and
# this is the per-request path.


def fill_mutation(mutation: Any, set_headers: Mapping[str, str], remove: Iterable[str]) -> None:
    """Fill a ``HeaderMutation``: replace (or add) ``set_headers``, remove ``remove``."""
    for name, value in set_headers.items():
        option = mutation.set_headers.add()
        option.header.key = name
        option.header.raw_value = value.encode()
        option.append_action = _OVERWRITE
    mutation.remove_headers.extend(remove)


def set_destination(response: Any, destination: str) -> None:
    """``dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"] = destination``."""
    lb = response.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    lb.fields[DESTINATION_HEADER].string_value = destination


def headers_response(
    phase: str,
    set_headers: Mapping[str, str] | None = None,
    remove: Iterable[str] = (),
    *,
    clear_route_cache: bool = False,
    destination: str | None = None,
    mode_override: Any = None,
) -> Any:
    """A ``HeadersResponse`` for ``phase`` (``request_headers`` / ``response_headers``);
    ``destination`` also goes into the ``envoy.lb`` dynamic metadata."""
    response = pb.ProcessingResponse()
    common = getattr(response, phase).response
    if set_headers or remove:
        fill_mutation(common.header_mutation, set_headers or {}, remove)
    else:
        getattr(response, phase).SetInParent()
    if clear_route_cache:
        common.clear_route_cache = True
    if destination is not None:
        set_destination(response, destination)
    if mode_override is not None:
        response.mode_override.CopyFrom(mode_override)
    return response


def body_response(
    phase: str,
    set_headers: Mapping[str, str] | None = None,
    remove: Iterable[str] = (),
    *,
    body: bytes | None = None,
    clear_route_cache: bool = False,
    destination: str | None = None,
) -> Any:
    """A ``BodyResponse`` for ``phase`` (``request_body`` / ``response_body``), replacing
    the body with ``body`` when given (BUFFERED and STREAMED modes)."""
    response = pb.ProcessingResponse()
    common = getattr(response, phase).response
    getattr(response, phase).SetInParent()
    if set_headers or remove:
        fill_mutation(common.header_mutation, set_headers or {}, remove)
    if body is not None:
        common.body_mutation.body = body
    if clear_route_cache:
        common.clear_route_cache = True
    if destination is not None:
        set_destination(response, destination)
    return response


def streamed_body(phase: str, body: bytes, end_of_stream: bool) -> list[Any]:
    """``body`` as ``StreamedBodyResponse`` messages of at most :data:`BODY_CHUNK_BYTES`
    (FULL_DUPLEX_STREAMED mode); ``end_of_stream`` is set on the last one only. An empty
    body gives one empty message when it ends the stream, else nothing."""
    size = len(body)
    if size <= BODY_CHUNK_BYTES:
        return [_streamed(phase, body, end_of_stream)] if size or end_of_stream else []
    view = memoryview(body)
    return [
        _streamed(
            phase,
            bytes(view[i : i + BODY_CHUNK_BYTES]),
            end_of_stream and i + BODY_CHUNK_BYTES >= size,
        )
        for i in range(0, size, BODY_CHUNK_BYTES)
    ]


def _streamed(phase: str, piece: bytes, end_of_stream: bool) -> Any:
    response = pb.ProcessingResponse()
    streamed = getattr(response, phase).response.body_mutation.streamed_response
    streamed.body = piece
    if end_of_stream:
        streamed.end_of_stream = True
    else:
        streamed.SetInParent()
    return response


def trailers_response(phase: str) -> Any:
    """An empty ``TrailersResponse`` for ``phase`` (``request_trailers`` / ...)."""
    response = pb.ProcessingResponse()
    getattr(response, phase).SetInParent()
    return response


def immediate_response(error: GatewayError, request_id: str | None = None) -> Any:
    """The client's answer for a decision the picker made itself (an OpenAI-style JSON
    error body, ``Retry-After`` when shedding, ``x-sluicegate-dropped-reason``)."""
    details = f"sluicegate_{error.reason}".replace("-", "_").replace(" ", "_")[:100]
    status = error.status if error.status in _STATUS_CODES else 500
    return immediate_answer(status, error.body(), request_id, error.headers(), details)


def immediate_answer(
    status: int,
    body: bytes,
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    details: str = "sluicegate",
) -> Any:
    """An answer the picker gives itself instead of an upstream's: ``status``, a JSON
    ``body`` (``content-type: application/json``) and ``headers``."""
    sent = {"content-type": "application/json", **(headers or {})}
    if request_id:
        sent["x-request-id"] = request_id
    response = pb.ProcessingResponse()
    answer = response.immediate_response
    answer.status.code = status
    fill_mutation(answer.headers, {k.lower(): v for k, v in sent.items()}, ())
    answer.body = body
    answer.details = details
    return response


def buffer_request_body(response_body: int) -> Any:
    """A mode override asking Envoy to buffer the whole request body (BUFFERED) before it
    lets the headers go upstream, keeping ``response_body`` as the response body mode.
    Envoy applies it only with ``allow_mode_override: true`` in the filter configuration.
    """
    return ProcessingMode(
        request_header_mode=ProcessingMode.SEND,
        response_header_mode=ProcessingMode.SEND,
        request_body_mode=BUFFERED,
        response_body_mode=response_body,
    )
