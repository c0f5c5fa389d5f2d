"""Writing one answer on its connection: whole, or streamed (chunked) with back-pressure."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sluicegate.gateway.http.messages import _CHUNKED_END, _REASONS, Request, _encode

if TYPE_CHECKING:
    from sluicegate.gateway.http.connection import _HttpConnection


class Responder(ABC):
    """What a handler writes one answer through: :meth:`send` it whole, or :meth:`stream`
    it, :meth:`write` its pieces and :meth:`end` it.

    This base keeps the state every responder shares (:attr:`started`, :attr:`ended`,
    :attr:`keep_alive`). The gateway's own server answers through a
    :class:`ConnectionResponder`; a front server of another kind (the lab's library-server
    adapters, :mod:`sluicegate.bench.gateway.servers`) subclasses this, calls :meth:`begin`
    before its status goes out and :meth:`mark_ended` once the answer is whole.
    """

    __slots__ = ("_ended", "_started", "keep_alive")

    def __init__(self, keep_alive: bool = True) -> None:
        self._started = False
        self._ended = False
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

    def begin(self) -> None:
        """Mark the answer started; a second answer to the same request is a RuntimeError."""
        if self._started:
            raise RuntimeError("the answer has already been started")
        self._started = True

    def mark_ended(self) -> None:
        """Mark the whole answer written."""
        self._ended = True

    @abstractmethod
    def send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b"") -> None:
        """The whole answer at once."""

    @abstractmethod
    def stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """Start a streamed answer; then :meth:`write` its pieces and :meth:`end` it."""

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """Send one piece of a streamed answer (waiting while the client is slow)."""

    @abstractmethod
    async def end(self, last: bytes = b"") -> None:
        """End a streamed answer, with ``last`` as its final piece."""


class ConnectionResponder(Responder):
    """Writes the answer to one request on its connection (the gateway's own server)."""

    __slots__ = ("_conn", "_head_only", "_held", "_http_10", "_streaming")

    def __init__(self, conn: _HttpConnection, request: Request, keep_alive: bool) -> None:
        # The base's fields are set here rather than through super().__init__(): one call
        # fewer for every request on the hot path.
        self._conn = conn
        self._http_10 = request.http_version == "1.0"
        self._head_only = request.method == "HEAD"
        self._started = False
        self._ended = False
        self._streaming = False
        self._held = b""
        """A streamed answer's head, written together with its first piece."""
        self.keep_alive = keep_alive

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
