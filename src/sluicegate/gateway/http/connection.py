"""One client connection: parses requests with ``httptools`` and answers them in order
(see :mod:`sluicegate.gateway.http` for what it promises)."""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from typing import TYPE_CHECKING

import httptools

from sluicegate.gateway.http.inflate import _CODINGS, _Inflater
from sluicegate.gateway.http.messages import (
    _BAD_CONTENT_CODING,
    _BAD_HOST,
    _BAD_TRANSFER_CODING,
    _HEAD_CHECK_FAILED,
    _INTERNAL_ERROR,
    _JSON,
    _NO_ANSWER,
    _PIPELINE_HARD_LIMIT,
    _SLOW_BODY,
    _SPECIAL,
    _TOO_LARGE,
    LINGER_S,
    MAX_HEADER_BYTES,
    Refusal,
    Request,
    _blank_request,
    _corrupt_body,
    _printable,
    error_answer,
    log,
)
from sluicegate.gateway.http.responder import ConnectionResponder

if TYPE_CHECKING:
    from sluicegate.gateway.http.server import HttpServer


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
        if has_body:  # (a request without one has nothing to decode or to hold)
            if coded and not self._start_decoding(request):
                return
            # Bytes count against the budget as they arrive, a declared length too: heads
            # alone, their bodies never sent, must not be able to hold it all.
            self._counted = self._inflater is None
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
        if self._counted:
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
            responder = ConnectionResponder(self, request, keep_alive and not server.stopping)
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

    @property
    def answering(self) -> bool:
        """Whether a request is being answered (its task not finished): a connection closed
        after its last answer keeps its finished task, and is idle all the same."""
        task = self._task
        return task is not None and not task.done()
