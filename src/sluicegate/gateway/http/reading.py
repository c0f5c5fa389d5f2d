"""Reading a request from the parser's callbacks (part of
:mod:`sluicegate.gateway.http.connection`): its head checked as it completes (Host,
codings, the head check, the size limits), its body counted against the budget and
decompressed as it arrives, and the answers given before a request is read in full."""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING

import httptools

from sluicegate.gateway.http.inflate import _CODINGS, _Inflater
from sluicegate.gateway.http.messages import (
    _BAD_CONTENT_CODING,
    _BAD_HOST,
    _BAD_TRANSFER_CODING,
    _HEAD_CHECK_FAILED,
    _SLOW_BODY,
    _SPECIAL,
    _TOO_LARGE,
    MAX_HEADER_BYTES,
    Refusal,
    Request,
    _blank_request,
    _corrupt_body,
    _printable,
    error_answer,
    log,
)

if TYPE_CHECKING:
    from sluicegate.gateway.http.server import HttpServer


class _RequestReader:
    """The parser callbacks of :class:`~sluicegate.gateway.http.connection._HttpConnection`
    (``httptools`` calls them on the protocol object; they run on its state)."""

    # The connection's state they read and write (set, and described, in its __init__).
    server: HttpServer
    parser: httptools.HttpRequestParser
    input_done: bool
    in_body: bool
    body_since: float
    closed: bool
    _loop: asyncio.AbstractEventLoop
    _task: asyncio.Task[None] | None
    _messages: int
    _in_head: bool
    _head_bytes: int
    _parsed_head_bytes: int
    _url: bytes
    _headers: list[tuple[bytes, bytes]]
    _request: Request | None
    _body: list[bytes]
    _body_bytes: int
    _counted: bool
    _inflater: _Inflater | None
    _skip: bool
    _unread: bool

    if TYPE_CHECKING:  # the connection's own, which answer

        def _dispatch(
            self, request: Request, keep_alive: bool, answer: Refusal | None = None, held: int = 0
        ) -> None: ...

        def write(self, data: bytes) -> None: ...

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

    # -------------------------------------------------------------- early answers

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

    def _reject(self, status: int, message: str, code: str) -> None:
        """The input cannot be read further: answer ``status`` and close — after the
        answers to the requests read before."""
        if self.closed or self.input_done:
            return
        reason = code.replace("_", "-")
        self._answer_early(None, error_answer(status, message, code, reason))


__all__: list[str] = []
