"""Request bodies with a ``Content-Encoding``: decompressed as they arrive, bounded by
``max_body_bytes`` on the decompressed size, refused when corrupt or not supported."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from http_support import at_rest, request, serves

from sluicegate.gateway.http import HttpServer, Request, Responder

Start = Callable[..., Awaitable[tuple[HttpServer, int]]]
BODY = b'{"model": "m", "prompt": "' + b"hello " * 200 + b'"}'
BOMB = gzip.compress(b"\0" * 10_000_000, compresslevel=1)  # 10 MB in about 45 KB


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,  # the zlib format, as RFC 9110 means it
    "Deflate-raw": raw_deflate,  # what some clients send as "deflate"
}


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    servers: list[HttpServer] = []
    seen: list[Request] = []

    async def handler(request: Request, responder: Responder) -> None:
        seen.append(request)
        responder.send(200, [], request.body)

    def too_large(request: Request, responder: Responder) -> None:
        responder.send(413, [("content-type", "application/json")], b'{"error": "too large"}')

    async def make(max_body_bytes: int = 4096, **limits) -> tuple[HttpServer, int]:
        server = HttpServer(handler, too_large, max_body_bytes, **limits)
        server.seen = seen  # type: ignore[attr-defined]  # what the handler got
        port = await server.start("127.0.0.1", 0)
        servers.append(server)
        return server, port

    yield make
    for server in servers:
        await server.stop(0.5)


def post(body: bytes, coding: str) -> bytes:
    return (
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (
            coding.encode(),
            len(body),
            body,
        )
    )


def chunked(body: bytes, coding: str, size: int) -> bytes:
    pieces = b"".join(
        b"%x\r\n%s\r\n" % (len(p), p)
        for p in (body[i : i + size] for i in range(0, len(body), size))
    )
    return (
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Encoding: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
        % coding.encode()
        + pieces
        + b"0\r\n\r\n"
    )


@pytest.mark.parametrize("coding", list(ENCODERS))
async def test_a_compressed_body_is_decompressed(start: Start, coding: str) -> None:
    server, port = await start()
    encoded = ENCODERS[coding](BODY)
    coding = coding.removesuffix("-raw")
    answer, _ = await request(port, post(encoded, coding))
    assert answer.status == 200
    assert answer.body == BODY
    headers = server.seen[-1].headers  # type: ignore[attr-defined]
    assert "content-encoding" not in headers
    assert headers["content-length"] == str(len(BODY))  # no longer the compressed size
    assert await at_rest(server)


@pytest.mark.parametrize("coding", list(ENCODERS))
async def test_a_compressed_chunked_body_in_one_byte_pieces(start: Start, coding: str) -> None:
    """Every piece decompressed as it comes, also the first two bytes of a deflate body
    (which tell zlib format from raw) arriving apart."""
    server, port = await start()
    encoded = ENCODERS[coding](BODY)
    answer, _ = await request(port, chunked(encoded, coding.removesuffix("-raw"), 1))
    assert answer.status == 200
    assert answer.body == BODY
    assert "content-length" not in server.seen[-1].headers  # type: ignore[attr-defined]
    assert await at_rest(server)


@pytest.mark.parametrize("coding", ["identity", "Identity", ""])
async def test_identity_passes_untouched(start: Start, coding: str) -> None:
    server, port = await start()
    answer, _ = await request(port, post(b"{}", coding))
    assert answer.status == 200
    assert answer.body == b"{}"
    assert "content-encoding" not in server.seen[-1].headers  # type: ignore[attr-defined]
    assert await at_rest(server)


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_zip_bomb_is_a_413_without_inflating_it(start: Start, framing: str) -> None:
    server, port = await start(max_body_bytes=4096, max_buffered_body_bytes=8192)
    data = post(BOMB, "gzip") if framing == "length" else chunked(BOMB, "gzip", 1000)
    answer, was_closed = await request(port, data)
    assert answer.status == 413
    assert was_closed
    assert answer.body == b'{"error": "too large"}'  # on_too_large's answer
    assert not server.seen  # type: ignore[attr-defined]
    assert await at_rest(server)
    assert await serves(port, post(gzip.compress(b"{}"), "gzip"))


async def test_a_body_exactly_at_the_limit_passes(start: Start) -> None:
    _server, port = await start(max_body_bytes=4096)
    answer, _ = await request(port, post(gzip.compress(b"a" * 4096), "gzip"))
    assert answer.status == 200
    assert answer.body == b"a" * 4096
    answer, _ = await request(port, post(gzip.compress(b"a" * 4097), "gzip"))
    assert answer.status == 413


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"this is not gzip at all", "incorrect header check"),
        (gzip.compress(BODY)[:-12], "truncated"),
        (gzip.compress(BODY) + b"trailing", "data after the end"),
    ],
)
async def test_a_corrupt_body_is_a_400(start: Start, body: bytes, problem: str) -> None:
    server, port = await start()
    answer, was_closed = await request(port, post(body, "gzip"))
    assert answer.status == 400
    assert was_closed
    error = answer.error()
    assert error["code"] == "invalid_content_encoding"
    assert "Content-Encoding" in str(error["message"])
    assert problem in str(error["message"])
    assert not server.seen  # type: ignore[attr-defined]
    assert await at_rest(server)
    assert await serves(port, post(gzip.compress(b"{}"), "gzip"))


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip", "gzip, br"])
async def test_an_unsupported_coding_is_a_415_naming_it(start: Start, coding: str) -> None:
    server, port = await start()
    answer, was_closed = await request(port, post(b"{}", coding))
    assert answer.status == 415
    assert was_closed
    error = answer.error()
    assert error["code"] == "unsupported_content_encoding"
    assert f"'{coding}'" in str(error["message"])
    assert not server.seen  # type: ignore[attr-defined]
    assert await at_rest(server)
    assert await serves(port, post(b"{}", "identity"))


async def test_decompressed_bytes_count_in_the_budget(start: Start) -> None:
    server, port = await start(max_body_bytes=100_000, max_buffered_body_bytes=50_000)
    answer, _ = await request(port, post(gzip.compress(b"z" * 60_000), "gzip"))
    assert answer.status == 503
    assert answer.error()["code"] == "body_buffers_full"
    assert await at_rest(server)
    answer, _ = await request(port, post(gzip.compress(b"z" * 40_000), "gzip"))
    assert answer.status == 200
    assert len(answer.body) == 40_000
