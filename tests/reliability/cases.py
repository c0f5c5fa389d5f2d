"""The catalogue of bad inputs, as data: what is sent (raw bytes) and what the client must see.

Refusals: :data:`CURRENT` holds what the gateway already does, :data:`HARDENED` what
issue 14 (hardening) adds. ``test_bad_input.py`` runs every row the same way: send the
bytes on a new connection, expect ``before`` pipelined answers of 200, then ``status``
with an error message matching ``names`` (a case-insensitive regex), the connection closed
if ``closes``, and a good request served afterwards. :data:`VALID` and
:data:`VALID_HARDENED` are odd but valid inputs that must be served. docs/reliability.md
lists every row (``test_catalogue.py`` checks it does).
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from support import (
    AUTH,
    BASE,
    BODY_TIMEOUT_MS,
    GOOD,
    S_BODY_TIMEOUT,
    S_METRICS_AUTH,
    SMALL_BODY_LIMIT,
    good_body,
    request,
)


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    data: bytes
    """Everything the client writes (then it waits for the answers)."""
    status: int
    names: str
    """Regex the error message must match (case-insensitive): the problem, named."""
    before: int = 0
    """Good requests pipelined ahead of the bad one, each answered 200 first, in order."""
    closes: bool = False
    """The connection must be closed after the answer (its input cannot be trusted)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Extra GatewayConfig spec fields for this case's gateway."""
    wait_s: float = 3.0
    """Longest wait for an answer (a gateway that waits for more input fails sooner)."""


def _post(body: bytes, *headers: tuple[str, str], length: bool = True) -> bytes:
    return request(body=body, headers=headers, length=length)


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


OK_JSON = _json(good_body())
"""A good completion body."""


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _arrays(depth: int) -> bytes:
    """``depth`` nested JSON arrays, as text (orjson cannot write more than 254 levels)."""
    return b"[" * depth + b"0" + b"]" * depth


def _chat_nested(depth: int) -> bytes:
    """A chat body ``depth`` containers deep in all: body, messages, message, arrays."""
    message = b'{"role": "user", "content": "hi", "extra": ' + _arrays(depth - 3) + b"}"
    return b'{"model": "%s", "messages": [%s]}' % (BASE.encode(), message)


def _completion_nested(depth: int, model: str = BASE) -> bytes:
    """A completion body ``depth`` containers deep in all: the body, then arrays."""
    return b'{"model": "%s", "prompt": "x", "max_tokens": 1, "vendor": %s}' % (
        model.encode(),
        _arrays(depth - 1),
    )


_BOMB_PAYLOAD = b'{"model": "%s", "prompt": "' % BASE.encode() + b"a" * (16 << 20) + b'"}'
ZIP_BOMB = gzip.compress(_BOMB_PAYLOAD, compresslevel=9)
"""16 MiB of JSON in ~16 KiB of gzip: well under ``maxBodyBytes`` on the wire, far over
it inflated."""
del _BOMB_PAYLOAD
GZIP_OK = gzip.compress(OK_JSON)
DEFLATE_OK = zlib.compress(OK_JSON)
CORRUPT_GZIP = GZIP_OK[:10] + b"\x00garbage, not deflate data" + GZIP_OK[-8:]


def _head_with(*lines: bytes, key: bool = True) -> bytes:
    """A POST head with ``lines`` as its only framing headers, then a blank line."""
    start = b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n"
    if key:
        start += b"Authorization: " + AUTH.encode() + b"\r\n"
    return start + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


_SMUGGLED = b"GET /metrics HTTP/1.1\r\nHost: gateway\r\n\r\n"
"""A second request hidden in a body, as a smuggling attack would hide it."""
_CHUNKED_SMUGGLE = b"0\r\n\r\n" + _SMUGGLED

CURRENT: list[Case] = [
    # --- request smuggling: conflicting or ambiguous framing is refused, never guessed
    Case(
        "smuggle/cl-te",
        _head_with(b"Content-Length: %d" % len(_CHUNKED_SMUGGLE), b"Transfer-Encoding: chunked")
        + _CHUNKED_SMUGGLE,
        400,
        r"content-length|transfer-encoding",
        closes=True,
    ),
    Case(
        "smuggle/te-cl",
        _head_with(b"Transfer-Encoding: chunked", b"Content-Length: 4") + _CHUNKED_SMUGGLE,
        400,
        r"content-length|transfer-encoding",
        closes=True,
    ),
    Case(
        "smuggle/duplicate-content-length-different",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"Content-Length: 2") + OK_JSON,
        400,
        r"content-length",
        closes=True,
    ),
    Case(
        "smuggle/duplicate-content-length-same",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"Content-Length: %d" % len(OK_JSON))
        + OK_JSON,
        400,
        r"content-length",
        closes=True,
    ),
    Case(
        "smuggle/content-length-list",
        _head_with(b"Content-Length: %d, %d" % (len(OK_JSON), len(OK_JSON))) + OK_JSON,
        400,
        r"content-length",
        closes=True,
    ),
    Case(
        "smuggle/transfer-encoding-not-chunked-last",
        _head_with(b"Transfer-Encoding: chunked, identity") + _chunked(OK_JSON),
        400,
        r"transfer-encoding",
        closes=True,
    ),
    Case(
        "smuggle/transfer-encoding-obfuscated",
        _head_with(b"Transfer-Encoding: xchunked") + _chunked(OK_JSON),
        501,  # a transfer coding the server does not implement (RFC 9112 §6.1)
        r"transfer coding 'xchunked'",
        closes=True,
    ),
    Case(
        "smuggle/space-before-colon",
        _head_with(b"Transfer-Encoding : chunked") + _chunked(OK_JSON),
        400,
        r"header|malformed",
        closes=True,
    ),
    Case(
        "smuggle/content-length-not-a-number",
        _head_with(b"Content-Length: 12abc") + OK_JSON,
        400,
        r"content-length",
        closes=True,
    ),
    Case(
        "smuggle/content-length-negative",
        _head_with(b"Content-Length: -1") + OK_JSON,
        400,
        r"content-length",
        closes=True,
    ),
    Case(
        "smuggle/content-length-overflow",
        _head_with(b"Content-Length: 99999999999999999999999") + OK_JSON,
        400,
        r"content-length",
        closes=True,
    ),
    # --- chunked framing
    Case(
        "chunk/size-not-hex",
        _head_with(b"Transfer-Encoding: chunked") + b"zz\r\n" + OK_JSON + b"\r\n0\r\n\r\n",
        400,
        r"chunk",
        closes=True,
    ),
    Case(
        "chunk/size-overflow",
        _head_with(b"Transfer-Encoding: chunked") + b"fffffffffffffffffff\r\nabc\r\n",
        400,
        r"chunk|content-length",
        closes=True,
    ),
    Case(
        "chunk/size-negative",
        _head_with(b"Transfer-Encoding: chunked") + b"-5\r\nabcde\r\n0\r\n\r\n",
        400,
        r"chunk",
        closes=True,
    ),
    Case(
        "chunk/data-longer-than-size",
        _head_with(b"Transfer-Encoding: chunked") + b"2\r\nabcdef\r\n0\r\n\r\n",
        400,
        r"chunk|malformed",
        closes=True,
    ),
    # --- characters the grammar forbids in a head
    Case(
        "head/obs-fold",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"X-Folded: a", b" b") + OK_JSON,
        400,
        r"header|malformed",
        closes=True,
    ),
    Case(
        "head/bare-cr",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"X-A: a\rb") + OK_JSON,
        400,
        r"header|malformed|cr",
        closes=True,
    ),
    Case(
        "head/nul-in-header-value",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"X-A: a\x00b") + OK_JSON,
        400,
        r"header|malformed",
        closes=True,
    ),
    Case(
        "head/nul-in-header-name",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"X-\x00A: b") + OK_JSON,
        400,
        r"header|malformed",
        closes=True,
    ),
    Case(
        "head/nul-in-target",
        b"GET /hea\x00lth HTTP/1.1\r\nHost: gateway\r\n\r\n",
        400,
        r"url|malformed|target",
        closes=True,
    ),
    Case(
        "head/header-without-colon",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"NoColonHere") + OK_JSON,
        400,
        r"header|malformed",
        closes=True,
    ),
    Case(
        "head/not-http",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 tls hello\r\n\r\n",
        400,
        r"malformed|method",
        closes=True,
    ),
    Case(
        "head/unknown-version",
        b"GET /health HTTP/7.3\r\nHost: gateway\r\n\r\n",
        400,
        r"version|malformed",
        closes=True,
    ),
    Case(
        "head/bare-lf-line-ends",
        b"GET /v1/models HTTP/1.1\nHost: gateway\nAuthorization: %s\n\n" % AUTH.encode(),
        400,
        r"malformed|lf|line",
        closes=True,
    ),
    Case(
        "head/request-line-too-long",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: gateway\r\n\r\n",
        431,
        r"too large",
        closes=True,
    ),
    Case(
        "head/header-too-long",
        request("GET", "/health", headers=[("X-Big", "b" * 70_000)]),
        431,
        r"too large",
        closes=True,
    ),
    Case(
        "head/too-many-headers",
        request("GET", "/health", headers=[(f"X-H{i}", "v" * 40) for i in range(2_000)]),
        431,
        r"too large",
        closes=True,
    ),
    # --- size limits
    Case(
        "size/content-length-over-limit",
        _head_with(b"Content-Length: %d" % (SMALL_BODY_LIMIT + 1)),
        413,
        r"larger than|too large",
        closes=True,
    ),
    Case(
        "size/chunked-over-limit",
        _head_with(b"Transfer-Encoding: chunked")
        + _chunked(*[b"x" * 16_384] * (SMALL_BODY_LIMIT // 16_384 + 1)),
        413,
        r"larger than|too large",
        closes=True,
    ),
    Case(
        "size/over-limit-with-expect-continue",
        _head_with(b"Content-Length: %d" % (SMALL_BODY_LIMIT * 4), b"Expect: 100-continue"),
        413,
        r"larger than|too large",
        closes=True,
    ),
    # --- routes
    # (/v1/... and /v2/... are passed through to the servers: their 404 is the server's.)
    Case("route/unknown", request("GET", "/nothing"), 404, r"/nothing is not a route"),
    Case(
        "route/admin-not-passed",
        request("POST", "/v1/load_lora_adapter", OK_JSON),
        404,
        r"administrative route",
    ),
    Case(
        "route/disguised-admin-not-passed",
        request("POST", "/v1/load%5Flora_adapter", OK_JSON),
        404,
        r"percent escapes",
    ),
    Case("route/wrong-method", request("GET", "/v1/completions"), 405, r"POST"),
    Case("route/wrong-method-health", request("DELETE", "/health"), 405, r"GET"),
    # --- API keys
    Case("auth/no-key", request(body=OK_JSON, auth=False), 401, r"api key"),
    Case(
        "auth/wrong-key",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "Bearer wrong-key-but-long")]),
        401,
        r"api key",
    ),
    Case(
        "auth/key-without-bearer",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "rel-suite-key-0123456789")]),
        401,
        r"api key",
    ),
    Case(
        "auth/empty-bearer",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "Bearer ")]),
        401,
        r"api key",
    ),
    Case(
        "auth/whitespace-bearer",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "Bearer    \t ")]),
        401,
        r"api key",
    ),
    Case(
        "auth/basic-scheme",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "Basic dXNlcjpwYXNz")]),
        401,
        r"api key",
    ),
    Case(
        "auth/prefix-of-the-key",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "Bearer rel-suite-key")]),
        401,
        r"api key",
    ),
    Case(
        "auth/models-without-key",
        request("GET", "/v1/models", auth=False),
        401,
        r"api key",
    ),
    # --- bodies
    Case("body/not-json", _post(b"{model: tiny"), 400, r"json"),
    Case("body/empty", _post(b"", ("Content-Length", "0"), length=False), 400, r"json"),
    Case("body/invalid-utf8", _post(b'{"model": "tiny-\xff", "prompt": "x"}'), 400, r"json"),
    Case("body/trailing-garbage", _post(OK_JSON + b" trailing"), 400, r"json"),
    Case("body/array", _post(b"[1, 2]"), 400, r"object"),
    Case("body/string", _post(b'"a string"'), 400, r"object"),
    Case("body/null", _post(b"null"), 400, r"object"),
    Case("body/number", _post(b"42"), 400, r"object"),
    Case("model/missing", _post(_json({"prompt": "x"})), 400, r"model"),
    Case("model/empty", _post(_json({"model": "", "prompt": "x"})), 400, r"model"),
    Case("model/number", _post(_json({"model": 7, "prompt": "x"})), 400, r"model"),
    Case("model/null", _post(_json({"model": None, "prompt": "x"})), 400, r"model"),
    Case("model/list", _post(_json({"model": [BASE], "prompt": "x"})), 400, r"model"),
    Case("model/unknown", _post(_json({"model": "nobody-serves", "prompt": "x"})), 404, r"model"),
    Case("stream/string", _post(_json({**good_body(), "stream": "maybe"})), 400, r"stream"),
    Case("stream/number", _post(_json({**good_body(), "stream": 3})), 400, r"stream"),
    Case("stream/object", _post(_json({**good_body(), "stream": {}})), 400, r"stream"),
    Case(
        "max_tokens/string", _post(_json({**good_body(), "max_tokens": "many"})), 400, r"max_tokens"
    ),
    Case("max_tokens/zero", _post(_json({**good_body(), "max_tokens": 0})), 400, r"max_tokens"),
    Case(
        "max_tokens/negative", _post(_json({**good_body(), "max_tokens": -1})), 400, r"max_tokens"
    ),
    Case(
        "max_tokens/fraction", _post(_json({**good_body(), "max_tokens": 1.5})), 400, r"max_tokens"
    ),
    Case("max_tokens/bool", _post(_json({**good_body(), "max_tokens": True})), 400, r"max_tokens"),
    Case("prompt/object", _post(_json({"model": BASE, "prompt": {"a": 1}})), 400, r"prompt"),
    Case("prompt/missing", _post(_json({"model": BASE})), 400, r"prompt"),
    Case(
        "chat/messages-empty",
        request("POST", "/v1/chat/completions", _json({"model": BASE, "messages": []})),
        400,
        r"messages",
    ),
    Case(
        "chat/message-without-role",
        request("POST", "/v1/chat/completions", _json({"model": BASE, "messages": [{}]})),
        400,
        r"messages",
    ),
    Case(
        "json/nested-beyond-parser-limit",
        _post(_completion_nested(1_025)),
        400,
        r"depth|nest|recursion",
    ),
    Case(
        "header/slo-not-a-number",
        request(body=OK_JSON, headers=[("x-slo-ttft-ms", "soon")]),
        400,
        r"x-slo-ttft-ms",
    ),
    Case(
        "header/objective-too-long",
        request(body=OK_JSON, headers=[("x-gateway-inference-objective", "o" * 300)]),
        400,
        r"x-gateway-inference-objective",
        settings={"trustControlHeaders": True},  # read (and checked) from trusted clients only
    ),
]

_NESTED_CHAT_PATH = "/v1/chat/completions"

HARDENED: list[Case] = [
    # --- RFC 9112 §3.2: a request without exactly one Host is a 400
    Case(
        "host/missing",
        request("GET", "/v1/models", host=False),
        400,
        r"host",
        closes=True,
    ),
    Case(
        "host/twice",
        request("GET", "/v1/models", headers=[("Host", "other")]),
        400,
        r"host",
        closes=True,
    ),
    # --- a bad request inside a pipeline: the ones before it answered, then its error,
    # then the close (the good request written after it is never answered)
    Case(
        "pipeline/smuggling-after-two-good",
        GOOD
        + GOOD
        + _head_with(b"Content-Length: 5", b"Transfer-Encoding: chunked")
        + _CHUNKED_SMUGGLE
        + GOOD,  # after the bad one: never answered
        400,
        r"content-length|transfer-encoding",
        before=2,
        closes=True,
    ),
    Case(
        "pipeline/oversized-after-two-good",
        GOOD + GOOD + _head_with(b"Content-Length: %d" % (SMALL_BODY_LIMIT + 1)) + GOOD,
        413,
        r"larger than|too large",
        before=2,
        closes=True,
    ),
    Case(
        "pipeline/garbage-after-one-good",
        GOOD + b"THIS IS NOT HTTP\r\n\r\n" + GOOD,
        400,
        r"malformed|method",
        before=1,
        closes=True,
    ),
    # --- the head decides: no key, no body read
    Case(
        "auth/unauthenticated-body-not-read",
        _head_with(b"Content-Length: %d" % (SMALL_BODY_LIMIT // 2), key=False),
        401,
        r"api key",
        closes=True,
        wait_s=1.5,
    ),
    Case(
        "auth/non-utf8-byte",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "Bearer \udcffkey")]),
        401,
        r"api key",
    ),
    # --- a body that stops arriving
    Case(
        "size/body-stalls",
        _head_with(b"Content-Length: 100") + b'{"model": ',
        408,
        r"body|time",
        closes=True,
        settings={S_BODY_TIMEOUT: BODY_TIMEOUT_MS},
    ),
    # --- nesting orjson reads (up to 1,024 levels) but cannot write (255 and more)
    Case(
        "json/nested-255-chat",
        request("POST", _NESTED_CHAT_PATH, _chat_nested(255)),
        400,
        r"depth|nest",
    ),
    Case(
        "json/nested-1023-chat",
        request("POST", _NESTED_CHAT_PATH, _chat_nested(1_023)),
        400,
        r"depth|nest",
    ),
    Case(
        "json/nested-255-rewritten-model",
        _post(_completion_nested(255, model="alias")),
        400,
        r"depth|nest",
    ),
    Case(
        "json/nested-1023-completion",
        _post(_completion_nested(1_023)),
        400,
        r"depth|nest",
    ),
    # --- Content-Encoding of request bodies (RFC 9110 §8.4)
    Case("encoding/br-unsupported", _post(GZIP_OK, ("Content-Encoding", "br")), 415, r"br"),
    Case(
        "encoding/corrupt-gzip",
        _post(CORRUPT_GZIP, ("Content-Encoding", "gzip")),
        400,
        r"gzip|decompress|encoding",
    ),
    Case(
        "encoding/zip-bomb",
        _post(ZIP_BOMB, ("Content-Encoding", "gzip")),
        413,
        r"larger than|too large",
    ),
    Case(
        "encoding/gzip-then-unknown",
        _post(GZIP_OK, ("Content-Encoding", "gzip, zstd-made-up")),
        415,
        r"zstd-made-up",
    ),
    # --- probes and metrics
    Case(
        "metrics/auth-on-without-key",
        request("GET", "/metrics", auth=False),
        401,
        r"api key",
        settings={S_METRICS_AUTH: True},
    ),
]


@dataclass(frozen=True, slots=True)
class Valid:
    """An input that looks odd but is valid: it must be served (a check that the refusals
    above do not over-reach)."""

    id: str
    data: bytes
    head_only: bool = False
    pause_s: float = 0.0
    """Pause between the two halves of ``data`` (a request split across reads)."""


VALID: list[Valid] = [
    Valid("http10-without-host", b"GET /health HTTP/1.0\r\n\r\n"),
    Valid("split-across-reads", GOOD, pause_s=0.1),
    # Not read from an untrusted client, so not checked either: it is dropped.
    Valid(
        "objective-header-from-an-untrusted-client",
        request(body=OK_JSON, headers=[("x-gateway-inference-objective", "o" * 300)]),
    ),
    Valid(
        "chunked-body",
        _head_with(b"Transfer-Encoding: chunked") + _chunked(OK_JSON[:9], OK_JSON[9:]),
    ),
    Valid(
        "expect-100-continue",
        _head_with(b"Content-Length: %d" % len(OK_JSON), b"Expect: 100-continue") + OK_JSON,
    ),
    Valid(
        "lower-case-bearer",
        request(body=OK_JSON, auth=False, headers=[("Authorization", "bearer " + AUTH[7:])]),
    ),
    Valid("no-content-type", _head_with(b"Content-Length: %d" % len(OK_JSON)) + OK_JSON),
    Valid("identity-encoding", _post(OK_JSON, ("Content-Encoding", "identity"))),
    Valid("max-tokens-as-string", _post(_json({**good_body(), "max_tokens": "2"}))),
    Valid("nested-100-chat", request("POST", _NESTED_CHAT_PATH, _chat_nested(100))),
    Valid("nested-100-rewritten-model", _post(_completion_nested(100, model="alias"))),
]

VALID_HARDENED: list[Valid] = [
    Valid("gzip-body", _post(GZIP_OK, ("Content-Encoding", "gzip"))),
    Valid("deflate-body", _post(DEFLATE_OK, ("Content-Encoding", "deflate"))),
    Valid("head-health", request("HEAD", "/health", auth=False), head_only=True),
]
"""Issue 14: compressed bodies are inflated; HEAD is GET without the body."""
