"""Bad input that needs more than one exchange to judge: slow heads, huge integers, bytes
that are not UTF-8 in logged headers, routing headers from clients, keys and connection
caps. Tests whose docstring starts with "Issue 14" check the hardening work's promises."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest
from support import (
    API_KEY,
    BASE,
    F_API_KEY_FILE,
    GOOD,
    IDLE_TIMEOUT_S,
    OTHER_MODEL,
    S_API_KEYS,
    S_MAX_BODY,
    S_MAX_BUFFERED,
    S_MAX_CONNECTIONS,
    S_TRUST_CONTROL,
    S_TRUSTED_KEYS,
    SECOND_KEY,
    GatewayFactory,
    RecordingUpstream,
    child_env,
    close_quietly,
    gateway_doc,
    good_body,
    good_request_succeeds,
    is_closed,
    model_doc,
    pool_doc,
    read_answer,
    request,
    send_raw,
)

from sluicegate.api.loader import ConfigError, build_config

HUGE = 10**23
"""Larger than any 64-bit integer: a JSON parser that turns it into a float loses it."""
REWRITE_HEADER = "x-gateway-model-name-rewrite"


async def test_a_slow_head_is_closed_after_the_idle_timeout(
    sim_cluster: Any, relgw: GatewayFactory
) -> None:
    """Slowloris: a head trickling in a byte at a time is cut at the idle timeout."""
    gw = await relgw((await sim_cluster(replicas=1)).urls)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
    started = asyncio.get_running_loop().time()
    closed = False
    try:
        while asyncio.get_running_loop().time() - started < IDLE_TIMEOUT_S * 4:
            writer.write(b"a")  # one byte per 0.1 s: never idle, never done
            if await is_closed(reader, 0.1):
                closed = True
                break
    except ConnectionError:
        closed = True
    finally:
        close_quietly(writer)
    elapsed = asyncio.get_running_loop().time() - started
    assert closed, "a trickling head kept its connection"
    assert elapsed <= IDLE_TIMEOUT_S * 2 + 0.5, elapsed
    await good_request_succeeds(gw.port)


async def _recorded(relgw: GatewayFactory, body: bytes) -> tuple[int, bytes, Any]:
    """Send ``body`` through a gateway in front of a recording server: (status, what the
    server received or b"", the answer's error)."""
    upstream = RecordingUpstream()
    await upstream.start()
    try:
        gw = await relgw([upstream.url], docs=[model_doc("alias", {BASE: 1})])
        ex = await send_raw(gw.port, request(body=body), close_wait_s=0.0)
        close_quietly(ex.writer)
        answer = ex.answers[0]
        received = upstream.bodies[-1] if upstream.bodies else b""
        return answer.status, received, answer.error()
    finally:
        await upstream.stop()


async def _huge_max_tokens(relgw: GatewayFactory, model: str) -> None:
    """max_tokens 10**23 for ``model``: the server receives those 24 digits, never 1e+23
    nor a rounded integer; or the gateway answers 400 naming max_tokens."""
    body = b'{"model": "%s", "prompt": "x", "max_tokens": %d}' % (model.encode(), HUGE)
    status, received, error = await _recorded(relgw, body)
    if status == 400:
        assert error is not None
        assert "max_tokens" in error["message"], error
        return
    assert status == 200, error
    assert b'"max_tokens":%d' % HUGE in received.replace(b" ", b""), received


async def test_a_huge_max_tokens_reaches_the_server_exactly(relgw: GatewayFactory) -> None:
    await _huge_max_tokens(relgw, BASE)


async def test_a_client_rewrite_header_is_not_forwarded(relgw: GatewayFactory) -> None:
    upstream = RecordingUpstream()
    await upstream.start()
    try:
        gw = await relgw([upstream.url])
        data = request(body=good_body(), headers=[(REWRITE_HEADER, BASE)])
        ex = await send_raw(gw.port, data, close_wait_s=0.0)
        close_quietly(ex.writer)
        assert [a.status for a in ex.answers] == [200]
        assert REWRITE_HEADER not in upstream.headers[-1]
    finally:
        await upstream.stop()


# ---------------------------------------------------------------------------- issue 14
# The hardening work's promises: these fail until its branches are merged.


async def test_a_huge_max_tokens_survives_a_model_rewrite(relgw: GatewayFactory) -> None:
    """Issue 14: a rewritten model name re-encodes the body; the integer must not turn
    into a float on the way."""
    await _huge_max_tokens(relgw, "alias")


async def test_a_non_utf8_request_id_is_answered_and_logged(
    sim_cluster: Any, relgw: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14: x-request-id with a 0xff byte under --access-log: answered, one access
    line written, and the connection still serves the next request."""
    gw = await relgw((await sim_cluster(replicas=1)).urls, access_log=True)
    caplog.set_level(logging.INFO, logger="sluicegate")
    data = request(body=good_body(), headers=[("x-request-id", "req-\udcff-1")])
    ex = await send_raw(gw.port, data, close_wait_s=0.05)
    try:
        assert [a.status for a in ex.answers] == [200], [a.body for a in ex.answers]
        assert not ex.closed, "the connection was aborted"
        ex.writer.write(GOOD)
        assert (await read_answer(ex.reader)).status == 200
    finally:
        close_quietly(ex.writer)
    access = [r for r in caplog.records if r.name == "sluicegate.access"]
    assert len(access) == 2, [r.getMessage() for r in caplog.records]
    assert orjson.loads(access[0].getMessage())["status"] == 200
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def _models_sent(
    relgw: GatewayFactory, settings: dict[str, Any], key: str, target: str
) -> list[str]:
    """``alias`` requests (split 100 % to the served model) sent with ``key`` and a
    rewrite header naming ``target``: the model each one reached the server with."""
    upstream = RecordingUpstream()
    await upstream.start()
    try:
        gw = await relgw([upstream.url], settings, [model_doc("alias", {BASE: 1})], keys=False)
        data = request(
            body={**good_body(), "model": "alias"},
            auth=False,
            headers=[("Authorization", f"Bearer {key}"), (REWRITE_HEADER, target)],
        )
        for _ in range(3):
            ex = await send_raw(gw.port, data, close_wait_s=0.0)
            close_quietly(ex.writer)
            assert [a.status for a in ex.answers] == [200], [a.message() for a in ex.answers]
        return [orjson.loads(b)["model"] for b in upstream.bodies]
    finally:
        await upstream.stop()


async def test_a_client_rewrite_header_without_trust_is_ignored(relgw: GatewayFactory) -> None:
    """Issue 14: without trustControlHeaders a client cannot pick the target model; the
    InferenceModel's weighted split still applies."""
    settings = {S_API_KEYS: [API_KEY], S_TRUST_CONTROL: False}
    assert await _models_sent(relgw, settings, API_KEY, OTHER_MODEL) == [BASE] * 3


async def test_a_trusted_key_may_rewrite_the_model(relgw: GatewayFactory) -> None:
    """Issue 14: a key listed in trustedApiKeys is trusted with control headers (an
    in-cluster caller); the others are not."""
    settings = {S_API_KEYS: [API_KEY, SECOND_KEY], S_TRUSTED_KEYS: [SECOND_KEY]}
    assert await _models_sent(relgw, settings, SECOND_KEY, OTHER_MODEL) == [OTHER_MODEL] * 3
    assert await _models_sent(relgw, settings, API_KEY, OTHER_MODEL) == [BASE] * 3


async def test_over_the_connection_cap_is_503_with_retry_after(
    sim_cluster: Any, relgw: GatewayFactory
) -> None:
    """Issue 14: connections past maxConnections get 503 + Retry-After and are closed;
    once some close, new ones are served."""
    gw = await relgw((await sim_cluster(replicas=1)).urls, {S_MAX_CONNECTIONS: 4})
    held = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(4)]
    try:
        ex = await send_raw(gw.port, GOOD)
        close_quietly(ex.writer)
        assert [a.status for a in ex.answers] == [503]
        assert int(ex.answers[0].headers["retry-after"]) >= 1
        assert ex.answers[0].error() is not None
    finally:
        for _, writer in held:
            close_quietly(writer)
    await asyncio.sleep(0.1)
    await good_request_succeeds(gw.port)


async def test_over_the_body_buffer_cap_is_503_with_retry_after(
    sim_cluster: Any, relgw: GatewayFactory
) -> None:
    """Issue 14: bodies being received count against maxBufferedBodyBytes across all
    connections; a body that would pass it gets 503 + Retry-After; the first one, once
    complete, is served."""
    limit = 200 * 1024
    gw = await relgw(
        (await sim_cluster(replicas=1)).urls,
        {S_MAX_BODY: limit, S_MAX_BUFFERED: 256 * 1024},
    )
    # A large body the server still accepts (a short prompt, a long ``user`` field).
    body = orjson.dumps({**good_body(), "user": "p" * (limit - 300)})
    assert len(body) <= limit
    data = request(body=body)
    split = len(data) - 40 * 1024  # all but the last 40 KiB: ~160 KiB buffered each
    first_r, first_w = await asyncio.open_connection("127.0.0.1", gw.port)
    try:
        first_w.write(data[:split])
        await first_w.drain()
        await asyncio.sleep(0.1)
        ex = await send_raw(gw.port, data[:split], timeout_s=2.0)
        close_quietly(ex.writer)
        assert [a.status for a in ex.answers] == [503]
        assert int(ex.answers[0].headers["retry-after"]) >= 1
        first_w.write(data[split:])
        answer = await read_answer(first_r)
        assert answer.status == 200, answer.body
    finally:
        close_quietly(first_w)


@pytest.mark.parametrize(
    "keys", [[""], ["   "], ["short-key"], [" " * 20]], ids=["empty", "blank", "short", "spaces"]
)
def test_weak_api_keys_in_the_config_are_refused(keys: list[str]) -> None:
    """Issue 14: an API key must be at least 16 characters, not blank."""
    with pytest.raises(ConfigError, match=S_API_KEYS):
        build_config([pool_doc(["127.0.0.1:1"]), gateway_doc(**{S_API_KEYS: keys})])


WEAK_KEYS = {"empty": "", "blank": "   ", "short": "short"}


def test_serve_refuses_a_weak_api_key() -> None:
    """Issue 14: ``serve --api-key ""`` (or blank, or short) exits 2 naming the problem,
    before it listens. The three run side by side: a gateway that wrongly starts is
    stopped after 10 s."""
    children = {
        name: subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--port", "0", "--api-key", key],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        for name, key in WEAK_KEYS.items()
    }
    results = {}
    deadline = time.monotonic() + 10
    for name, child in children.items():
        try:
            output, _ = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            output, _ = child.communicate()
        results[name] = (child.returncode, bool(re.search(rb"api[- _]?key", output, re.I)))
    assert results == dict.fromkeys(WEAK_KEYS, (2, True)), results


def test_serve_takes_keys_from_a_file() -> None:
    """Issue 14: a key need not appear in the process list: ``--api-key-file`` exists."""
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--help"],
        capture_output=True,
        env=child_env(),
        timeout=30,
    )
    assert done.returncode == 0
    assert F_API_KEY_FILE.encode() in done.stdout
