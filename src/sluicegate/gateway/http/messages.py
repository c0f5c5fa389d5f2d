"""What the server and its handlers exchange: the request, answers given from a head alone,
the server's own error answers, and the constants of the wire format."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING

from sluicegate.errors import GatewayError

if TYPE_CHECKING:
    from sluicegate.gateway.http.responder import Responder

log = logging.getLogger("sluicegate.gateway")

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_CHUNKED_END = b"0\r\n\r\n"
MAX_HEADER_BYTES = 64 * 1024
"""Largest request line plus headers accepted (bytes); more is a 431."""
_PIPELINE_HARD_LIMIT = 8
"""Reading stops at ``max_pipelined`` waiting requests, but one read may hold more: past
this many times ``max_pipelined`` the connection is closed after what is queued."""
LINGER_S = 1.0
"""How long a connection closed with input unread keeps discarding that input (s)."""
JSON_CONTENT_TYPE = ("content-type", "application/json")
"""The header of every JSON answer, the server's own and the gateway's (defined here only)."""
_SPECIAL = frozenset({"content-length", "transfer-encoding", "host", "expect", "content-encoding"})


def _encode(text: str) -> bytes:
    # Header values arrive decoded as UTF-8 with surrogate escapes: this restores the bytes.
    return text.encode("utf-8", "surrogateescape")


def _printable(text: str, limit: int = 64) -> str:
    """A client's text made safe to quote in a JSON message (its undecodable bytes as
    ``\\xNN``; at most ``limit`` characters)."""
    return _encode(text[:limit]).decode("utf-8", "backslashreplace")


@dataclass(slots=True)
class Request:
    method: str
    target: str
    """Path and query, as sent."""
    path: str
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes
    http_version: str


Handler = Callable[[Request, "Responder"], Awaitable[None]]
TooLarge = Callable[[Request, "Responder"], None]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer given from a request's head alone (e.g. 401 before its body is read)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


HeadCheck = Callable[[Request], "Refusal | None"]
"""Called when a request's head is complete (``body`` is ``b""``): None reads the body
and runs the handler; a :class:`Refusal` is answered without reading the body (in turn,
after the answers to requests before it on the connection), then the connection is closed
if a body was announced. An exception is logged and answered 500. The same
:class:`Request` goes to the handler later, its body filled in (and, for a compressed
body, ``content-encoding`` removed from its headers)."""

_TOO_LARGE = Refusal(413, [], b"")
"""Marks a request answered by ``on_too_large`` (compared by identity)."""


def error_answer(
    status: int, message: str, code: str, reason: str, retry_after_s: int | None = None
) -> Refusal:
    """An answer of the server's own, with an OpenAI-style JSON body."""
    error = GatewayError(status, message, code=code, reason=reason, retry_after_s=retry_after_s)
    headers = [JSON_CONTENT_TYPE, *error.headers().items()]
    return Refusal(status, headers, error.body())


def _blank_request() -> Request:
    """Stands for a request whose head could not be read (to answer it a 400 or 431)."""
    return Request("", "", "", {}, b"", "1.1")


_JSON = (JSON_CONTENT_TYPE,)
_NO_ANSWER = GatewayError(500, "the handler gave no answer", code="internal_error").body()
_INTERNAL_ERROR = GatewayError(500, "internal error", code="internal_error").body()
_HEAD_CHECK_FAILED = error_answer(500, "internal error", "internal_error", "internal_error")
_BAD_HOST = ("invalid_host", "bad-request")
_BAD_TRANSFER_CODING = ("unsupported_transfer_coding", "bad-request")
_BAD_CONTENT_CODING = ("unsupported_content_encoding", "unsupported-content-encoding")
_SLOW_BODY = ("request_timeout", "body-timeout")


def _corrupt_body(exc: zlib.error) -> Refusal:
    message = f"the request body does not decode per its Content-Encoding: {exc}"
    return error_answer(400, message, "invalid_content_encoding", "bad-request")
