"""Raw-socket helpers for the HTTP server's tests: read one answer by its framing, check
that a connection was closed, and that a server is back at rest."""

from __future__ import annotations

import asyncio

import orjson

from sluicegate.gateway.http import HttpServer

GET = b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def error(self) -> dict[str, object]:
        """The OpenAI-style error object of a JSON error answer."""
        assert self.headers["content-type"] == "application/json"
        parsed = orjson.loads(self.body)
        assert isinstance(parsed, dict)
        assert isinstance(parsed["error"], dict)
        return parsed["error"]


async def read_answer(reader: asyncio.StreamReader, within_s: float = 5.0) -> Answer:
    """One answer with a ``content-length`` (the only kind these tests expect)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within_s)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), within_s)
    return Answer(int(status_line.split()[1]), headers, body)


async def closed(reader: asyncio.StreamReader, within_s: float = 3.0) -> bool:
    """Whether the server ends the connection (cleanly: no bytes after the last answer)."""
    return await asyncio.wait_for(reader.read(), within_s) == b""


async def request(port: int, data: bytes) -> tuple[Answer, bool]:
    """Send ``data`` on a new connection: its first answer, and whether the connection
    was then closed (the client closes its side only after looking)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        answer = await read_answer(reader)
        if answer.headers.get("connection") == "close":
            return answer, await closed(reader)
        return answer, False
    finally:
        writer.close()


async def serves(port: int, data: bytes = GET) -> bool:
    """Whether a plain request on a new connection gets a 200."""
    answer, _ = await request(port, data)
    return answer.status == 200


async def at_rest(server: HttpServer, within_s: float = 3.0) -> bool:
    """Whether the server gets back to no open connection and no body held."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while server.open_connections or server.buffered_body_bytes:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
