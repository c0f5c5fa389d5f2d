"""One client connection: parses requests with ``httptools`` and answers them in order
(see :mod:`sluicegate.gateway.http` for what it promises). The parser's callbacks, reading
each request's head and body, are in :mod:`sluicegate.gateway.http.reading`."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

import httptools

from sluicegate.gateway.http.inflate import _Inflater
from sluicegate.gateway.http.messages import (
    _INTERNAL_ERROR,
    _JSON,
    _NO_ANSWER,
    _PIPELINE_HARD_LIMIT,
    _TOO_LARGE,
    LINGER_S,
    MAX_HEADER_BYTES,
    Refusal,
    Request,
    log,
)
from sluicegate.gateway.http.reading import _RequestReader
from sluicegate.gateway.http.responder import ConnectionResponder

if TYPE_CHECKING:
    from sluicegate.gateway.http.server import HttpServer


class _HttpConnection(_RequestReader, asyncio.Protocol):
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

    # -------------------------------------------------------------- requests

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
