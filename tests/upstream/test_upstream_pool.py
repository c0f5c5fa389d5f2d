"""The upstream client against scripted HTTP servers: what the proxy relies on — bodies
whole and streamed, connection reuse, every way a server can fail, and bounded memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from sluicegate.upstream import (
    UpstreamAbortedError,
    UpstreamConnectError,
    UpstreamDroppedError,
    UpstreamFirstByteTimeoutError,
    UpstreamPool,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]
"""Answers one request (given its head and body); returns whether to keep the connection."""


@dataclass
class ScriptedServer:
    script: Script
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client.set()
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if not await self.script(reader, writer, head + body):
                    if reader.at_eof():
                        self.closed_by_client.set()
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client.set()
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[ScriptedServer]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> ScriptedServer:
        scripted = ScriptedServer(script)
        server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0)
        scripted.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return scripted

    yield start
    for server in servers:
        server.close()


def answer(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    return (
        f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


async def answers_ok(reader, writer, request) -> bool:
    writer.write(answer(b"ok"))
    return True


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def post(pool: UpstreamPool, port: int, body: bytes = b'{"x":1}') -> bytes:
    response = await pool.request("http", "127.0.0.1", port, "POST", "/v1/x", [], body)
    data = await response.read()
    response.release()
    return data


async def test_whole_answers_reuse_one_keep_alive_connection(serve) -> None:
    async def script(reader, writer, request) -> bool:
        writer.write(answer(b'{"ok":true}'))
        return True

    server = await serve(script)
    pool = UpstreamPool()
    response = await pool.request(
        "http", "127.0.0.1", server.port, "POST", "/v1/completions?x=1",
        [("x-request-id", "r1")], b'{"model":"m"}',
    )  # fmt: skip
    assert response.status == 200
    assert ("Content-Type", "application/json") in response.headers
    assert await response.read() == b'{"ok":true}'
    assert response.at_eof
    response.release()
    assert await post(pool, server.port) == b'{"ok":true}'
    assert server.connections == 1
    head = server.requests[0]
    assert head.startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}".encode() in head
    assert b"Content-Length: 13\r\n" in head
    assert b"x-request-id: r1\r\n" in head
    assert head.endswith(b'{"model":"m"}')
    await pool.close()


async def test_a_chunked_stream_arrives_as_it_is_sent(serve) -> None:
    go_on = asyncio.Event()

    async def script(reader, writer, request) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunk(b"data: 1\n\n"))
        await go_on.wait()
        writer.write(chunk(b"data: 2\n\n") + b"0\r\n\r\n")
        return True

    server = await serve(script)
    pool = UpstreamPool()
    response = await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    assert await response.read_chunk() == b"data: 1\n\n"  # before the rest was even sent
    go_on.set()
    assert await response.read_chunk() == b"data: 2\n\n"
    assert await response.read_chunk() == b""
    response.release()
    assert pool.idle_connections() == 1
    await pool.close()
    assert pool.idle_connections() == 0


async def test_a_body_without_length_ends_when_the_server_closes(serve) -> None:
    async def script(reader, writer, request) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        return False

    server = await serve(script)
    pool = UpstreamPool()
    assert await post(pool, server.port) == b"all of it"
    assert pool.idle_connections() == 0  # the server said close: not kept


async def test_a_connection_the_server_closed_while_idle_is_replaced(serve) -> None:
    async def script(reader, writer, request) -> bool:
        writer.write(answer(b"ok"))
        await writer.drain()
        return False  # closes after every answer, though it did not say so

    server = await serve(script)
    pool = UpstreamPool()
    for _ in range(3):
        assert await post(pool, server.port) == b"ok"
    assert server.connections == 3
    assert len(server.requests) == 3  # each request reached the server once


async def test_a_reused_connection_closed_in_the_race_is_retried_fresh(serve) -> None:
    """The server's keep-alive timer fires as the next request arrives: it closes without
    answering, so the request goes once more, on a new connection."""

    async def script(reader, writer, request) -> bool:
        if len(server.requests) == 2:
            return False  # closes without a byte of answer
        writer.write(answer(b"ok"))
        return True

    server = await serve(script)
    pool = UpstreamPool()
    assert await post(pool, server.port) == b"ok"
    assert await post(pool, server.port) == b"ok"
    assert server.connections == 2
    assert len(server.requests) == 3


async def test_a_request_that_failed_after_bytes_arrived_is_not_resent(serve) -> None:
    async def script(reader, writer, request) -> bool:
        if len(server.requests) == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-")
            return False
        writer.write(answer(b"ok"))
        return True

    server = await serve(script)
    pool = UpstreamPool()
    assert await post(pool, server.port) == b"ok"
    with pytest.raises(UpstreamDroppedError):
        await post(pool, server.port)
    assert len(server.requests) == 2


async def test_a_drop_long_after_the_request_is_not_resent(serve) -> None:
    """A reused connection that closes without an answer after the server held the
    request for a while: the server failed while working on it, so it is not sent again
    (the proxy decides what to do)."""

    async def script(reader, writer, request) -> bool:
        if len(server.requests) == 2:
            await asyncio.sleep(0.4)  # generating, then the engine dies
            return False
        writer.write(answer(b"ok"))
        return True

    server = await serve(script)
    pool = UpstreamPool()
    assert await post(pool, server.port) == b"ok"
    with pytest.raises(UpstreamDroppedError):
        await post(pool, server.port)
    assert len(server.requests) == 2


async def test_idle_connections_expire(serve) -> None:
    server = await serve(answers_ok)
    pool = UpstreamPool(idle_timeout_s=0.1)
    assert await post(pool, server.port) == b"ok"
    assert await post(pool, server.port) == b"ok"
    assert server.connections == 1  # reused while fresh
    await asyncio.sleep(0.15)
    assert await post(pool, server.port) == b"ok"
    assert server.connections == 2
    assert pool.idle_connections() == 1
    await asyncio.wait_for(server.closed_by_client.wait(), 2)  # the expired one was closed


async def test_expired_connections_of_other_endpoints_are_swept(serve) -> None:
    """An endpoint that left the pool is never asked for again: its idle connections are
    closed anyway."""

    gone, staying = await serve(answers_ok), await serve(answers_ok)
    pool = UpstreamPool(idle_timeout_s=0.1)
    assert await post(pool, gone.port) == b"ok"
    await asyncio.sleep(0.15)
    assert await post(pool, staying.port) == b"ok"
    assert pool.idle_connections() == 1
    await asyncio.wait_for(gone.closed_by_client.wait(), 2)


async def test_a_server_dying_mid_body_is_an_error_after_the_bytes_it_sent(serve) -> None:
    async def script(reader, writer, request) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        return False

    server = await serve(script)
    pool = UpstreamPool()
    response = await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    assert await response.read_chunk() == b"partial"
    with pytest.raises(UpstreamDroppedError):
        await response.read_chunk()
    response.release()
    assert pool.idle_connections() == 0


async def test_no_answer_within_the_read_timeout(serve) -> None:
    async def script(reader, writer, request) -> bool:
        await reader.read(1)  # "generating" until the client leaves
        return False

    server = await serve(script)
    pool = UpstreamPool(read_timeout_s=0.1)
    with pytest.raises(UpstreamTimeoutError, match=r"0\.1 s"):
        await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    await asyncio.wait_for(server.closed_by_client.wait(), 2)  # the server sees us leave


async def test_no_status_within_the_first_byte_timeout(serve) -> None:
    async def script(reader, writer, request) -> bool:
        await reader.read(1)  # hung: never answers
        return False

    server = await serve(script)
    pool = UpstreamPool(read_timeout_s=5.0)
    started = asyncio.get_running_loop().time()
    with pytest.raises(UpstreamFirstByteTimeoutError, match=r"0\.1 s"):
        await pool.request(
            "http", "127.0.0.1", server.port, "POST", "/", [], b"{}", first_byte_timeout_s=0.1
        )
    assert asyncio.get_running_loop().time() - started < 1.0
    await asyncio.wait_for(server.closed_by_client.wait(), 2)  # abandoned: the server sees it


async def test_the_first_byte_timeout_covers_the_first_chunk_then_reads_have_their_own(
    serve,
) -> None:
    release_first = asyncio.Event()

    async def script(reader, writer, request) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")  # headers early
        await writer.drain()
        await release_first.wait()
        writer.write(chunk(b"first"))
        await writer.drain()
        await asyncio.sleep(0.3)  # longer than the first-byte bound: a later read is fine
        writer.write(chunk(b"second") + b"0\r\n\r\n")
        await writer.drain()
        return True

    server = await serve(script)
    pool = UpstreamPool(read_timeout_s=2.0)
    # Headers in time but no first chunk: still a first-byte timeout.
    response = await pool.request(
        "http", "127.0.0.1", server.port, "POST", "/", [], b"{}", first_byte_timeout_s=0.2
    )
    assert response.status == 200
    with pytest.raises(UpstreamFirstByteTimeoutError):
        await response.read_chunk()
    response.close()
    # The same server sending its first chunk in time: later reads wait read_timeout_s.
    release_first.set()
    response = await pool.request(
        "http", "127.0.0.1", server.port, "POST", "/", [], b"{}", first_byte_timeout_s=0.2
    )
    assert await response.read_chunk() == b"first"
    assert await response.read() == b"second"
    response.release()


async def test_a_refused_connection_fails_clearly() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pool = UpstreamPool()
    with pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port}"):
        await pool.request("http", "127.0.0.1", port, "POST", "/", [], b"{}")


async def test_a_malformed_answer_is_a_protocol_error(serve) -> None:
    async def script(reader, writer, request) -> bool:
        writer.write(b"SMTP ready\r\n\r\n")
        return True

    server = await serve(script)
    pool = UpstreamPool()
    with pytest.raises(UpstreamProtocolError):
        await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    assert pool.idle_connections() == 0


async def test_an_interim_answer_is_skipped(serve) -> None:
    async def script(reader, writer, request) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"final", 201))
        return True

    server = await serve(script)
    pool = UpstreamPool()
    response = await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    assert response.status == 201
    assert await response.read() == b"final"
    response.release()


async def test_releasing_an_unfinished_answer_closes_its_connection(serve) -> None:
    """A client that leaves mid-stream: the model server must see the connection close,
    so it stops generating."""

    async def script(reader, writer, request) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a"))
        await writer.drain()
        await reader.read(1)  # "generating" until the client leaves
        return False

    server = await serve(script)
    pool = UpstreamPool()
    response = await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    assert await response.read_chunk() == b"a"
    response.release()
    assert pool.idle_connections() == 0
    await asyncio.wait_for(server.closed_by_client.wait(), 2)


async def test_abort_ends_the_live_exchanges_of_one_endpoint_only(serve) -> None:
    async def script(reader, writer, request) -> bool:
        if request.startswith(b"POST /v1/x"):  # post()'s path
            writer.write(answer(b"ok"))
            return True
        if request.startswith(b"POST /stream"):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"a"))
            await writer.drain()
        await reader.read(1)  # hung until the client leaves
        return False

    hung, other = await serve(script), await serve(script)
    pool = UpstreamPool()

    def send(port: int, path: str) -> asyncio.Task[object]:
        return asyncio.create_task(pool.request("http", "127.0.0.1", port, "POST", path, [], b"{}"))

    waiting = [send(hung.port, "/hang") for _ in range(2)]
    elsewhere = send(other.port, "/hang")
    streaming = await pool.request("http", "127.0.0.1", hung.port, "POST", "/stream", [], b"{}")
    assert await streaming.read_chunk() == b"a"
    assert await post(pool, hung.port, b"{}") == b"ok"  # leaves one idle connection
    for _ in range(100):
        if pool.live_exchanges() == 4:
            break
        await asyncio.sleep(0.01)
    assert pool.live_exchanges() == 4  # the finished exchange left the register
    assert pool.idle_connections() == 1
    connections = hung.connections
    # The stream is not being read (its client is slow, say): not waiting on the server.
    assert pool.waiting("http", "127.0.0.1", hung.port) == 2
    reading = asyncio.create_task(streaming.read_chunk())
    await asyncio.sleep(0.01)
    assert pool.waiting("http", "127.0.0.1", hung.port) == 3
    # An exchange that is not abortable (a metric scrape) is not registered.
    scrape = asyncio.create_task(
        pool.request("http", "127.0.0.1", other.port, "GET", "/hang", [], abortable=False)
    )
    await asyncio.sleep(0.05)
    assert pool.live_exchanges() == 4

    assert pool.abort("http", "127.0.0.1", hung.port, "stalled") == 3
    for task in waiting:
        with pytest.raises(UpstreamAbortedError, match="stalled"):
            await task
    with pytest.raises(UpstreamAbortedError):
        await reading
    with pytest.raises(UpstreamAbortedError):  # and every later read
        await streaming.read_chunk()
    streaming.release()

    assert pool.live_exchanges() == 1  # the other endpoint's exchange goes on
    assert not elsewhere.done()
    assert pool.abort("http", "127.0.0.1", hung.port) == 0
    # Aborted, never resent; the idle connection is still there and still works.
    assert sum(r.startswith(b"POST /hang") for r in hung.requests) == 2
    assert pool.idle_connections() == 1
    assert await post(pool, hung.port, b"{}") == b"ok"
    assert hung.connections == connections
    await asyncio.wait_for(hung.closed_by_client.wait(), 2)  # the server saw us leave

    assert pool.abort("http", "127.0.0.1", other.port) == 1
    with pytest.raises(UpstreamAbortedError):
        await elsewhere
    assert not scrape.done()  # not abortable: left to its own timeout
    scrape.cancel()
    await asyncio.gather(scrape, return_exceptions=True)
    assert pool.live_exchanges() == 0
    assert pool.waiting("http", "127.0.0.1", other.port) == 0
    await pool.close()


async def test_idle_connections_are_bounded_per_endpoint(serve) -> None:
    async def script(reader, writer, request) -> bool:
        await asyncio.sleep(0.05)  # long enough for all requests to need a connection
        writer.write(answer(b"ok"))
        return True

    server = await serve(script)
    pool = UpstreamPool(max_idle_per_endpoint=3)
    results = await asyncio.gather(*(post(pool, server.port) for _ in range(10)))
    assert results == [b"ok"] * 10
    assert server.connections == 10
    assert pool.idle_connections() == 3


async def test_unread_body_bytes_are_bounded(serve) -> None:
    """A fast server and a reader that does not keep up: the gateway stops reading the
    socket instead of buffering the whole answer."""
    size = 8 * 1024 * 1024

    async def script(reader, writer, request) -> bool:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        writer.write(b"x" * size)
        await writer.drain()
        return True

    server = await serve(script)
    bound = 64 * 1024
    pool = UpstreamPool(max_buffer_bytes=bound)
    response = await pool.request("http", "127.0.0.1", server.port, "POST", "/", [], b"{}")
    await asyncio.sleep(0.3)  # the server writes as fast as it can; nobody reads
    assert response.buffered_bytes <= bound + 256 * 1024  # plus at most one socket read
    total = 0
    while data := await response.read_chunk():
        total += len(data)
        assert response.buffered_bytes <= bound + 256 * 1024
    assert total == size
    response.release()
    assert pool.idle_connections() == 1


async def test_a_header_with_a_line_break_is_refused(serve) -> None:
    server = await serve(answers_ok)
    pool = UpstreamPool()
    with pytest.raises(ValueError, match="line break"):
        await pool.request(
            "http", "127.0.0.1", server.port, "POST", "/", [("x-a", "1\r\nx-b: 2")], b"{}"
        )
    assert server.requests == []


async def test_a_closed_pool_refuses_requests() -> None:
    pool = UpstreamPool()
    await pool.close()
    with pytest.raises(UpstreamConnectError, match="closed"):
        await pool.request("http", "127.0.0.1", 1, "POST", "/", [], b"{}")
