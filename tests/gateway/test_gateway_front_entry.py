"""The entry for front servers other than the gateway's own (``Gateway.handle_request``,
``Gateway.refuse_too_large``) through a :class:`Responder` subclass, as the lab's
library-server adapters use it: the same API-key check, routes and 413 as the own server."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
from gw_support import GatewayFactory

from sluicegate.gateway.http import Request, Responder

KEY = "acceptedKey0123456789"


class Recorder(Responder):
    """Keeps the one whole answer it is given."""

    __slots__ = ("answer",)

    def __init__(self) -> None:
        super().__init__()
        self.answer: tuple[int, dict[str, str], bytes] | None = None

    def send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b"") -> None:
        self.begin()
        self.answer = (status, dict(headers), body)
        self.mark_ended()

    def stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        raise AssertionError("no route here streams")

    async def write(self, data: bytes) -> None:
        raise AssertionError("no route here streams")

    async def end(self, last: bytes = b"") -> None:
        raise AssertionError("no route here streams")


def request(path: str, headers: dict[str, str], method: str = "GET") -> Request:
    return Request(method, path, path, headers, b"", "1.1")


async def test_handle_request_checks_keys_then_routes(
    sim_cluster: Any, gateway: GatewayFactory
) -> None:
    gw = await gateway(await sim_cluster(replicas=1), api_keys=[KEY])
    refused = Recorder()
    await gw.handle_request(request("/v1/models", {"x-request-id": "r-1"}), refused)
    assert refused.answer is not None
    assert refused.ended
    status, headers, body = refused.answer
    assert (status, headers["x-request-id"]) == (401, "r-1")
    assert json.loads(body)["error"]["code"] == "invalid_api_key"

    served = Recorder()
    await gw.handle_request(request("/v1/models", {"authorization": f"Bearer {KEY}"}), served)
    assert served.answer is not None
    assert served.answer[0] == 200
    assert json.loads(served.answer[2])["object"] == "list"

    missing = Recorder()
    await gw.handle_request(request("/nope", {"authorization": f"Bearer {KEY}"}), missing)
    assert missing.answer is not None
    assert missing.answer[0] == 404


async def test_refuse_too_large_is_a_413(sim_cluster: Any, gateway: GatewayFactory) -> None:
    gw = await gateway(await sim_cluster(replicas=1), settings={"maxBodyBytes": 1024})
    answer = Recorder()
    gw.refuse_too_large(request("/v1/completions", {"x-request-id": "r-2"}, "POST"), answer)
    assert answer.answer is not None
    status, headers, body = answer.answer
    assert (status, headers["x-request-id"]) == (413, "r-2")
    error = json.loads(body)["error"]
    assert error["code"] == "body_too_large"
    assert "1024 bytes" in error["message"]


def test_a_second_answer_is_refused() -> None:
    answer = Recorder()
    answer.send(200, [])
    assert answer.started
    assert answer.ended
    with pytest.raises(RuntimeError, match="already been started"):
        answer.send(200, [])
