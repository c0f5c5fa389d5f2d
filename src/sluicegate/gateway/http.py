"""The gateway's HTTP/1.1 server: asyncio protocols and ``httptools``' C parser.

Only what an OpenAI-compatible gateway needs, at a fraction of a general web framework's
cost per request (routing tables, middleware chains, request and response objects with
cookies, multipart and compression): requests with a body of known length or chunked,
keep-alive and pipelining (answered in order, one at a time per connection), answers whole
(``Content-Length``) or streamed (chunked, written as they come, with back-pressure).

- The handler gets a :class:`Request` (headers with lower-case names; repeated ones joined
  with ``", "``; trailers ignored) and a :class:`Responder`, and answers with exactly one
  of :meth:`Responder.send` or :meth:`Responder.stream`. Answers to ``HEAD`` carry no body.
- A body over ``max_body_bytes`` is answered by ``on_too_large`` and the connection closed
  (the rest of the body is not read); a request head over ``MAX_HEADER_BYTES`` is a 431;
  malformed input a 400. ``Expect: 100-continue`` is honoured.
- Memory per connection is bounded: reading stops while ``max_pipelined`` requests wait or
  while the client is not reading its answers (the transport's write buffer is full).
- A client that disconnects cancels its handler task, so whatever it awaits (an upstream
  request) is abandoned too. (A half-close counts as leaving: at the TCP level it looks
  the same as a client that closed, and generating for one that left is the costlier
  mistake.)
- A connection with no request in progress for ``idle_timeout_s`` is closed, whether it is
  idle between requests or still trickling in a request's head (75 s by default, aiohttp's
  keep-alive timeout), and so is one whose client has not taken an answer's bytes for as
  long; connections are checked every ``idle_timeout_s / 4``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus

import httptools

log = logging.getLogger("sluicegate.gateway")

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_CHUNKED_END = b"0\r\n\r\n"
MAX_HEADER_BYTES = 64 * 1024
"""Largest request line plus headers accepted (bytes); more is a 431."""
_PIPELINE_HARD_LIMIT = 8
"""Reading stops at ``max_pipelined`` waiting requests, but one read may hold more: past
this many times ``max_pipelined`` the connection is closed after what is queued."""


def _encode(text: str) -> bytes:
    # Header values arrive decoded as UTF-8 with surrogate escapes: this restores the bytes.
    return text.encode("utf-8", "surrogateescape")


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
and runs the handler; a :class:`Refusal` is answered without reading the body."""


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
        self.last_answer = False
        """Close after the answer being written (the rest of the input is unusable)."""
        self._in_head = False
        self._head_bytes = 0
        self._parsed_head_bytes = 0
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._too_large = False
        self._pending: deque[tuple[Request, bool, bool]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._write_paused = False
        self._reading_paused = False
        self._drain: asyncio.Future[None] | None = None

    # -------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport
        self.idle_since = asyncio.get_running_loop().time()
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.last_answer:
            return  # the rest of the input is not read
        if self._in_head:
            self._head_bytes += len(data)  # a head line that never ends is still counted
            if self._head_bytes > MAX_HEADER_BYTES:
                self._reject(431, "request headers are too large")
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request itself was complete and is answered as a plain one; what follows
            # is another protocol, which the gateway does not speak.
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._reject(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
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
        if stop and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not stop and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    # -------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._parsed_head_bytes = 0
        self._url = b""
        self._headers = []
        self._body = []
        self._body_bytes = 0
        self._too_large = False

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
            self._reject(431, "request headers are too large")
            raise httptools.HttpParserError("request headers are too large")

    def on_headers_complete(self) -> None:
        self._in_head = False
        length = 0
        expect = False
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length" and value.strip().isdigit():
                length = int(value)
            elif lower == b"expect" and value.lower() == b"100-continue":
                expect = True
        if length > self.server.max_body_bytes:
            self._too_large = True  # answered without the body, then closed
            self._dispatch(self._request(b""), keep_alive=False, too_large=True)
            return
        if expect and self._task is None and self.parser.get_http_version() != "1.0":
            # Only between answers: inside one it would corrupt that answer's framing.
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self.server.max_body_bytes:  # chunked, without a length
            self._too_large = True
            self._body = []
            self._dispatch(self._request(b""), keep_alive=False, too_large=True)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._too_large:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._dispatch(self._request(body), self.parser.should_keep_alive())

    # -------------------------------------------------------------- requests

    def _request(self, body: bytes) -> Request:
        headers: dict[str, str] = {}
        for raw_name, raw_value in self._headers:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("utf-8", "surrogateescape")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        target = self._url.decode("latin-1")
        return Request(
            method=self.parser.get_method().decode("latin-1"),
            target=target,
            path=target.split("?", 1)[0],
            headers=headers,
            body=body,
            http_version=self.parser.get_http_version(),
        )

    def _dispatch(self, request: Request, keep_alive: bool, too_large: bool = False) -> None:
        if self.closed or self.last_answer:
            return
        if too_large:
            keep_alive = False
            self.last_answer = True  # the rest of the body is not read
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(request, keep_alive, too_large)
            )
        else:  # pipelined: after the one being answered
            if len(self._pending) >= _PIPELINE_HARD_LIMIT * self.server.max_pipelined:
                # More than one read's worth arrived at once: answer what is queued, close.
                self.last_answer = True
                return
            self._pending.append((request, keep_alive, too_large))
            self._update_reading()

    async def _run(self, request: Request, keep_alive: bool, too_large: bool) -> None:
        while True:
            responder = Responder(self, request, keep_alive and not self.server.stopping)
            try:
                if too_large:
                    self.server.on_too_large(request, responder)
                else:
                    await self.server.handler(request, responder)
                if not responder.started:
                    responder.send(500, (), b"no answer")
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
                responder.send(500, (("content-type", "text/plain"),), b"internal error")
            if not responder.keep_alive or self.closed or self.last_answer:
                self.close_after_write()
                return
            if not self._pending:
                self._task = None
                self.idle_since = asyncio.get_running_loop().time()
                return
            if self._write_paused:  # the client is not taking its answers: wait for it
                try:
                    await self.drain()
                except ConnectionError:
                    return
            request, keep_alive, too_large = self._pending.popleft()
            self._update_reading()

    def _reject(self, status: int, message: str) -> None:
        """The input cannot be read further: answer ``status`` and close — after the
        answers already queued, when there are some."""
        if self.closed or self.last_answer:
            return
        if self._task is not None:
            self.last_answer = True
            return
        body = message.encode()
        reason = _REASONS.get(status, "Error")
        self.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
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
            waiter = asyncio.get_running_loop().create_future()
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
        if not self.closed and self.transport is not None:
            self.closed = True
            self.idle_since = asyncio.get_running_loop().time()
            self.transport.close()

    def close(self) -> None:
        """Close now, discarding what was not sent."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The handler task answering this connection's requests, if any."""
        return self._task


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
        self.max_connections = max_connections
        """Client connections open at once; more are refused."""
        self.max_buffered_body_bytes = max_buffered_body_bytes
        """Request-body bytes buffered across all connections; more are refused."""
        self.body_timeout_s = body_timeout_s
        """Longest a request's body may take to arrive after its head (s)."""
        self.handler = handler
        self.on_too_large = on_too_large
        self.max_body_bytes = max_body_bytes
        self.max_pipelined = max_pipelined
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[_HttpConnection] = set()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: any free port); returns the port."""
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
            await asyncio.sleep(self.idle_timeout_s / 4)
            now = loop.time()
            for conn in list(self.connections):
                if conn.task is None and now - conn.idle_since >= self.idle_timeout_s:
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


__all__ = ["MAX_HEADER_BYTES", "HeadCheck", "HttpServer", "Refusal", "Request", "Responder"]
