"""The server-comparison lab: responders over library APIs, commands, the verdict table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sluicegate.bench.gateway import servers
from sluicegate.bench.gateway.server_compare import Run, server_command, table


def test_missing_library_is_a_clear_exit() -> None:
    with pytest.raises(SystemExit, match=r"not installed.*separate venv"):
        servers._require("sluicegate_no_such_server")


async def test_asgi_responder_whole_answer_waits_for_flush() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    responder = servers._AsgiResponder(send)
    responder.send(200, [("content-type", "application/json")], b'{"a":1}')
    assert responder.started
    assert responder.ended
    assert sent == []
    await responder.flush()
    assert sent[0]["status"] == 200
    assert (b"content-length", b"7") in sent[0]["headers"]
    assert sent[1] == {"type": "http.response.body", "body": b'{"a":1}', "more_body": False}
    with pytest.raises(RuntimeError):
        responder.send(500, [], b"")


async def test_asgi_responder_stream() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    responder = servers._AsgiResponder(send)
    responder.stream(200, [("content-type", "text/event-stream")])
    assert sent == []  # the head goes with the first piece
    await responder.write(b"data: 1\n\n")
    await responder.write(b"")  # nothing to send
    await responder.end(b"data: [DONE]\n\n")
    assert [m["type"] for m in sent] == ["http.response.start", *["http.response.body"] * 2]
    assert not any(n == b"content-length" for n, _ in sent[0]["headers"])
    assert [m["more_body"] for m in sent[1:]] == [True, False]
    assert responder.ended


class _Stream:
    def __init__(self, closed: bool = False) -> None:
        self.data: list[bytes] = []
        self.closed = closed

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            raise RuntimeError("protocol closed")
        self.data.append(data)


class _Proto:
    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.whole: tuple[int, list[tuple[str, str]], bytes] | None = None

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.whole = (status, headers, body)

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Stream:
        return self.stream


async def test_rsgi_responder_stream_releases_its_transport_at_the_end() -> None:
    proto = _Proto(_Stream())
    responder = servers._RsgiResponder(proto)
    responder.stream(200, [])
    await responder.write(b"a")
    await responder.end(b"b")
    assert proto.stream.data == [b"a", b"b"]
    assert responder._stream is None  # granian ends the stream when it is released


async def test_rsgi_responder_closed_client_is_a_connection_error() -> None:
    responder = servers._RsgiResponder(_Proto(_Stream(closed=True)))
    responder.stream(200, [])
    with pytest.raises(ConnectionResetError):
        await responder.write(b"a")


async def test_disconnect_cancels_only_an_unfinished_answer() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    class _Gateway:
        async def handle_request(self, request: object, responder: servers._AsgiResponder) -> None:
            responder.stream(200, [])
            await responder.write(b"x")
            await asyncio.sleep(10)  # a long generation

    left = asyncio.get_running_loop().create_future()
    responder = servers._AsgiResponder(send)
    run = asyncio.ensure_future(
        servers._run_handler(_Gateway(), None, responder, lambda: left)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.01)
    left.set_result({"type": "http.disconnect"})
    await asyncio.wait_for(run, 1.0)  # cancelled, not waiting 10 s
    assert not responder.ended


def test_server_commands() -> None:
    cfg = Path("pool.yaml")
    ours = server_command("py", "sluicegate", cfg, "default", 9)
    assert ours[:3] == ["py", "-m", "sluicegate"]
    assert "serve" in ours
    lib = server_command("py", "granian+nowatch+task_impl=rust", cfg, "round-robin", 9)
    assert lib[:4] == ["py", "-m", "sluicegate.bench.gateway.servers", "granian"]
    assert "--no-disconnect-watch" in lib
    assert "--granian=task_impl=rust" in lib


def test_table_compares_medians_per_cpu_second_with_the_best_library() -> None:
    def run(server: str, rps: float, cpu: float, rnd: int) -> Run:
        return Run(server, "default", "json", rnd, rps, cpu, 1.0, 2.0, 0)

    runs = [
        *(run("sluicegate", 1150, 1.0, r) for r in range(3)),
        *(run("granian", 1000, 1.0, r) for r in range(3)),
        run("uvicorn", 900, 0.9, 0),  # 1,000 per CPU-s
        run("uvicorn", 500, 1.0, 1),
        run("uvicorn", 1000, 1.0, 2),
    ]
    out = table(runs, ("sluicegate", "granian", "uvicorn"))
    assert "| json | default | 1.15 | granian | **yes** |" in out
    runs[0] = run("sluicegate", 1000, 1.0, 0)
    runs[1] = run("sluicegate", 1100, 1.0, 1)
    assert "| 1.10 | granian | **no** |" in table(runs, ("sluicegate", "granian", "uvicorn"))


async def test_granian_disconnect_callback_cancels_the_request_task() -> None:
    class _Gateway:
        async def handle_request(self, request: object, responder: servers._RsgiResponder) -> None:
            responder.stream(200, [])
            await asyncio.sleep(10)  # a long generation

    left = asyncio.get_running_loop().create_future()
    responder = servers._RsgiResponder(_Proto(_Stream()))
    run = asyncio.ensure_future(
        servers._run_watched(_Gateway(), None, responder, left)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.01)
    left.set_result(None)
    await asyncio.wait_for(run, 1.0)  # returns (the cancel is absorbed), not after 10 s
    assert not run.cancelled()
