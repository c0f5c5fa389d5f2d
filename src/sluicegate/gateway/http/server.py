"""Listening, the client limits shared by all connections, and stopping gracefully."""

from __future__ import annotations

import asyncio
import resource

from sluicegate.gateway.http.connection import _HttpConnection
from sluicegate.gateway.http.messages import (
    _REASONS,
    Handler,
    HeadCheck,
    TooLarge,
    _encode,
    error_answer,
    log,
)


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
                elif not conn.answering and now - conn.idle_since >= self.idle_timeout_s:
                    if conn.closed:
                        conn.close()  # its last bytes were never taken
                    else:
                        conn.close_after_write()

    def drain(self) -> None:
        """From now on every answer closes its connection (``Connection: close``): clients
        and load balancers reconnect, elsewhere once this server is out of their rotation.
        Requests keep being served until :meth:`stop`."""
        self.stopping = True

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
