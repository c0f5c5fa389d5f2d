"""The gateway's HTTP/1.1 server against raw sockets: framing, keep-alive, pipelining,
limits, streaming, a client leaving, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sluicegate.gateway.http import HttpServer, Request, Responder

Handler = Callable[[Request, Responder], Awaitable[None]]


async def echo(request: Request, responder: Responder) -> None:
    body = b"%s %s %s|%s" % (
        request.method.encode(),
        request.target.encode(),
        request.headers.get("x-tag", "-").encode(),
        request.body,
    )
    responder.send(200, [("content-type", "text/plain")], body)


def too_large(request: Request, responder: Responder) -> None:
    responder.send(413, [], b"too large")


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Awaitable[tuple[HttpServer, int]]]]:
    servers: list[HttpServer] = []

    async def make(handler: Handler = echo, max_body_bytes: int = 1024) -> tuple[HttpServer, int]:
        server = HttpServer(handler, too_large, max_body_bytes)
        port = await server.start("127.0.0.1", 0)
        servers.append(server)
        return server, port

    yield make
    for server in servers:
        await server.stop(0.5)


async def exchange(port: int, data: bytes, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        if until_close:
            return await asyncio.wait_for(reader.read(), 5)
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def post(body: bytes, target: str = "/x", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s" % (
        target.encode(),
        len(body),
        extra,
        body,
    )


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(start) -> None:
    _, port = await start()
    two = post(b"one", "/a?q=1", b"X-Tag: first\r\n") + post(b"two", "/b")
    close = b"GET /c HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    answer = await exchange(port, two + close)
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    first, second, third = (
        answer.index(x) for x in (b"POST /a?q=1 first|one", b"POST /b -|two", b"GET /c -|")
    )
    assert first < second < third
    assert answer.rstrip().endswith(b"GET /c -|")
    assert b"connection: close" in answer.split(b"GET /c")[0].rsplit(b"HTTP/1.1 200", 1)[1]


async def test_a_chunked_request_body_is_assembled(start) -> None:
    _, port = await start()
    request = (
        b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    assert (await exchange(port, request)).endswith(b"POST /x -|abcdefg")


async def test_header_names_are_lower_case_and_repeats_joined(start) -> None:
    seen: list[dict[str, str]] = []

    async def handler(request: Request, responder: Responder) -> None:
        seen.append(request.headers)
        responder.send(204, [])

    _, port = await start(handler)
    await exchange(port, post(b"", extra=b"X-Tag: a\r\nx-tag: b\r\nConnection: close\r\n"))
    assert seen[0]["x-tag"] == "a, b"
    assert seen[0]["host"] == "t"


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_oversized_body_is_refused_and_the_connection_closed(start, chunked) -> None:
    _, port = await start(max_body_bytes=100)
    if chunked:
        request = (
            b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"64\r\n" + b"x" * 100 + b"\r\n") * 3
        )
    else:
        request = post(b"x" * 500)
    answer = await exchange(port, request)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in answer


async def test_expect_100_continue(start) -> None:
    _, port = await start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"ok")
    answer = await asyncio.wait_for(reader.readuntil(b"POST /x -|ok"), 5)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        # Answered as a plain request; what would follow is not HTTP: closed after it.
        (b"GET / HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", b"200"),
    ],
)
async def test_bad_requests_are_answered_and_closed(start, request_bytes, status) -> None:
    _, port = await start()
    answer = await exchange(port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert b"connection: close" in answer
    await exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")  # still up


async def test_a_streamed_answer_is_chunked_and_written_as_it_comes(start) -> None:
    go_on = asyncio.Event()

    async def handler(request: Request, responder: Responder) -> None:
        responder.stream(200, [("content-type", "text/event-stream")])
        await responder.write(b"data: 1\n\n")
        await go_on.wait()
        await responder.write(b"data: 2\n\n")
        await responder.end()

    _, port = await start(handler)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"transfer-encoding: chunked" in head
    assert (
        await asyncio.wait_for(reader.readuntil(b"data: 1\n\n\r\n"), 5) == b"9\r\ndata: 1\n\n\r\n"
    )
    go_on.set()
    rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
    assert rest == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    writer.close()


async def test_a_stream_ended_with_its_last_piece_frames_it_before_the_end(start) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        responder.stream(200, [("content-type", "text/event-stream")])
        await responder.end(b"data: [DONE]\n\n")  # the whole answer was one piece

    _, port = await start(handler)
    answer = await exchange(port, b"GET /s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


async def test_http_10_streams_unchunked_and_closes(start) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        responder.stream(200, [])
        await responder.write(b"abc")
        await responder.end(b"def")

    _, port = await start(handler)
    answer = await exchange(port, b"GET /s HTTP/1.0\r\n\r\n")
    assert answer.endswith(b"\r\n\r\nabcdef")
    assert b"chunked" not in answer


async def test_a_client_that_leaves_cancels_its_handler(start) -> None:
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: Request, responder: Responder) -> None:
        entered.set()
        try:
            await asyncio.sleep(30)  # waiting on the model server
        except asyncio.CancelledError:
            cancelled.set()
            raise

    _, port = await start(handler)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"{}"))
    await asyncio.wait_for(entered.wait(), 5)
    writer.close()
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_a_handler_fault_is_a_500_and_the_server_keeps_serving(start) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        if request.path == "/boom":
            raise RuntimeError("bug")
        responder.send(200, [], b"fine")

    _, port = await start(handler)
    answer = await exchange(
        port,
        b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n"
        + b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert answer.endswith(b"fine")


async def test_a_fault_after_the_answer_started_cuts_the_connection(start) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        responder.stream(200, [])
        await responder.write(b"partial")
        raise RuntimeError("bug")

    _, port = await start(handler)
    answer = await exchange(port, b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
    assert b"partial" in answer
    assert not answer.endswith(b"0\r\n\r\n")  # no clean end: the client sees it broke off


async def test_stop_lets_requests_in_progress_finish(start) -> None:
    release = asyncio.Event()

    async def handler(request: Request, responder: Responder) -> None:
        await release.wait()
        responder.send(200, [], b"done")

    server, port = await start(handler)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post(b"{}"))
    await asyncio.sleep(0.05)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.05)
    stopping = asyncio.create_task(server.stop(5.0))
    await asyncio.sleep(0.1)
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # idle: closed at once
    release.set()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert b"connection: close" in answer
    assert answer.endswith(b"done")
    await asyncio.wait_for(stopping, 5)
    writer.close()
    idle_writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_idle_and_trickling_connections_are_closed() -> None:
    server = HttpServer(echo, too_large, 1024, idle_timeout_s=0.2)
    port = await server.start("127.0.0.1", 0)
    try:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        idle_writer.write(post(b"a"))  # answered, then idle
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
        slow_writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\n")  # a head that never ends
        answer = await asyncio.wait_for(idle_reader.read(), 2)
        assert answer.endswith(b"POST /x -|a")  # then closed
        assert await asyncio.wait_for(slow_reader.read(), 2) == b""
        idle_writer.close()
        slow_writer.close()
    finally:
        await server.stop(0.1)


async def test_head_answers_have_no_body(start) -> None:
    _, port = await start()
    answer = await exchange(
        port,
        b"HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n"
        b"GET /y HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert b"content-length: 10" in head  # the length the body would have
    assert rest.startswith(b"HTTP/1.1 200 OK")  # straight to the next answer
    assert rest.endswith(b"GET /y -|")


async def test_trailers_do_not_become_headers(start) -> None:
    seen: list[dict[str, str]] = []

    async def handler(request: Request, responder: Responder) -> None:
        seen.append(request.headers)
        responder.send(204, [])

    _, port = await start(handler)
    await exchange(
        port,
        b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"1\r\na\r\n0\r\nX-Gateway-Destination-Endpoint: 10.0.0.1:80\r\n\r\n",
    )
    assert "x-gateway-destination-endpoint" not in seen[0]


async def test_a_client_that_does_not_read_stops_being_read() -> None:
    """Pipelining requests without reading the answers: the server stops reading once its
    buffers are full, instead of answering (and holding) without bound."""
    answered = 0

    async def handler(request: Request, responder: Responder) -> None:
        nonlocal answered
        answered += 1
        responder.send(200, [], b"x" * 65536)

    server = HttpServer(handler, too_large, 1024, max_pipelined=4)
    port = await server.start("127.0.0.1", 0)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
        for _ in range(2000):
            writer.write(request)
        await asyncio.sleep(0.5)
        assert answered <= 8 * 4 + 1  # the queue's hard limit, not 2,000 answers
        writer.close()
    finally:
        await server.stop(0.1)


async def test_request_ids_that_are_not_latin_1_are_echoed_intact(start) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        responder.send(200, [("x-request-id", request.headers["x-request-id"])], b"")

    _, port = await start(handler)
    for raw in ("中".encode(), b"\xff"):
        answer = await exchange(
            port,
            b"GET / HTTP/1.1\r\nHost: t\r\nX-Request-Id: " + raw + b"\r\nConnection: close\r\n\r\n",
        )
        assert b"x-request-id: " + raw + b"\r\n" in answer


async def test_a_stream_left_unfinished_cuts_the_connection(start) -> None:
    async def handler(request: Request, responder: Responder) -> None:
        responder.stream(200, [])
        await responder.write(b"partial")
        # returns without end(): the client must not take this for a complete answer

    _, port = await start(handler)
    answer = await exchange(port, b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
    assert b"partial" in answer
    assert not answer.endswith(b"0\r\n\r\n")
