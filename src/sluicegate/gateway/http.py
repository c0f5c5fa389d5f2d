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

from __future__ import annotations

import asyncio
import logging
import resource
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus

import httptools

from sluicegate.errors import GatewayError

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
_SPECIAL = frozenset({"content-length", "transfer-encoding", "host", "expect", "content-encoding"})
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_CODINGS: dict[str, int | None] = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": None}
"""Content codings decoded: zlib's ``wbits`` for each (None: zlib or raw deflate, told
by the first two bytes)."""


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
    headers = [("content-type", "application/json"), *error.headers().items()]
    return Refusal(status, headers, error.body())


def _blank_request() -> Request:
    """Stands for a request whose head could not be read (to answer it a 400 or 431)."""
    return Request("", "", "", {}, b"", "1.1")


class _Inflater:
    """Decompresses a request body as it arrives, never producing more than asked for."""

    __slots__ = ("_obj", "_start")

    def __init__(self, wbits: int | None) -> None:
        self._obj = None if wbits is None else zlib.decompressobj(wbits)
        self._start = b""
        """The first byte of a ``deflate`` body, until the second tells its format."""

    def feed(self, data: bytes, limit: int) -> bytes | None:
        """The output of ``data``: at most ``limit`` bytes, else None (the rest is not
        decompressed). Raises :class:`zlib.error` for a corrupt stream."""
        obj = self._obj
        if obj is None:
            data = self._start + data
            if len(data) < 2:
                self._start = data
                return b""
            self._start = b""
            # "deflate" is the zlib format (RFC 9110 §8.4.1.2), but some clients send raw
            # deflate: a zlib header is a multiple of 31 with method 8 (RFC 1950 §2.2).
            zlib_format = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            obj = self._obj = zlib.decompressobj(zlib.MAX_WBITS if zlib_format else -zlib.MAX_WBITS)
        if obj.eof:
            if data:
                raise zlib.error("data after the end of the compressed stream")
            return b""
        out = obj.decompress(data, limit + 1)  # one byte more than allowed tells "too large"
        if len(out) > limit:
            return None
        if obj.unused_data:
            raise zlib.error("data after the end of the compressed stream")
        return out

    def finish(self) -> None:
        """Raises :class:`zlib.error` unless the stream ended properly."""
        if self._obj is None or not self._obj.eof:
            raise zlib.error("the compressed stream is truncated")


class Responder:
    """Writes the answer to one request on its connection."""

    __slots__ = (
        "_conn",
        "_ended",
        "_head_only",
        "_held",
        "_http_10",
        "_started",
        "_streaming",
        "keep_alive",
    )

    def __init__(self, conn: _HttpConnection, request: Request, keep_alive: bool) -> None:
        self._conn = conn
        self._http_10 = request.http_version == "1.0"
        self._head_only = request.method == "HEAD"
        self._started = False
        self._ended = False
        self._streaming = False
        self._held = b""
        """A streamed answer's head, written together with its first piece."""
        self.keep_alive = keep_alive
        """Whether the connection stays open after this answer."""

    @property
    def started(self) -> bool:
        """Whether the status line has been written (nothing else can be sent then)."""
        return self._started

    @property
    def ended(self) -> bool:
        """Whether the whole answer has been written (:meth:`send`, or :meth:`end`)."""
        return self._ended

    def send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b"") -> None:
        """The whole answer at once."""
        head = self._head(status, headers, f"content-length: {len(body)}\r\n")
        self._conn.write(head if self._head_only else head + body)
        self._ended = True

    def stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """Start a streamed answer; then :meth:`write` its pieces and :meth:`end` it.

        The head goes out with the first piece (or the end), in one write: call
        :meth:`write` right after, not after a wait.
        """
        if self._http_10:  # no chunking in HTTP/1.0: the close ends the body
            self.keep_alive = False
            self._held = self._head(status, headers, "")
        else:
            self._held = self._head(status, headers, "transfer-encoding: chunked\r\n")
            self._streaming = True

    async def write(self, data: bytes) -> None:
        """Send one piece of a streamed answer (waiting while the client is slow)."""
        if self._head_only:
            data = b""
        elif data and self._streaming:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        if self._held:
            data, self._held = self._held + data, b""
        if data:
            self._conn.write(data)
            await self._conn.drain()

    async def end(self, last: bytes = b"") -> None:
        """End a streamed answer, with ``last`` as its final piece (in the same write)."""
        if self._head_only:
            last = b""
        elif self._streaming:
            last = (b"%x\r\n%b\r\n" % (len(last), last) if last else b"") + _CHUNKED_END
        if self._held:
            last, self._held = self._held + last, b""
        if last:
            self._conn.write(last)
        self._ended = True
        await self._conn.drain()

    def _head(self, status: int, headers: Iterable[tuple[str, str]], framing: str) -> bytes:
        if self._started:
            raise RuntimeError("the answer has already been started")
        conn = self._conn
        if conn.server.stopping or conn.last_answer:
            self.keep_alive = False
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"]
        for name, value in headers:
            if "\n" in value or "\r" in value:
                raise ValueError(f"header {name!r} contains a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append(framing)
        if not self.keep_alive:
            lines.append("connection: close\r\n")
        elif self._http_10:
            lines.append("connection: keep-alive\r\n")
        lines.append("\r\n")
        head = _encode("".join(lines))  # before _started: a failure here can still be answered
        self._started = True
        return head


class _HttpConnection(asyncio.Protocol):
    """One client connection: parses requests and runs the handler for each, in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        """No more reading or answering (closing, or closed)."""
        self.idle_since = 0.0
        """Event-loop time the connection last had no request in progress, or was asked to
        close (s)."""
        self.input_done = False
        """No more requests are read: what is queued is answered, then the connection
        closes."""
        self.in_body = False
        """A request's body is being read (its bytes count in the server's budget)."""
        self.body_since = 0.0
        """Event-loop time that body's head was complete, or reading resumed (s)."""
        self.reading_paused = False
        self._loop = asyncio.get_running_loop()
        self._messages = 0
        self._in_head = False
        self._head_bytes = 0
        self._parsed_head_bytes = 0
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._request: Request | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        """The body read so far (decompressed); while ``in_body``, charged to the server's
        budget (a ``Content-Length`` is charged whole when the head is complete)."""
        self._counted = False
        """A chunked body: counted against the limits piece by piece."""
        self._inflater: _Inflater | None = None
        self._skip = False
        """The request in progress is already answered (or dropped): its body is not kept."""
        self._unread = False
        """Input was left unread: close with a linger."""
        self._pending: deque[tuple[Request, bool, Refusal | None, int]] = deque()
        """Requests waiting for their turn: keep-alive, how to answer (None: the handler),
        bytes of budget their body holds."""
        self._running_bytes = 0
        """Bytes of budget held by the body of the request being answered."""
        self._task: asyncio.Task[None] | None = None
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None

    @property
    def last_answer(self) -> bool:
        """Whether the answer being written is the connection's last."""
        return self.input_done and not self._pending

    # -------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport
        self.idle_since = self._loop.time()
        server = self.server
        if len(server.connections) >= server.max_connections:
            # Answered before anything is read, without counting it among the open ones.
            server.connections_refused += 1
            self.closed = True
            transport.write(server.busy_answer)  # type: ignore[attr-defined]
            transport.close()
            return
        server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.input_done:
            return  # the rest of the input is not read (or discarded while lingering)
        messages = self._messages
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request itself was complete and is answered as a plain one; what follows
            # is another protocol, which the gateway does not speak.
            self._unread = True
            self._end_input()
        except httptools.HttpParserError as exc:
            self._reject(400, f"malformed HTTP request: {exc}", "malformed_request")
        if self._in_head and self._messages == messages:
            # A head still incomplete at the end of a read that started inside it: that
            # whole read was head (the parser holds an unfinished header line unseen).
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._reject(431, "request headers are too large", "headers_too_large")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        server = self.server
        server.connections.discard(self)
        held = self._running_bytes + sum(item[3] for item in self._pending)
        if self.in_body:
            held += self._body_bytes
        server.buffered_body_bytes -= held
        self._running_bytes = 0
        self.in_body = False
        self._body = []
        self._inflater = None
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: abandon its request
        self._wake_writer()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()
        self._wake_writer()

    def _update_reading(self) -> None:
        """Read only while the client takes its answers and the pipeline has room."""
        transport = self.transport
        if transport is None or self.closed:
            return
        stop = self._write_paused or len(self._pending) >= self.server.max_pipelined
        if stop and not self.reading_paused:
            self.reading_paused = True
            transport.pause_reading()
        elif not stop and self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
            if self.in_body:  # the time it was not read is not the client's
                self.body_since = self._loop.time()

    # -------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        if self.input_done:  # the rest of this read follows a request that ends the input
            raise httptools.HttpParserError("input ended")
        self._messages += 1
        self._in_head = True
        self._head_bytes = 0
        self._parsed_head_bytes = 0
        self._url = b""
        self._headers = []
        self._body = []
        self._body_bytes = 0
        self._counted = False
        self._inflater = None
        self._skip = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # not trailers: those are ignored
            self._headers.append((name, value))
            self._count_head(len(name) + len(value))

    def _count_head(self, size: int) -> None:
        self._parsed_head_bytes += size
        if self._parsed_head_bytes > MAX_HEADER_BYTES:
            self._reject(431, "request headers are too large", "headers_too_large")
            raise httptools.HttpParserError("request headers are too large")

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self.parser
        headers: dict[str, str] = {}
        length = 0
        chunked = expect = coded = False
        hosts = 0
        for raw_name, raw_value in self._headers:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("utf-8", "surrogateescape")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
            if name in _SPECIAL:
                if name == "content-length":
                    length = int(raw_value)  # digits only: the parser checked
                elif name == "transfer-encoding":
                    chunked = True  # the parser checked that chunked is the last coding
                elif name == "host":
                    hosts += 1
                elif name == "expect":
                    expect = raw_value.lower() == b"100-continue"
                else:
                    coded = True
        target = self._url.decode("latin-1")
        version = parser.get_http_version()
        request = self._request = Request(
            method=parser.get_method().decode("latin-1"),
            target=target,
            path=target.split("?", 1)[0],
            headers=headers,
            body=b"",
            http_version=version,
        )
        has_body = length > 0 or chunked
        if hosts != 1 and (hosts or version == "1.1"):
            problem = "has no Host header" if not hosts else "has more than one Host header"
            self._answer_early(request, error_answer(400, f"the request {problem}", *_BAD_HOST))
            return
        if chunked and headers["transfer-encoding"].strip().lower() != "chunked":
            coding = _printable(headers["transfer-encoding"])
            message = f"transfer coding '{coding}' is not supported (only chunked)"
            self._answer_early(request, error_answer(501, message, *_BAD_TRANSFER_CODING))
            return
        server = self.server
        if server.on_head is not None:
            try:
                refusal = server.on_head(request)
            except Exception:
                log.exception("head check failed for %s %s", request.method, request.path)
                refusal = _HEAD_CHECK_FAILED
            if refusal is not None:
                if has_body:
                    self._answer_early(request, refusal)
                else:  # nothing to skip: the connection can go on
                    self._skip = True
                    self._dispatch(request, parser.should_keep_alive(), refusal)
                return
        if length > server.max_body_bytes:
            self._answer_early(request, _TOO_LARGE)
            return
        if not has_body:
            pass  # no body to decode or to hold
        elif coded and not self._start_decoding(request):
            return
        elif length and self._inflater is None:
            if server.buffered_body_bytes + length > server.max_buffered_body_bytes:
                self._answer_early(request, server.buffers_full)
                return
            server.buffered_body_bytes += length
            self._body_bytes = length
        else:
            self._counted = self._inflater is None
        if has_body:
            self.in_body = True
            self.body_since = self._loop.time()
        if expect and self._task is None and version != "1.0":
            # Only between answers: inside one it would corrupt that answer's framing.
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _start_decoding(self, request: Request) -> bool:
        """Set up the decompression ``Content-Encoding`` asks for; False when it cannot be
        done (answered 415)."""
        value = request.headers.pop("content-encoding")
        names = (c.strip().lower() for c in value.split(","))
        codings = [c for c in names if c and c != "identity"]  # identity: no coding
        if not codings:
            return True
        if len(codings) == 1 and codings[0] in _CODINGS:
            self._inflater = _Inflater(_CODINGS[codings[0]])
            return True
        message = (
            f"content encoding '{_printable(value)}' is not supported "
            "(supported: gzip, x-gzip, deflate, identity; one at most)"
        )
        self._answer_early(request, error_answer(415, message, *_BAD_CONTENT_CODING))
        return False

    def on_body(self, body: bytes) -> None:
        if self._skip:
            return
        if self._inflater is not None:
            self._inflate(body)
            return
        self._body.append(body)
        if self._counted:  # chunked, without a length
            server = self.server
            size = len(body)
            self._body_bytes += size
            server.buffered_body_bytes += size
            if self._body_bytes > server.max_body_bytes:
                self._answer_early(self._request, _TOO_LARGE)
            elif server.buffered_body_bytes > server.max_buffered_body_bytes:
                self._answer_early(self._request, server.buffers_full)

    def _inflate(self, data: bytes) -> None:
        server = self.server
        assert self._inflater is not None
        try:
            out = self._inflater.feed(data, server.max_body_bytes - self._body_bytes)
        except zlib.error as exc:
            self._answer_early(self._request, _corrupt_body(exc))
            return
        if out is None:
            self._answer_early(self._request, _TOO_LARGE)
            return
        size = len(out)
        if size:
            self._body.append(out)
            self._body_bytes += size
            server.buffered_body_bytes += size
            if server.buffered_body_bytes > server.max_buffered_body_bytes:
                self._answer_early(self._request, server.buffers_full)

    def on_message_complete(self) -> None:
        if self._skip:
            return
        request = self._request
        assert request is not None
        if self._inflater is not None:
            try:
                self._inflater.finish()
            except zlib.error as exc:
                self._answer_early(request, _corrupt_body(exc))
                return
            if "content-length" in request.headers:  # it was the compressed size
                request.headers["content-length"] = str(self._body_bytes)
        body = self._body
        request.body = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        self.in_body = False
        self._dispatch(request, self.parser.should_keep_alive(), None, self._body_bytes)

    # -------------------------------------------------------------- requests

    def _answer_early(self, request: Request | None, answer: Refusal) -> None:
        """Answer the request in progress without (the rest of) its body, and read no
        more."""
        if self.in_body:
            self.in_body = False
            self.server.buffered_body_bytes -= self._body_bytes
        self._body = []
        self._body_bytes = 0
        self._inflater = None
        self._skip = True
        self._unread = True
        self._dispatch(request or _blank_request(), False, answer)

    def body_timed_out(self) -> None:
        """The body in progress took longer than ``body_timeout_s``: a 408, and close."""
        self.server.body_timeouts += 1
        timeout = self.server.body_timeout_s
        answer = error_answer(
            408, f"the request body was not received within {timeout:g} s", *_SLOW_BODY
        )
        self._answer_early(self._request, answer)

    def _dispatch(
        self, request: Request, keep_alive: bool, answer: Refusal | None = None, held: int = 0
    ) -> None:
        """Answer ``request`` now, or after those queued (``held``: its body's bytes of
        budget)."""
        if self.closed or self.input_done:
            self.server.buffered_body_bytes -= held
            return
        if not keep_alive:
            self.input_done = True  # nothing after this request is read
        if self._task is None:
            self._running_bytes = held  # before the task starts: it may never (a client gone)
            self._task = self._loop.create_task(self._run(request, keep_alive, answer))
        else:  # pipelined: after the one being answered
            if len(self._pending) >= _PIPELINE_HARD_LIMIT * self.server.max_pipelined:
                # More than one read's worth arrived at once: answer what is queued, close.
                self.input_done = True
                self._unread = True
                self.server.buffered_body_bytes -= held
                return
            self._pending.append((request, keep_alive, answer, held))
            self._update_reading()

    async def _run(self, request: Request, keep_alive: bool, answer: Refusal | None) -> None:
        server = self.server
        while True:
            responder = Responder(self, request, keep_alive and not server.stopping)
            try:
                if answer is None:
                    await server.handler(request, responder)
                elif answer is _TOO_LARGE:
                    server.on_too_large(request, responder)
                else:
                    responder.send(answer.status, answer.headers, answer.body)
                if not responder.started:
                    responder.send(500, _JSON, _NO_ANSWER)
                elif not responder.ended:
                    # A stream left unfinished: the client must see it break off.
                    log.error(
                        "handler for %s %s left its answer unfinished", request.method, request.path
                    )
                    self.close()
                    return
            except asyncio.CancelledError:
                self.close()
                raise
            except Exception:
                log.exception("unexpected error answering %s %s", request.method, request.path)
                if responder.started:
                    self.close()  # the answer is broken off: the client sees it end early
                    return
                responder.send(500, _JSON, _INTERNAL_ERROR)
            finally:
                # The request is done with its body: its bytes leave the budget.
                server.buffered_body_bytes -= self._running_bytes
                self._running_bytes = 0
            if not responder.keep_alive or self.closed:
                self.close_after_write()
                return
            if not self._pending:
                if self.input_done:
                    self.close_after_write()
                else:
                    self._task = None
                    self.idle_since = self._loop.time()
                return
            if self._write_paused:  # the client is not taking its answers: wait for it
                try:
                    await self.drain()
                except ConnectionError:
                    return
            request, keep_alive, answer, self._running_bytes = self._pending.popleft()
            self._update_reading()

    def _reject(self, status: int, message: str, code: str) -> None:
        """The input cannot be read further: answer ``status`` and close — after the
        answers to the requests read before."""
        if self.closed or self.input_done:
            return
        reason = code.replace("_", "-")
        self._answer_early(None, error_answer(status, message, code, reason))

    def _end_input(self) -> None:
        """Read no more: answer what is queued, then close."""
        self.input_done = True
        if self._task is None:
            self.close_after_write()

    # -------------------------------------------------------------- writing

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def drain(self) -> None:
        """Wait while the client is not taking the bytes written (at most
        ``idle_timeout_s``: then the connection is cut)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self._write_paused:
            waiter = self._loop.create_future()
            self._drain = waiter
            try:
                await asyncio.wait_for(waiter, self.server.idle_timeout_s)
            except TimeoutError:
                self.close()
                raise ConnectionResetError("the client stopped reading") from None
            finally:
                self._drain = None
            if self.transport.is_closing():
                raise ConnectionResetError("the client closed the connection")

    def _wake_writer(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def close_after_write(self) -> None:
        """Close once what was written has gone out (cut off by the idle check if the
        client never takes it)."""
        transport = self.transport
        if self.closed or transport is None:
            return
        self.closed = True
        self.idle_since = self._loop.time()
        if self._unread and transport.can_write_eof():
            # The client may still be sending what will not be read: end the answer with
            # a FIN and discard the input a while, rather than a reset that can destroy
            # the answer in the client's buffers.
            transport.write_eof()
            if self.reading_paused:
                self.reading_paused = False
                transport.resume_reading()
            self._loop.call_later(LINGER_S, self.close)
        else:
            transport.close()

    def close(self) -> None:
        """Close now, discarding what was not sent."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The handler task answering this connection's requests, if any."""
        return self._task


_JSON = (("content-type", "application/json"),)
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


class HttpServer:
    """Listens and runs ``handler`` for every request (see the module docstring)."""

    def __init__(
        self,
        handler: Handler,
        on_too_large: TooLarge,
        max_body_bytes: int,
        max_pipelined: int = 16,
        idle_timeout_s: float = 75.0,
        *,
        on_head: HeadCheck | None = None,
        max_connections: int = 4096,
        max_buffered_body_bytes: int = 256 * 1024 * 1024,
        body_timeout_s: float = 60.0,
    ) -> None:
        self.on_head = on_head
        """Sees each request's head first (see :data:`HeadCheck`)."""
        self.max_connections = max_connections
        """Client connections open at once; one more is answered 503 and closed."""
        self.max_buffered_body_bytes = max_buffered_body_bytes
        """Request-body bytes held across all connections (being read, or waiting for or
        in their handler); a body that would pass it is answered 503."""
        self.body_timeout_s = body_timeout_s
        """Longest a request's body may take to arrive after its head (s); then a 408."""
        self.handler = handler
        self.on_too_large = on_too_large
        self.max_body_bytes = max_body_bytes
        """Largest request body, decompressed (bytes)."""
        self.max_pipelined = max_pipelined
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[_HttpConnection] = set()
        self.stopping = False
        self.connections_refused = 0
        """Connections answered 503 for passing ``max_connections`` (cumulative)."""
        self.buffered_body_bytes = 0
        """Request-body bytes held now (see ``max_buffered_body_bytes``)."""
        self.body_timeouts = 0
        """Requests answered 408 for a body slower than ``body_timeout_s`` (cumulative)."""
        busy = error_answer(
            503, "too many client connections", "too_many_connections", "connection-limit", 1
        )
        self.busy_answer = (
            _encode(
                f"HTTP/1.1 503 {_REASONS[503]}\r\n"
                + "".join(f"{name}: {value}\r\n" for name, value in busy.headers)
                + f"content-length: {len(busy.body)}\r\nconnection: close\r\n\r\n"
            )
            + busy.body
        )
        """The whole answer to a connection over ``max_connections``."""
        self.buffers_full = error_answer(
            503,
            "the gateway holds too many request bodies; retry later",
            "body_buffers_full",
            "body-buffers-full",
            1,
        )
        self._server: asyncio.AbstractServer | None = None
        self._reaper: asyncio.Task[None] | None = None

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        return len(self.connections)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: any free port); returns the port."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 2 * self.max_connections + 64  # a client's socket and an upstream one each
        if soft != resource.RLIM_INFINITY and soft < wanted:
            log.warning(
                "the process may open %d files, but %d client connections may need about %d "
                "(raise `ulimit -n`, or lower the connection limit)",
                soft,
                self.max_connections,
                wanted,
            )
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HttpConnection(self), host, port, reuse_address=True, backlog=1024
        )
        self._reaper = loop.create_task(self._close_idle())
        sockets = self._server.sockets
        bound: int = sockets[0].getsockname()[1]
        return bound

    async def _close_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self.idle_timeout_s, self.body_timeout_s) / 4)
            now = loop.time()
            for conn in list(self.connections):
                if conn.in_body:
                    # While the server does not read, the clock is not the client's.
                    late = now - conn.body_since >= self.body_timeout_s
                    if late and not conn.reading_paused:
                        conn.body_timed_out()
                elif conn.task is None and now - conn.idle_since >= self.idle_timeout_s:
                    if conn.closed:
                        conn.close()  # its last bytes were never taken
                    else:
                        conn.close_after_write()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop listening, close idle connections, give requests in progress ``grace_s``
        seconds to finish, then cut them off."""
        self.stopping = True
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = []
        for conn in list(self.connections):
            task = conn.task
            if task is None or task.done():
                conn.close_after_write()
            else:
                tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        unfinished = [t for t in tasks if not t.done()]
        for conn in list(self.connections):
            if conn.task is not None and not conn.task.done():
                conn.close()  # cancels what is still running
        if unfinished:
            await asyncio.wait(unfinished, timeout=1.0)
        if self.connections:
            await asyncio.sleep(0.1)  # last answers going out
            for conn in list(self.connections):
                conn.close()  # a client that does not take its last bytes
        if server is not None:
            await server.wait_closed()


__all__ = [
    "LINGER_S",
    "MAX_HEADER_BYTES",
    "HeadCheck",
    "HttpServer",
    "Refusal",
    "Request",
    "Responder",
    "error_answer",
]
