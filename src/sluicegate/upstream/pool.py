"""Requests to model servers over pooled keep-alive HTTP/1.1 connections.

The proxy's client: per request it costs one write and the C parser's callbacks, where a
general-purpose client (cookies, redirects, tracing hooks, URL objects, multidicts) costs
several times that on the gateway's hot path. It speaks only what model servers need:
HTTP/1.1 (``http`` or ``https``), requests with a body of known length, answers with a
length, chunked, or ended by the server closing.

Connections are kept per endpoint ``(scheme, host, port)``, newest reused first, at most
``max_idle_per_endpoint`` idle ones each (more are closed as they come back), and for at
most ``idle_timeout_s``: 4 s, under the 5 s after which uvicorn-based servers such as vLLM
close an idle connection, so the gateway, not the server, usually ends it. Expired ones are
closed when their endpoint is next asked for, and all of them at least every
``idle_timeout_s`` (endpoints that left the pool included). Sockets have TCP keep-alive on,
so a peer that vanished without a word is found out. A connection the server closed while
idle is forgotten when the close is noticed; when a reused connection turns out closed
before any byte of the answer within ``_RESEND_WITHIN_S`` of the write (the server's
keep-alive timer won the race: it never saw the request), the request is sent once more on
a fresh connection. A later drop is the server failing while it worked on the request, and
is the caller's to handle (the proxy tries another endpoint).

The exchanges in progress are registered per endpoint (only while they last: an answer
leaves the register when it is released, closed or aborted), so that
:meth:`UpstreamPool.abort` can end every one of them at once when their endpoint is found
stalled: each fails with
:class:`~sluicegate.upstream.errors.UpstreamAbortedError`, a drop, which the proxy retries
elsewhere when nothing reached its client yet.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable

from sluicegate.upstream.connection import MAX_BUFFER_BYTES, Connection, UpstreamResponse
from sluicegate.upstream.errors import (
    UpstreamAbortedError,
    UpstreamConnectError,
    UpstreamDroppedError,
)

_SMALL_BODY_BYTES = 64 * 1024
"""Bodies up to this size go out in the same write as the request head (bytes)."""
_RESEND_WITHIN_S = 0.25
"""A reused connection closed this soon after the request was written, before any byte of
an answer, lost the keep-alive race: the request is sent again (seconds)."""


class UpstreamPool:
    """Keep-alive connections to model servers, and the requests sent over them.

    Timeouts in seconds: ``connect_timeout_s`` for a new connection (TLS handshake
    included), ``read_timeout_s`` for each wait for bytes of an answer (not its total
    duration: a long generation keeps streaming).
    """

    def __init__(
        self,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 600.0,
        max_idle_per_endpoint: int = 256,
        max_buffer_bytes: int = MAX_BUFFER_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        idle_timeout_s: float = 4.0,
    ) -> None:
        if max_idle_per_endpoint < 0:
            raise ValueError("max_idle_per_endpoint must be >= 0")
        if idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be > 0")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_endpoint = max_idle_per_endpoint
        self.max_buffer_bytes = max_buffer_bytes
        self.idle_timeout_s = idle_timeout_s
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._live: dict[tuple[str, str, int], set[UpstreamResponse]] = {}
        """Exchanges sent and not ended yet, per endpoint (emptied sets go at a sweep)."""
        self._next_sweep = 0.0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def idle_connections(self) -> int:
        """Idle connections kept, over all endpoints."""
        return sum(len(conns) for conns in self._idle.values())

    def live_exchanges(self) -> int:
        """Exchanges in progress (sent, not released or closed yet), over all endpoints."""
        return sum(len(live) for live in self._live.values())

    def waiting(self, scheme: str, host: str, port: int) -> int:
        """Exchanges in progress with endpoint ``(scheme, host, port)`` whose reader is
        waiting for bytes from the server now — not, say, for a slow client to take the
        bytes already read. O(its exchanges in progress)."""
        live = self._live.get((scheme, host, port))
        return sum(1 for response in live if response.waiting) if live else 0

    def abort(self, scheme: str, host: str, port: int, reason: str = "") -> int:
        """End the exchanges in progress with endpoint ``(scheme, host, port)`` that wait
        for its bytes now (see :meth:`waiting`; one held up by a slow client reading what
        arrived is left alone): each connection is closed and its reader gets
        :class:`~sluicegate.upstream.errors.UpstreamAbortedError` (saying why: ``reason``).
        Idle connections are left alone. Returns how many exchanges were aborted."""
        key = (scheme, host, port)
        live = self._live.get(key)
        if not live:
            return 0
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        why = f": {reason}" if reason else ""
        stuck = [response for response in live if response.waiting]
        for response in stuck:
            live.discard(response)
            response.abort(
                UpstreamAbortedError(f"the gateway aborted the exchange with {authority}{why}")
            )
        if not live:
            self._live.pop(key, None)
        return len(stuck)

    async def request(
        self,
        scheme: str,
        host: str,
        port: int,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes = b"",
        first_byte_timeout_s: float | None = None,
        abortable: bool = True,
    ) -> UpstreamResponse:
        """Send a request and return the answer once its status and headers arrived.

        ``first_byte_timeout_s``, when given, bounds the time from now until the status
        and headers arrived and the first body chunk was read (connecting included;
        :meth:`UpstreamResponse.first_byte_by`). ``abortable``: whether :meth:`abort` and
        :meth:`waiting` see the exchange (the requests the gateway relays, not its own
        metric scrapes, which have a short timeout of their own).

        ``target`` is the path and query; ``headers`` must not include ``Host``,
        ``Content-Length``, ``Transfer-Encoding`` or ``Connection`` (set here). Raises
        :class:`~sluicegate.upstream.errors.UpstreamError` subclasses; ``ValueError`` for a
        header containing a line break.
        """
        if self._closed:
            raise UpstreamConnectError("the upstream pool is closed")
        key = (scheme, host, port)
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = _request_head(method, target, authority, headers, body, method != "GET")
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = None if first_byte_timeout_s is None else now + first_byte_timeout_s
        if now >= self._next_sweep:
            self._sweep(now)
        connection = self._take_idle(key, now)
        if connection is not None:
            response = self._send(connection, loop, head, body, abortable)
            response.first_byte_by(deadline, first_byte_timeout_s or 0.0)
            try:
                await response.start()
            except UpstreamDroppedError as exc:
                response.close()
                if (
                    response.received_any
                    or loop.time() - now > _RESEND_WITHIN_S
                    or isinstance(exc, UpstreamAbortedError)  # ours: not the keep-alive race
                ):
                    raise
            except BaseException:
                response.close()
                raise
            else:
                return response
        connection = await self._connect(key, authority, loop)
        response = self._send(connection, loop, head, body, abortable)
        response.first_byte_by(deadline, first_byte_timeout_s or 0.0)
        try:
            await response.start()
        except BaseException:
            response.close()
            raise
        return response

    async def close(self) -> None:
        """Close every idle connection; connections still answering close when their
        answers are released."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.on_lost = None
                conn.close()
        self._idle.clear()

    # ------------------------------------------------------------------ internals

    def _send(
        self,
        connection: Connection,
        loop: asyncio.AbstractEventLoop,
        head: bytes,
        body: bytes,
        abortable: bool,
    ) -> UpstreamResponse:
        response = UpstreamResponse(
            connection,
            loop,
            self.read_timeout_s,
            self._release,
            self.max_buffer_bytes,
            self._ended if abortable else None,
        )
        if abortable:
            live = self._live.get(connection.key)
            if live is None:
                live = self._live[connection.key] = set()
            live.add(response)
        transport = connection.transport
        assert transport is not None
        if len(body) <= _SMALL_BODY_BYTES:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        return response

    def _take_idle(self, key: tuple[str, str, int], now: float) -> Connection | None:
        conns = self._idle.get(key)
        while conns:
            conn = conns.pop()  # the newest: the least likely to be expiring
            conn.on_lost = None
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                continue
            if now - conn.idle_since >= self.idle_timeout_s:
                conn.close()  # so are all older ones
                for older in conns:
                    older.on_lost = None
                    older.close()
                conns.clear()
                break
            if not conns:
                del self._idle[key]
            return conn
        self._idle.pop(key, None)
        return None

    def _release(self, connection: Connection) -> None:
        if self._closed:
            connection.close()
            return
        conns = self._idle.setdefault(connection.key, [])
        if len(conns) >= self.max_idle_per_endpoint:
            connection.close()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        connection.on_lost = self._forget
        conns.append(connection)

    def _ended(self, response: UpstreamResponse) -> None:
        live = self._live.get(response.connection.key)
        if live is not None:
            live.discard(response)

    def _forget(self, connection: Connection) -> None:
        conns = self._idle.get(connection.key)
        if conns is not None and connection in conns:
            conns.remove(connection)
            if not conns:
                del self._idle[connection.key]

    def _sweep(self, now: float) -> None:
        """Close every idle connection past ``idle_timeout_s``, whichever endpoint."""
        self._next_sweep = now + self.idle_timeout_s
        for key in [k for k, live in self._live.items() if not live]:
            del self._live[key]
        for key in list(self._idle):
            conns = self._idle[key]
            fresh = [c for c in conns if now - c.idle_since < self.idle_timeout_s]
            for conn in conns:
                if now - conn.idle_since >= self.idle_timeout_s:
                    conn.on_lost = None
                    conn.close()
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]

    async def _connect(
        self, key: tuple[str, str, int], authority: str, loop: asyncio.AbstractEventLoop
    ) -> Connection:
        scheme, host, port = key
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl_context is None:  # loading the CA bundle is slow: once per pool
                self._ssl_context = ssl.create_default_context()
            tls = self._ssl_context
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, connection = await loop.create_connection(
                    lambda: Connection(key), host, port, ssl=tls
                )
        except TimeoutError:  # before OSError, its base class
            raise UpstreamConnectError(
                f"connecting to {authority} timed out after {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {authority}: {exc}") from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return connection


def _request_head(
    method: str,
    target: str,
    authority: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    send_length: bool,
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n"]
    for name, value in headers:
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}\r\n")
    if send_length or body:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


__all__ = ["UpstreamPool"]
