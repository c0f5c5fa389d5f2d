"""The gateway's HTTP/1.1 server: asyncio protocols and ``httptools``' C parser.

Only what an OpenAI-compatible gateway needs, at a fraction of a general web framework's
cost per request (routing tables, middleware chains, request and response objects with
cookies, multipart and compression): requests with a body of known length or chunked,
keep-alive and pipelining (answered in order, one at a time per connection), answers whole
(``Content-Length``) or streamed (chunked, written as they come, with back-pressure).

- The handler gets a :class:`Request` (headers with lower-case names; repeated ones joined
  with ``", "``; trailers ignored) and a :class:`Responder`, and answers with exactly one
  of :meth:`Responder.send` or :meth:`Responder.stream`. Answers to ``HEAD`` carry no body.
- ``on_head``, if given, sees each request as soon as its head is complete: a
  :class:`Refusal` is answered without reading the body (the connection is closed after it
  when a body was announced), so e.g. a missing API key costs no buffered body.
- A body over ``max_body_bytes`` is answered by ``on_too_large`` and the connection closed
  (the rest of the body is not read); a request head over ``MAX_HEADER_BYTES`` is a 431;
  malformed input a 400 (so is an HTTP/1.1 request without exactly one ``Host``, RFC 9112
  §3.2); each after the answers to the requests read before it. ``Expect: 100-continue``
  is honoured. The server's own answers have OpenAI-style JSON bodies
  (:class:`~sluicegate.errors.GatewayError`).
- A body sent with ``Content-Encoding: gzip``, ``x-gzip`` or ``deflate`` is decompressed
  as it arrives (``max_body_bytes`` bounds the decompressed size) and the header removed;
  another coding is a 415, a corrupt stream a 400.
- Memory is bounded: at most ``max_connections`` client connections (more are answered 503
  and closed), at most ``max_buffered_body_bytes`` of request bodies held across all of
  them (a body that would pass it is answered 503 and its connection closed), and per
  connection reading stops while ``max_pipelined`` requests wait or while the client is
  not reading its answers (the transport's write buffer is full).
- A client that disconnects cancels its handler task, so whatever it awaits (an upstream
  request) is abandoned too. (A half-close counts as leaving: at the TCP level it looks
  the same as a client that closed, and generating for one that left is the costlier
  mistake.)
- A connection with no request in progress for ``idle_timeout_s`` is closed, whether it is
  idle between requests or still trickling in a request's head (75 s by default, aiohttp's
  keep-alive timeout), and so is one whose client has not taken an answer's bytes for as
  long; a body not complete ``body_timeout_s`` after its head is a 408. Connections are
  checked every quarter of the shorter of the two.
- When a connection is closed with input left unread (a refused body), the server stops
  writing and discards what still arrives for up to ``LINGER_S``: closing at once would
  make the kernel reset the connection, which can destroy the answer before the client
  reads it (the "lingering close" of RFC 9112 §9.6).

References: RFC 9112 (HTTP/1.1), https://www.rfc-editor.org/rfc/rfc9112 (§3.2 Host, §6.3
message body length, §9.6 tear-down); RFC 9110 §8.4 (content codings),
https://www.rfc-editor.org/rfc/rfc9110#section-8.4; RFC 1950 (the zlib format),
https://www.rfc-editor.org/rfc/rfc1950.
"""

from sluicegate.gateway.http.messages import (
    JSON_CONTENT_TYPE,
    LINGER_S,
    MAX_HEADER_BYTES,
    Handler,
    HeadCheck,
    Refusal,
    Request,
    TooLarge,
    error_answer,
)
from sluicegate.gateway.http.responder import Responder
from sluicegate.gateway.http.server import HttpServer

__all__ = [
    "JSON_CONTENT_TYPE",
    "LINGER_S",
    "MAX_HEADER_BYTES",
    "Handler",
    "HeadCheck",
    "HttpServer",
    "Refusal",
    "Request",
    "Responder",
    "TooLarge",
    "error_answer",
]
