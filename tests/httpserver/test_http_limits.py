"""The server's bounds against clients, against raw sockets: open connections, request-body
bytes held across connections, and the time a body may take."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from http_support import at_rest, closed, read_answer, request, serves

from sluicegate.gateway.http import HttpServer, Request, Responder
from sluicegate.gateway.http.connection import _HttpConnection

Start = Callable[..., Awaitable[tuple[HttpServer, int]]]


async def echo(request: Request, responder: Responder) -> None:
    responder.send(200, [], request.body)


def too_large(request: Request, responder: Responder) -> None:
    responder.send(413, [("content-type", "application/json")], b'{"error": "too large"}')


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    servers: list[HttpServer] = []

    async def make(handler=echo, max_body_bytes: int = 4096, **limits) -> tuple[HttpServer, int]:
        server = HttpServer(handler, too_large, max_body_bytes, **limits)
        port = await server.start("127.0.0.1", 0)
        servers.append(server)
        return server, port

    yield make
    for server in servers:
        await server.stop(0.5)


def head(length: int) -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % length


CHUNKED = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


async def until(condition: Callable[[], bool], within_s: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


async def test_a_connection_over_the_limit_is_answered_503(start: Start) -> None:
    server, port = await start(max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    await until(lambda: server.open_connections == 2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = await read_answer(reader)  # answered before it sends anything
    assert answer.status == 503
    assert answer.headers["retry-after"] == "1"
    assert answer.headers["connection"] == "close"
    error = answer.error()
    assert error["code"] == "too_many_connections"
    assert "too many client connections" in str(error["message"])
    assert await closed(reader)
    writer.close()
    assert server.connections_refused == 1
    assert server.open_connections == 2
    # A refused client that sent its request at once gets the 503 too.
    answer, _ = await request(port, head(2) + b"{}")
    assert answer.status == 503
    assert server.connections_refused == 2
    for _, held_writer in held:
        held_writer.close()
    assert await at_rest(server)
    assert await serves(port)  # room again


async def test_a_body_that_would_pass_the_budget_is_a_503(start: Start) -> None:
    release = asyncio.Event()

    async def handler(request: Request, responder: Responder) -> None:
        await release.wait()
        responder.send(200, [], b"%d" % len(request.body))

    server, port = await start(handler, max_buffered_body_bytes=1000)
    reader_a, writer_a = await asyncio.open_connection("127.0.0.1", port)
    writer_a.write(head(800) + b"a" * 100)  # bytes count as they arrive
    await until(lambda: server.buffered_body_bytes == 100)
    writer_a.write(b"a" * 700)
    await until(lambda: server.buffered_body_bytes == 800)  # held while its handler runs
    answer, was_closed = await request(port, head(300) + b"b" * 300)
    assert answer.status == 503
    assert was_closed
    assert answer.headers["retry-after"] == "1"
    error = answer.error()
    assert error["code"] == "body_buffers_full"
    assert "too many request bodies" in str(error["message"])
    assert (await request(port, head(201) + b"c" * 201))[0].status == 503  # not until released
    await asyncio.sleep(0.05)
    assert server.buffered_body_bytes == 800
    release.set()
    assert (await read_answer(reader_a)).body == b"800"
    await until(lambda: server.buffered_body_bytes == 0)  # released when it is answered
    writer_a.close()
    assert await serves(port, head(900) + b"d" * 900)
    assert await at_rest(server)


async def test_heads_alone_do_not_hold_the_budget(start: Start) -> None:
    """A declared length is not reserved: clients that send heads and then nothing hold no
    budget (only the body timeout ends them), and others' bodies are served meanwhile."""
    server, port = await start(max_buffered_body_bytes=1000)
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for _, writer in idle:
        writer.write(head(900))
    await until(lambda: server.open_connections == 3)
    await asyncio.sleep(0.05)
    assert server.buffered_body_bytes == 0
    assert await serves(port, head(900) + b"d" * 900)
    for _, writer in idle:
        writer.close()
    assert await at_rest(server)


async def test_a_closed_connection_whose_client_never_takes_its_answer_is_cut(
    start: Start,
) -> None:
    """An answer marked ``connection: close`` that the client never reads: the connection
    is closed at the idle timeout like any idle one, not kept forever."""
    big = b"x" * (32 << 20)  # more than the socket buffers take

    async def handler(request: Request, responder: Responder) -> None:
        responder.send(200, [], big)

    server, port = await start(handler, idle_timeout_s=0.3)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    await until(lambda: server.open_connections == 1)
    await until(lambda: server.open_connections == 0, within_s=3.0)
    writer.close()
    assert await at_rest(server)


async def test_a_chunked_body_that_crosses_the_budget_is_a_503(start: Start) -> None:
    server, port = await start(max_buffered_body_bytes=1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(CHUNKED + b"200\r\n" + b"x" * 512 + b"\r\n")
    await until(lambda: server.buffered_body_bytes == 512)
    writer.write(b"200\r\n" + b"x" * 512 + b"\r\n")
    answer = await read_answer(reader)
    assert answer.status == 503
    assert answer.error()["code"] == "body_buffers_full"
    assert await closed(reader)
    writer.close()
    assert await at_rest(server)
    chunked = CHUNKED + b"3\r\nabc\r\n0\r\n\r\n"
    answer, _ = await request(port, chunked)
    assert answer.status == 200
    assert answer.body == b"abc"


async def test_a_slow_body_is_a_408(start: Start) -> None:
    server, port = await start(body_timeout_s=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = asyncio.get_running_loop().time()
    writer.write(head(100) + b"x" * 10)
    answer = await read_answer(reader)
    assert asyncio.get_running_loop().time() - started < 2.0
    assert answer.status == 408
    assert answer.headers["connection"] == "close"
    error = answer.error()
    assert error["code"] == "request_timeout"
    assert "request body was not received within 0.2 s" in str(error["message"])
    assert await closed(reader)
    writer.close()
    assert server.body_timeouts == 1
    assert await at_rest(server)
    assert await serves(port, head(3) + b"abc")


async def test_a_slow_chunked_body_after_an_answer_is_a_408_after_it(start: Start) -> None:
    server, port = await start(body_timeout_s=0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(2) + b"ok" + CHUNKED + b"1\r\na\r\n")  # trickled: never finished
    first = await read_answer(reader)
    assert first.status == 200
    assert first.body == b"ok"
    second = await read_answer(reader)
    assert second.status == 408
    assert await closed(reader)
    writer.close()
    assert await at_rest(server)


async def test_a_body_in_time_is_not_timed_out(start: Start) -> None:
    server, port = await start(body_timeout_s=0.3, idle_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):  # each body in time, the connection kept longer than either timeout
        writer.write(head(4) + b"ab")
        await asyncio.sleep(0.1)
        writer.write(b"cd")
        assert (await read_answer(reader)).body == b"abcd"
    writer.close()
    assert server.body_timeouts == 0
    assert await at_rest(server)


async def test_clients_that_leave_mid_body_release_everything(start: Start) -> None:
    server, port = await start(max_body_bytes=100_000, max_buffered_body_bytes=10_000_000)
    writers = []
    for i in range(40):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        if i % 2:
            writer.write(head(50_000) + b"x" * 1000)
        else:
            writer.write(CHUNKED + b"3e8\r\n" + b"x" * 1000 + b"\r\n")
        writers.append(writer)
    await until(lambda: server.buffered_body_bytes == 40 * 1000)  # what arrived, not declared
    assert server.open_connections == 40
    for writer in writers:
        writer.close()
    assert await at_rest(server)
    assert await serves(port, head(3) + b"abc")


async def test_pipelined_bodies_are_held_until_answered_and_released_on_leaving(
    start: Start,
) -> None:
    entered = asyncio.Event()

    async def handler(request: Request, responder: Responder) -> None:
        entered.set()
        await asyncio.sleep(30)  # never answers: the client leaves

    server, port = await start(handler)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(100) + b"a" * 100 + head(200) + b"b" * 200 + head(300) + b"c" * 50)
    await asyncio.wait_for(entered.wait(), 5)
    # Running (100), queued (200) and the 50 bytes of the one in progress.
    await until(lambda: server.buffered_body_bytes == 350)
    writer.close()
    assert await at_rest(server)


class _Transport(asyncio.Transport):
    """Just enough of a transport to drive a connection without a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_a_client_gone_before_its_handler_starts_releases_its_body() -> None:
    """The handler task is created when the body is complete, but the client may be gone
    before it takes its first step (then it never does): the budget is returned all the
    same."""
    server = HttpServer(echo, too_large, 4096)
    conn = _HttpConnection(server)
    conn.connection_made(_Transport())
    conn.data_received(head(300) + b"x" * 300 + head(200) + b"y" * 200 + head(100) + b"z")
    assert server.buffered_body_bytes == 501
    conn.connection_lost(None)  # in the same step: no task has run
    await asyncio.sleep(0.01)
    assert server.buffered_body_bytes == 0
    assert server.open_connections == 0
