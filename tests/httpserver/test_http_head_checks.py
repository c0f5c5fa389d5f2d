"""Head checks, pipelined errors answered in order, and the Host and framing rules, against
raw sockets. Every error asserts the JSON body naming the problem, that the server serves
a new connection afterwards, and that it gets back to rest (no connection, no body held)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from http_support import GET, at_rest, closed, read_answer, request, serves

from sluicegate.gateway.http import HttpServer, Refusal, Request, Responder

Start = Callable[..., Awaitable[tuple[HttpServer, int]]]


async def echo(request: Request, responder: Responder) -> None:
    responder.send(
        200, [("content-type", "text/plain")], b"%s|%s" % (request.path.encode(), request.body)
    )


def too_large(request: Request, responder: Responder) -> None:
    responder.send(413, [("content-type", "application/json")], b'{"error": "too large"}')


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    servers: list[HttpServer] = []

    async def make(handler=echo, max_body_bytes: int = 1024, **limits) -> tuple[HttpServer, int]:
        server = HttpServer(handler, too_large, max_body_bytes, **limits)
        port = await server.start("127.0.0.1", 0)
        servers.append(server)
        return server, port

    yield make
    for server in servers:
        await server.stop(0.5)


def post(path: str, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (
        path.encode(),
        size,
        body,
    )


def auth(request: Request) -> Refusal | None:
    if request.headers.get("authorization") == "Bearer k":
        return None
    return Refusal(401, [("content-type", "application/json")], b'{"error": "no key"}')


async def test_a_refused_head_is_answered_without_reading_its_body(start: Start) -> None:
    handled: list[Request] = []
    seen: list[bytes] = []

    async def handler(request: Request, responder: Responder) -> None:
        handled.append(request)
        responder.send(200, [], b"")

    def check(request: Request) -> Refusal | None:
        seen.append(request.body)
        return auth(request)

    server, port = await start(handler, max_body_bytes=1 << 20, on_head=check)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/x", b"x" * 100, length=500_000))  # most of the body never sent
    answer = await read_answer(reader)
    assert answer.status == 401
    assert answer.body == b'{"error": "no key"}'
    assert answer.headers["connection"] == "close"
    writer.write(b"x" * 100_000)  # the client goes on sending: discarded, not a reset
    assert await closed(reader)
    writer.close()
    assert not handled
    assert seen == [b""]
    assert server.buffered_body_bytes == 0
    assert await serves(port, b"GET / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n\r\n")
    assert await at_rest(server)


async def test_a_refused_head_gets_no_100_continue(start: Start) -> None:
    server, port = await start(on_head=auth)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 9000\r\nExpect: 100-continue\r\n\r\n"
    )
    answer = await read_answer(reader)  # the refusal, not an invitation to send the body
    assert answer.status == 401
    assert await closed(reader)
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\nContent-Length: 2\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"ok")
    assert (await read_answer(reader)).body == b"/x|ok"
    writer.close()
    assert await at_rest(server)


async def test_a_refused_head_without_a_body_keeps_the_connection(start: Start) -> None:
    server, port = await start(on_head=auth)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    good = b"GET /%d HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n\r\n"
    writer.write(good % 1 + good % 2 + b"GET /3 HTTP/1.1\r\nHost: t\r\n\r\n" + good % 4)
    statuses = [(await read_answer(reader)) for _ in range(4)]
    assert [a.status for a in statuses] == [200, 200, 401, 200]  # in order
    assert [a.body for a in statuses if a.status == 200] == [b"/1|", b"/2|", b"/4|"]
    writer.write(good % 5)  # still open
    assert (await read_answer(reader)).body == b"/5|"
    writer.close()
    assert await at_rest(server)


async def test_a_head_check_that_fails_is_a_500_and_logged(start: Start, caplog) -> None:
    def broken(request: Request) -> Refusal | None:
        if request.path == "/boom":
            raise RuntimeError("bug")
        return None

    server, port = await start(on_head=broken)
    with caplog.at_level(logging.ERROR, logger="sluicegate.gateway"):
        answer, _ = await request(port, post("/boom", b"{}"))
    assert answer.status == 500
    assert answer.error()["code"] == "internal_error"
    assert "bug" not in answer.body.decode()  # the fault is logged, not told
    assert any("head check failed" in r.message for r in caplog.records)
    assert await serves(port)
    assert await at_rest(server)


async def test_answers_before_a_malformed_request_come_first(start: Start) -> None:
    server, port = await start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/a", b"1") + post("/b", b"2") + post("/c", b"3") + b"BAD REQUEST\r\n\r\n")
    answers = [await read_answer(reader) for _ in range(4)]
    assert [a.body for a in answers[:3]] == [b"/a|1", b"/b|2", b"/c|3"]
    assert all("connection" not in a.headers for a in answers[:3])
    assert answers[3].status == 400
    assert answers[3].headers["connection"] == "close"
    error = answers[3].error()
    assert error["code"] == "malformed_request"
    assert "malformed HTTP request" in str(error["message"])
    assert await closed(reader)
    writer.close()
    assert await serves(port)
    assert await at_rest(server)


async def test_answers_before_an_oversized_request_come_first(start: Start) -> None:
    server, port = await start(max_body_bytes=100)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/a", b"1") + post("/b", b"2") + post("/big", b"x" * 50, length=5000))
    answers = [await read_answer(reader) for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 413]
    assert [a.body for a in answers[:2]] == [b"/a|1", b"/b|2"]
    assert answers[2].headers["connection"] == "close"
    assert answers[2].body == b'{"error": "too large"}'  # on_too_large's answer
    assert await closed(reader)
    writer.close()
    assert await serves(port)
    assert await at_rest(server)


async def test_a_head_too_large_after_good_requests_is_a_431_after_them(start: Start) -> None:
    server, port = await start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET + GET + b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    answers = [await read_answer(reader) for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 431]
    assert answers[2].error()["code"] == "headers_too_large"
    assert await closed(reader)
    writer.close()
    assert await at_rest(server)


async def test_a_head_split_across_reads_then_a_large_body_is_not_a_431(start: Start) -> None:
    """Only head bytes count toward the head limit, also when the head ends in a read that
    carries a large body."""
    server, port = await start(max_body_bytes=300_000)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)  # the server reads the first part of the head alone
    writer.write(b"Content-Length: 200000\r\n\r\n" + b"y" * 200_000)
    answer = await read_answer(reader)
    assert answer.status == 200
    assert len(answer.body) == 200_003
    writer.close()
    assert await at_rest(server)


@pytest.mark.parametrize(
    ("head", "problem"),
    [
        (b"GET / HTTP/1.1\r\nX-Tag: a\r\n\r\n", "has no Host header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "has more than one Host header"),
        (b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", "has more than one Host header"),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", "has no Host header"),
    ],
)
async def test_host_rules(start: Start, head: bytes, problem: str) -> None:
    server, port = await start()
    answer, was_closed = await request(port, head)
    assert answer.status == 400
    assert was_closed
    error = answer.error()
    assert error["code"] == "invalid_host"
    assert problem in str(error["message"])
    assert await serves(port)
    assert await at_rest(server)


async def test_http_10_without_host_is_served(start: Start) -> None:
    server, port = await start()
    answer, _ = await request(port, b"GET /old HTTP/1.0\r\n\r\n")
    assert answer.status == 200
    assert answer.body == b"/old|"
    assert await at_rest(server)


@pytest.mark.parametrize(
    ("framing", "problem"),
    [
        (b"Content-Length: 3\r\nContent-Length: 4\r\n", "Duplicate Content-Length"),
        (b"Content-Length: 3\r\nContent-Length: 3\r\n", "Duplicate Content-Length"),
        (b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "Content-Length"),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", "Content-Length"),
    ],
)
async def test_ambiguous_framing_is_a_400(start: Start, framing: bytes, problem: str) -> None:
    """Request smuggling: the parser (llhttp) refuses these; the server answers 400."""
    handled: list[Request] = []

    async def handler(request: Request, responder: Responder) -> None:
        handled.append(request)
        responder.send(200, [], b"")

    server, port = await start(handler)
    data = b"POST /x HTTP/1.1\r\nHost: t\r\n" + framing + b"\r\n3\r\nabc\r\n0\r\n\r\n"
    answer, was_closed = await request(port, data)
    assert answer.status == 400
    assert was_closed
    assert problem in str(answer.error()["message"])
    assert not handled
    assert await serves(port)
    assert await at_rest(server)


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"gzip"])
async def test_a_transfer_coding_other_than_chunked_is_a_501(start: Start, coding: bytes) -> None:
    server, port = await start()
    data = (
        b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: %s\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n" % coding
    )
    answer, was_closed = await request(port, data)
    assert answer.status == 501
    assert was_closed
    error = answer.error()
    assert error["code"] == "unsupported_transfer_coding"
    assert f"'{coding.decode()}'" in str(error["message"])
    assert await serves(port)
    assert await at_rest(server)


async def test_odd_bytes_in_a_head_are_answered_not_raised(start: Start) -> None:
    """A header value that is not UTF-8 reaches the handler and goes back intact; one quoted
    in an error is escaped, and the JSON body stays valid."""

    async def handler(request: Request, responder: Responder) -> None:
        responder.send(200, [("x-back", request.headers["x-odd"])], request.method.encode())

    server, port = await start(handler)
    answer, _ = await request(port, b"GET / HTTP/1.1\r\nHost: \xff\r\nX-Odd: \xc3\x28\xfe\r\n\r\n")
    assert answer.status == 200
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Odd: \xc3\x28\xfe\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"x-back: \xc3\x28\xfe\r\n" in head
    writer.close()
    data = (
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Encoding: \xff\xfebr\r\nContent-Length: 2\r\n\r\n{}"
    )
    answer, _ = await request(port, data)
    assert answer.status == 415
    assert "\\xff\\xfebr" in str(answer.error()["message"])
    for line in (b"GET /\xff\x80 HTTP/1.1", b"G\xffT / HTTP/1.1"):  # the parser refuses these
        answer, _ = await request(port, line + b"\r\nHost: t\r\n\r\n")
        assert answer.status == 400
        assert answer.error()["code"] == "malformed_request"
    assert await serves(port, b"GET / HTTP/1.1\r\nHost: t\r\nX-Odd: a\r\n\r\n")
    assert await at_rest(server)
