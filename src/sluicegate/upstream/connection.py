"""One keep-alive HTTP/1.1 connection to a model server, and the answer read from it.

A :class:`Connection` is an asyncio protocol that carries one exchange at a time; the
answer's bytes go through ``httptools``' C parser into an :class:`UpstreamResponse`, which
the proxy reads whole (:meth:`UpstreamResponse.read`) or as it arrives
(:meth:`UpstreamResponse.read_chunk`). Body bytes waiting to be read are bounded: past
``max_buffer_bytes`` the connection stops reading from the socket until the reader catches
up, so a slow client cannot make the gateway hold a fast server's whole answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import httptools

from sluicegate.upstream.errors import (
    UpstreamDroppedError,
    UpstreamError,
    UpstreamFirstByteTimeoutError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)

MAX_BUFFER_BYTES = 256 * 1024
"""Default bound on an answer's unread body bytes (bytes)."""


class Connection(asyncio.Protocol):
    """A connection to one endpoint; idle between exchanges, reused while keep-alive."""

    __slots__ = ("closed", "exchange", "idle_since", "key", "on_lost", "transport")

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        """``(scheme, host, port)`` of the endpoint."""
        self.transport: asyncio.Transport | None = None
        self.exchange: UpstreamResponse | None = None
        """The answer being read, or None while idle."""
        self.closed = False
        self.on_lost: Callable[[Connection], None] | None = None
        """Called when the connection closes while idle (to forget it)."""
        self.idle_since = 0.0
        """Event-loop time it last went idle (s)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP (or TLS) transport

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # nothing was asked: the connection is not in a known state
            self.close()
            return
        exchange.feed(data)

    def eof_received(self) -> bool:
        self.closed = True  # the server takes no more requests here; it may still be answering
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.lost(exc)
        elif self.on_lost is not None:
            self.on_lost(self)

    def close(self) -> None:
        """Close now, abandoning any exchange (the server sees the client go away)."""
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class UpstreamResponse:
    """An answer from a model server: status and headers once they have arrived, then the
    body. Exactly one of :meth:`release` (fully read: the connection may be reused) or
    :meth:`close` ends it; :meth:`release` on an unfinished answer closes instead."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_complete",
        "_deadline",
        "_error",
        "_first_byte_s",
        "_headers_done",
        "_loop",
        "_max_buffer",
        "_on_end",
        "_on_release",
        "_parser",
        "_paused",
        "_read_timeout_s",
        "_received_any",
        "_until_close",
        "_waiter",
        "connection",
        "headers",
        "keep_alive",
        "status",
    )

    def __init__(
        self,
        connection: Connection,
        loop: asyncio.AbstractEventLoop,
        read_timeout_s: float,
        on_release: Callable[[Connection], None],
        max_buffer_bytes: int = MAX_BUFFER_BYTES,
        on_end: Callable[[UpstreamResponse], None] | None = None,
    ) -> None:
        self.connection = connection
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        """Response headers in order, as sent (names as the server cased them)."""
        self.keep_alive = False
        self._loop = loop
        self._read_timeout_s = read_timeout_s
        self._on_release = on_release
        self._on_end = on_end
        """Told once when the exchange ends (released, closed or aborted): the pool's
        register of live exchanges."""
        self._max_buffer = max_buffer_bytes
        self._parser = httptools.HttpResponseParser(self)
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._headers_done = False
        self._complete = False
        self._until_close = True
        self._received_any = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        """Event-loop time by which the first byte must have been read (see
        :meth:`first_byte_by`); None once it was, or when unbounded."""
        self._first_byte_s = 0.0
        connection.exchange = self

    # ------------------------------------------------------------- reading (the proxy)

    @property
    def received_any(self) -> bool:
        """True once any byte of the answer arrived."""
        return self._received_any

    @property
    def waiting(self) -> bool:
        """True while a read waits for bytes from the server."""
        return self._waiter is not None

    @property
    def buffered_bytes(self) -> int:
        """Body bytes received and not read yet."""
        return self._buffered

    @property
    def at_eof(self) -> bool:
        """True when the whole body has been read."""
        return self._complete and not self._chunks

    def first_byte_by(self, deadline: float | None, timeout_s: float = 0.0) -> None:
        """Bound the wait for the status and headers and the first body chunk read by
        event-loop time ``deadline`` (s): past it, :class:`UpstreamFirstByteTimeoutError`
        (naming ``timeout_s``, the bound it was set from). Later reads have the read
        timeout each."""
        self._deadline = deadline
        self._first_byte_s = timeout_s

    async def start(self) -> None:
        """Wait for the status line and headers."""
        while not self._headers_done:
            await self._wait()

    async def read_chunk(self) -> bytes:
        """Body bytes that have arrived since the last call (waiting for some when there
        are none); ``b""`` at the end of the body."""
        while not self._chunks:
            if self._complete:
                return b""
            await self._wait()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._deadline = None
        self._buffered = 0
        if self._paused:
            self._paused = False
            if not self.connection.closed and self.connection.transport is not None:
                self.connection.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with the answer: keep the connection for the next request when the body
        was read to its end and the server allows it; otherwise close it."""
        self._end()
        connection = self.connection
        if connection.exchange is not self:
            return
        connection.exchange = None
        if self.at_eof and self.keep_alive and self._error is None and not connection.closed:
            self._on_release(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Abandon the answer and its connection (the server sees the client leave)."""
        self._end()
        connection = self.connection
        if connection.exchange is self:
            connection.exchange = None
        connection.close()

    def abort(self, error: UpstreamError) -> None:
        """Fail the exchange with ``error`` now and close its connection (the server sees
        the client leave): a read in progress raises ``error``, and so does every later
        one once the bytes already received are read. The reader still releases it."""
        self._end()
        self._fail(error)

    def _end(self) -> None:
        on_end = self._on_end
        if on_end is not None:
            self._on_end = None
            on_end(self)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._loop.create_future()
        self._waiter = waiter
        after = self._read_timeout_s
        first_byte = False
        if self._deadline is not None:
            left = self._deadline - self._loop.time()
            if left < after:
                after, first_byte = max(0.0, left), True
        # The error is made only if the timer fires: most waits end well.
        bound = self._first_byte_s if first_byte else after
        timer = self._loop.call_later(after, _expire, waiter, first_byte, bound)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ----------------------------------------------------- bytes in (the connection)

    def feed(self, data: bytes) -> None:
        self._received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamProtocolError("the server switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"malformed answer: {exc}"))

    def lost(self, exc: Exception | None) -> None:
        if self._complete or self._error is not None:
            return
        if self._headers_done and self._until_close and exc is None:
            # A body without length or chunking ends when the server closes.
            self.on_message_complete()
            return
        reason = f": {exc}" if exc is not None else ""
        self._fail(UpstreamDroppedError(f"the server closed the connection{reason}"))

    def _fail(self, error: Exception) -> None:
        if self._error is None and not self._complete:
            self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.connection.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        self.status = parser.get_status_code()
        if self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers.clear()
            return
        self.keep_alive = parser.should_keep_alive()
        for name, value in self.headers:
            lower = name.lower()
            if lower == "content-length" or (
                lower == "transfer-encoding" and "chunked" in value.lower()
            ):
                self._until_close = False
        self._headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > self._max_buffer and not self._paused:
            transport = self.connection.transport
            if transport is not None:
                self._paused = True
                transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:  # the end of an interim answer
            return
        self._complete = True
        self._wake()


def _expire(waiter: asyncio.Future[None], first_byte: bool, bound_s: float) -> None:
    if waiter.done():
        return
    if first_byte:
        waiter.set_exception(
            UpstreamFirstByteTimeoutError(f"no first byte from the server within {bound_s:g} s")
        )
    else:
        waiter.set_exception(UpstreamTimeoutError(f"no byte from the server within {bound_s:g} s"))


__all__ = ["MAX_BUFFER_BYTES", "Connection", "UpstreamResponse"]
