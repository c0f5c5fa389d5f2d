"""Bad input, byte for byte: every row of :mod:`cases` against a gateway over a raw socket.

For each row: the status, an error that names the problem, the connection closed when
the input can no longer be trusted, and a good request served right after (on the same
connection when it stays open, and on a new one). ``CURRENT`` rows hold today;
``HARDENED`` rows and the tests marked "issue 14" are the hardening work's promises.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from cases import CURRENT, HARDENED, VALID, VALID_HARDENED, Case, Valid
from support import (
    BASE,
    GOOD,
    S_MAX_BODY,
    SMALL_BODY_LIMIT,
    close_quietly,
    good_request_succeeds,
    model_doc,
    read_answer,
    running,
    send_raw,
)

# One gateway serves every row that needs no settings of its own: each row also shows
# that the gateway survived all the rows before it.
pytestmark = pytest.mark.asyncio(loop_scope="module")

ALIAS = model_doc("alias", {BASE: 1})
"""A public name rewritten to the served one: the gateway re-serialises such bodies."""
SETTINGS = {S_MAX_BODY: SMALL_BODY_LIMIT}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def port() -> AsyncIterator[int]:
    """The shared gateway's port."""
    async with running(SETTINGS, [ALIAS]) as gw:
        yield gw.port


async def run_case(case: Case, port: int) -> None:
    if not case.settings:
        await check(case, port)
        return
    async with running({**SETTINGS, **case.settings}, [ALIAS]) as gw:
        await check(case, gw.port)


async def check(case: Case, port: int) -> None:
    ex = await send_raw(
        port,
        case.data,
        answers=case.before + 1,
        # A closing connection closes at once; an open one must not idle into the timeout.
        close_wait_s=1.0 if case.closes else 0.05,
        timeout_s=case.wait_s,
    )
    try:
        got = [(a.status, a.message()[:160]) for a in ex.answers]
        assert [s for s, _ in got] == [200] * case.before + [case.status], got
        bad = ex.answers[-1]
        assert re.search(case.names, bad.message(), re.IGNORECASE), bad.message()
        if case.closes:
            assert bad.headers.get("connection") == "close", bad.headers
            assert ex.closed, "the connection was left open after unreadable input"
        elif not ex.closed:  # kept alive: the same connection serves the next request
            ex.writer.write(GOOD)
            after = await read_answer(ex.reader)
            assert after.status == 200, after.body
    finally:
        close_quietly(ex.writer)
    await good_request_succeeds(port)


@pytest.mark.parametrize("case", CURRENT, ids=[c.id for c in CURRENT])
async def test_bad_input(port: int, case: Case) -> None:
    await run_case(case, port)


async def serve_valid(row: Valid, port: int) -> None:
    ex = await send_raw(
        port, row.data, head_only=row.head_only, close_wait_s=0.05, pause_s=row.pause_s
    )
    try:
        assert [a.status for a in ex.answers] == [200], [a.body[:200] for a in ex.answers]
        if not ex.closed:  # nothing stray followed the answer: the next one parses
            ex.writer.write(GOOD)
            assert (await read_answer(ex.reader)).status == 200
    finally:
        close_quietly(ex.writer)


@pytest.mark.parametrize("row", VALID, ids=[r.id for r in VALID])
async def test_valid_input(port: int, row: Valid) -> None:
    await serve_valid(row, port)


# ---------------------------------------------------------------------------- issue 14
# The hardening work's promises: these fail until its branches are merged.


@pytest.mark.parametrize("case", HARDENED, ids=[c.id for c in HARDENED])
async def test_bad_input_hardened(port: int, case: Case) -> None:
    """Issue 14."""
    await run_case(case, port)


@pytest.mark.parametrize("row", VALID_HARDENED, ids=[r.id for r in VALID_HARDENED])
async def test_valid_input_hardened(port: int, row: Valid) -> None:
    """Issue 14."""
    await serve_valid(row, port)


async def test_every_refusal_is_an_openai_error(port: int) -> None:
    """Issue 14: the HTTP layer's refusals (400, 413, 431) carry the same JSON error body
    as the gateway's own decisions: ``{"error": {"message", "type", "code"}}``."""
    wrong = []
    for case in (c for c in (*CURRENT, *HARDENED) if not c.settings):
        ex = await send_raw(
            port, case.data, answers=case.before + 1, close_wait_s=0.0, timeout_s=case.wait_s
        )
        close_quietly(ex.writer)
        error = ex.answers[-1].error() if ex.answers else None
        if (
            error is None
            or not isinstance(error.get("message"), str)
            or not isinstance(error.get("type"), str)
            or "code" not in error
            or ex.answers[-1].headers.get("content-type") != "application/json"
        ):
            wrong.append(case.id)
    assert not wrong, f"not an OpenAI-style error body: {wrong}"


async def test_no_traceback_for_a_non_utf8_authorization(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14: a 0xff byte in Authorization is a wrong key, not a crash."""
    caplog.set_level(logging.DEBUG, logger="sluicegate")
    data = HARDENED_BY_ID["auth/non-utf8-byte"].data
    ex = await send_raw(port, data, close_wait_s=0.2)
    close_quietly(ex.writer)
    assert [a.status for a in ex.answers] == [401]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    await good_request_succeeds(port)


HARDENED_BY_ID = {c.id: c for c in HARDENED}
