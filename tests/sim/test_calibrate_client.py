"""The calibrator's client against a fake server answering bodies it cannot read: each is a
:class:`ServerError` naming what was wrong (and ``sim calibrate`` exits 1 with it, no
traceback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sluicegate.cli import main
from sluicegate.sim.calibrate.client import ServerError, Target

_GOOD = [
    {"choices": [{"text": "a"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    {"choices": [{"text": "b"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
]

# What /v1/completions streams next, as data lines (a JSON value each), or (status, text).
_answer: list[object] = []


async def _completions(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if isinstance(_answer[0], tuple):
        status, text = _answer[0]
        return web.Response(status=status, text=text)
    if not body.get("stream"):
        return web.Response(body=orjson.dumps(_answer[0]), content_type="application/json")
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for chunk in _answer:
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    return response


async def _models(_request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    async with TestServer(app, host="127.0.0.1") as srv:
        yield str(srv.make_url("")).rstrip("/")


async def _complete(url: str, answer: list[object], stream: bool = True) -> list[int]:
    _answer[:] = answer
    async with aiohttp.ClientSession() as http:
        out = await Target(http, url, 10.0).complete("m", [1, 2, 3], 2, stream=stream)
    return out.tokens


async def test_a_readable_stream_is_read(server: str) -> None:
    assert await _complete(server, list(_GOOD)) == [1, 2]


@pytest.mark.parametrize(
    ("answer", "stream", "message"),
    [
        (
            [{"choices": [{"text": "a"}], "usage": {"prompt_tokens": 3}}],
            True,
            "no completion_tokens",
        ),
        ([[1, 2]], True, "chunk is not a JSON object: \\[1, 2\\]"),
        (["text"], False, "chunk is not a JSON object: 'text'"),
        ([{"choices": [{}], "usage": "lots"}], True, "usage is not an object: 'lots'"),
        (
            [{"choices": [{}], "usage": {"completion_tokens": "two"}}],
            True,
            "usage.completion_tokens is not a token count: 'two'",
        ),
        ([{"choices": [{}], "usage": {"prompt_tokens": -1}}], True, "usage.prompt_tokens is not"),
        ([(500, "boom")], True, "^POST http://[^ ]+/v1/completions: HTTP 500: boom$"),
    ],
)
async def test_an_unreadable_body_is_a_server_error_naming_it(
    server: str, answer: list[object], stream: bool, message: str
) -> None:
    with pytest.raises(ServerError, match=message):
        await _complete(server, answer, stream)


async def test_calibrate_reports_it_without_a_traceback(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _answer[:] = [{"choices": [{"text": "a"}], "usage": {"prompt_tokens": 3}}]
    out = tmp_path / "p.yaml"
    argv = ["sim", "calibrate", "--target", server, "--out", str(out), "--budget-s", "20"]
    with pytest.raises(SystemExit) as exit_:
        await asyncio.to_thread(main, argv)  # its own event loop; this one serves
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "no completion_tokens" in err
    assert "Traceback" not in err
    assert not out.exists()
