"""The gateway behind library HTTP servers, to weigh its own server against them.

The same :class:`~sluicegate.gateway.app.Gateway` — routing, scheduling, upstream pool,
proxy relay — answers every request; only the front server differs:

- ``sluicegate``: ``sluicegate serve`` (its own asyncio + httptools server on uvloop);
- ``granian``: `granian <https://github.com/emmett-framework/granian>`_ (Rust, hyper)
  through its RSGI interface, one worker, uvloop;
- ``uvicorn``: `uvicorn <https://www.uvicorn.org/>`_'s httptools protocol under a minimal
  ASGI app, one process, uvloop, no access log.

Each library request becomes a :class:`~sluicegate.gateway.http.Request` and goes to
:meth:`Gateway.handle_request <sluicegate.gateway.app.Gateway.handle_request>` (the API-key
check, then the route) with a :class:`~sluicegate.gateway.http.Responder` subclass that maps
``send``/``stream``/``write``/``end`` onto the server's response API. As with the gateway's
own server, a body over ``maxBodyBytes`` is a 413 without reading it
(:meth:`~sluicegate.gateway.app.Gateway.refuse_too_large`), and a client that disconnects
cancels the handler (so the upstream request is abandoned). The libraries do not cancel
the app: for granian a callback on its ``client_disconnect()`` future cancels the request's
task; for uvicorn a watcher task per request waits for ``receive()`` to say
``http.disconnect`` (uvicorn's ``send`` after a disconnect returns silently, so without it a
stream runs to its end).
Granian ends a streamed answer when its stream transport is released, so the responder
drops it at :meth:`end`.

Neither library is a dependency: they are imported when used, and a clear message says
how to install them. Run one (used by :mod:`sluicegate.bench.gateway.server_compare`)::

    python -m sluicegate.bench.gateway.servers granian --config pool.yaml \\
        --policy round-robin --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from sluicegate.config_watch import ConfigRules, read_config
from sluicegate.gateway.app import Gateway
from sluicegate.gateway.http import Request, Responder
from sluicegate.scheduling.config import load_preset

LIBRARY_SERVERS = ("granian", "uvicorn")
_CONFIG_ENV = "SLUICEGATE_SERVERS_CONFIG"
_POLICY_ENV = "SLUICEGATE_SERVERS_POLICY"
_WATCH_ENV = "SLUICEGATE_SERVERS_WATCH"
"""``0``: no disconnect watcher (to measure its cost; a client that leaves is then not
noticed until a write to it fails, and a whole answer's upstream request runs on)."""
_Headers = list[tuple[str, str]]


def _require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise SystemExit(
            f"{module} is not installed: this comparison needs it in a separate venv "
            f"(python -m venv /tmp/srvbench && /tmp/srvbench/bin/pip install granian uvicorn "
            f"plus the project's requirements), never in the project's lock"
        ) from None


def _gateway() -> Gateway:
    """The Gateway of ``$SLUICEGATE_SERVERS_CONFIG`` with preset ``$..._POLICY``."""
    policy = os.environ.get(_POLICY_ENV)
    rules = ConfigRules(load_preset(policy) if policy else None)
    config = read_config(Path(os.environ[_CONFIG_ENV]), rules)
    return Gateway(config)


async def _start(gateway: Gateway) -> None:
    # Started exactly as ``sluicegate serve`` starts it; its own listener, on a spare port,
    # stays idle. Start-up objects live as long as the process (see gateway/run.py).
    await gateway.start("127.0.0.1", 0)
    gc.freeze()


class _LibraryResponder(Responder):
    """A :class:`Responder` that writes through a library server's response API."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(keep_alive=True)  # the library server decides


async def _cancel_on_disconnect(
    disconnected: Awaitable[Any], handler: asyncio.Task[None], responder: Responder
) -> None:
    """Cancel ``handler`` when the client leaves before its answer ended."""
    await disconnected
    if not responder.ended and not handler.done():
        handler.cancel()


async def _run_handler(
    gateway: Gateway,
    request: Request,
    responder: Responder,
    disconnected: Callable[[], Awaitable[Any]] | None,
) -> None:
    if disconnected is None:
        with contextlib.suppress(ConnectionError):  # the client left mid-answer
            await gateway.handle_request(request, responder)
        return
    handler = asyncio.ensure_future(gateway.handle_request(request, responder))
    watcher = asyncio.ensure_future(_cancel_on_disconnect(disconnected(), handler, responder))
    try:
        await handler
    except asyncio.CancelledError:
        if not handler.cancelled():
            raise  # the server cancelled us: not a client disconnect
    except ConnectionError:
        return  # the client left mid-answer
    finally:
        watcher.cancel()


def _request(method: str, target: str, path: str, headers: Iterable[tuple[str, str]]) -> Request:
    joined: dict[str, str] = {}
    for name, value in headers:
        joined[name] = f"{joined[name]}, {value}" if name in joined else value
    return Request(method, target, path, joined, b"", "1.1")


def _too_long(request: Request, limit: int) -> bool:
    length = request.headers.get("content-length", "")
    return length.isdigit() and int(length) > limit


# --------------------------------------------------------------------------- granian


class _RsgiResponder(_LibraryResponder):
    __slots__ = ("_proto", "_stream")

    def __init__(self, proto: Any) -> None:
        super().__init__()
        self._proto = proto
        self._stream: Any = None

    def send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b"") -> None:
        self.begin()
        self._proto.response_bytes(status, list(headers), body)  # it adds content-length
        self.mark_ended()

    def stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self.begin()
        self._stream = self._proto.response_stream(status, list(headers))

    async def write(self, data: bytes) -> None:
        if data:
            try:
                await self._stream.send_bytes(data)
            except RuntimeError as exc:  # RSGIProtocolClosed: the client left
                raise ConnectionResetError(str(exc)) from None

    async def end(self, last: bytes = b"") -> None:
        await self.write(last)
        self.mark_ended()
        self._stream = None  # the stream ends when its transport is released


class RsgiGateway:
    """The Gateway as a granian RSGI application (see the module docstring)."""

    def __init__(self) -> None:
        self.gateway = _gateway()
        self.watch = os.environ.get(_WATCH_ENV) != "0"

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(_start(self.gateway))  # the loop is not running yet

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.gateway.stop())

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        query = scope.query_string
        target = f"{scope.path}?{query}" if query else scope.path
        request = _request(scope.method, target, scope.path, scope.headers.items())
        responder = _RsgiResponder(proto)
        limit = self.gateway.config.gateway.max_body_bytes
        if _too_long(request, limit):
            self.gateway.refuse_too_large(request, responder)  # answered unread, as ours does
            return
        if "content-length" in request.headers:
            request.body = await proto()
        else:  # chunked: read with a bound
            parts: list[bytes] = []
            size = 0
            async for chunk in proto:
                size += len(chunk)
                if size > limit:
                    self.gateway.refuse_too_large(request, responder)
                    return
                parts.append(chunk)
            request.body = b"".join(parts)
        if self.watch:
            await _run_watched(self.gateway, request, responder, proto.client_disconnect())
        else:
            await _run_handler(self.gateway, request, responder, None)


async def _run_watched(
    gateway: Gateway, request: Request, responder: Responder, disconnected: Any
) -> None:
    """The handler in this task, cancelled by a callback on granian's disconnect future
    (a callback rather than a watcher task: nothing more to schedule per request)."""
    task = asyncio.current_task()
    assert task is not None
    left = False

    def on_disconnect(_: object) -> None:
        nonlocal left
        if not responder.ended:
            left = True
            task.cancel()

    disconnected.add_done_callback(on_disconnect)
    try:
        await gateway.handle_request(request, responder)
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()
    except ConnectionError:
        return  # the client left mid-answer
    finally:
        disconnected.remove_done_callback(on_disconnect)


def rsgi_app() -> RsgiGateway:
    """granian's ``--factory`` target."""
    return RsgiGateway()


# --------------------------------------------------------------------------- uvicorn

_Send = Callable[[dict[str, Any]], Awaitable[None]]
_Receive = Callable[[], Awaitable[dict[str, Any]]]


class _AsgiResponder(_LibraryResponder):
    __slots__ = ("_pending_head", "_send", "_whole")

    def __init__(self, send: _Send) -> None:
        super().__init__()
        self._send = send
        self._pending_head: dict[str, Any] | None = None
        self._whole: bytes | None = None

    def _start(self, status: int, headers: Iterable[tuple[str, str]], length: int | None) -> None:
        self.begin()
        raw = [(n.encode("latin-1"), v.encode("utf-8", "surrogateescape")) for n, v in headers]
        if length is not None:
            raw.append((b"content-length", b"%d" % length))
        self._pending_head = {"type": "http.response.start", "status": status, "headers": raw}

    def send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b"") -> None:
        # ASGI's send is a coroutine and Responder.send is not: the answer is kept and
        # sent by flush() as soon as the handler returns (right after this, in the Gateway).
        self._start(status, headers, len(body))
        self._whole = body
        self.mark_ended()

    def stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self._start(status, headers, None)

    async def write(self, data: bytes) -> None:
        if data:
            await self._piece(data, more=True)

    async def end(self, last: bytes = b"") -> None:
        await self._piece(last, more=False)
        self.mark_ended()

    async def _piece(self, data: bytes, more: bool) -> None:
        if self._pending_head is not None:
            head, self._pending_head = self._pending_head, None
            await self._send(head)  # returns at once: uvicorn only waits to drain
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def flush(self) -> None:
        """Send a whole answer kept by :meth:`send`."""
        if self._whole is not None:
            body, self._whole = self._whole, None
            await self._piece(body, more=False)


class AsgiGateway:
    """The Gateway as an ASGI application for uvicorn (see the module docstring)."""

    def __init__(self) -> None:
        self.gateway = _gateway()
        self.watch = os.environ.get(_WATCH_ENV) != "0"

    async def __call__(self, scope: dict[str, Any], receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        query = scope["query_string"].decode("latin-1")
        path = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        headers = [
            (n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in scope["headers"]
        ]
        request = _request(scope["method"], f"{path}?{query}" if query else path, path, headers)
        responder = _AsgiResponder(send)
        limit = self.gateway.config.gateway.max_body_bytes
        if _too_long(request, limit):
            self.gateway.refuse_too_large(request, responder)
            await responder.flush()
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > limit:
                self.gateway.refuse_too_large(request, responder)
                await responder.flush()
                return
            if not message.get("more_body"):
                break
        request.body = parts[0] if len(parts) == 1 else b"".join(parts)
        # After the body, uvicorn's receive() returns only at a disconnect (or at the
        # answer's end, which the watcher tells apart by ``responder.ended``).
        await _run_handler(self.gateway, request, responder, receive if self.watch else None)
        await responder.flush()

    async def _lifespan(self, receive: _Receive, send: _Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await _start(self.gateway)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.gateway.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


# --------------------------------------------------------------------------- running


def serve(
    server: str,
    config: Path,
    policy: str | None,
    port: int,
    granian_opts: dict[str, str],
    watch: bool = True,
) -> None:
    """Run the Gateway behind ``server`` (one of :data:`LIBRARY_SERVERS`) until SIGTERM;
    ``granian_opts`` are further keyword arguments of ``granian.Granian`` (strings);
    ``watch`` False leaves out the disconnect watcher (see ``_WATCH_ENV``)."""
    os.environ[_CONFIG_ENV] = str(config.resolve())
    os.environ[_WATCH_ENV] = "1" if watch else "0"
    if policy:
        os.environ[_POLICY_ENV] = policy
    else:
        os.environ.pop(_POLICY_ENV, None)
    logging.basicConfig(level=logging.WARNING)
    if server == "granian":
        granian = _require("granian")
        granian.Granian(
            f"{__name__}:rsgi_app",
            factory=True,
            address="127.0.0.1",
            port=port,
            interface="rsgi",
            loop="uvloop",
            workers=1,
            log_level="warning",
            log_access=False,
            **granian_opts,
        ).serve()
    elif server == "uvicorn":
        uvicorn = _require("uvicorn")
        _require("httptools")
        uvicorn.run(
            AsgiGateway(),
            host="127.0.0.1",
            port=port,
            http="httptools",
            loop="uvloop",
            lifespan="on",
            access_log=False,
            log_level="warning",
        )
    else:
        raise SystemExit(f"unknown server {server!r}: one of {', '.join(LIBRARY_SERVERS)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("server", choices=LIBRARY_SERVERS)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--granian",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a granian.Granian setting, e.g. runtime_mode=st or task_impl=rust",
    )
    parser.add_argument(
        "--no-disconnect-watch",
        action="store_true",
        help="leave out the disconnect watcher (to measure its cost)",
    )
    args = parser.parse_args(argv)
    opts = dict(opt.split("=", 1) for opt in args.granian)
    serve(args.server, args.config, args.policy, args.port, opts, not args.no_disconnect_watch)


if __name__ == "__main__":
    main(sys.argv[1:])
