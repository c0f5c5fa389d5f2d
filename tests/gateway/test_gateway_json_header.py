"""The gateway's JSON answers (the HTTP server's own, the 401 of a missing key, the status
routes, the errors it decides) share one content-type header, defined in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import sluicegate.gateway
from sluicegate.gateway.app_keys import _UNAUTHORIZED_HEAD
from sluicegate.gateway.http import JSON_CONTENT_TYPE, error_answer

GATEWAY = Path(sluicegate.gateway.__file__).parent


def test_the_json_content_type_is_spelt_once() -> None:
    spelt = [
        f"{path.relative_to(GATEWAY)}:{node.lineno}"
        for path in sorted(GATEWAY.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == "application/json"
    ]
    assert [s.partition(":")[0] for s in spelt] == ["http/messages.py"], spelt
    assert JSON_CONTENT_TYPE == ("content-type", "application/json")


def test_the_server_and_the_key_check_answer_with_it() -> None:
    assert error_answer(400, "bad", "bad", "bad").headers[0] == JSON_CONTENT_TYPE
    assert _UNAUTHORIZED_HEAD[0] == JSON_CONTENT_TYPE
