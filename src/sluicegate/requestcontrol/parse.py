"""Reading an OpenAI-style request: only the fields the gateway acts on.

The body is decoded once; ``model``, ``stream``, ``max_tokens`` / ``max_completion_tokens``,
``prompt`` / ``messages`` and ``cache_salt`` are checked (leniently, as model servers do);
every other field passes through untouched. The prompt text used for prefix affinity is the
completion prompt's UTF-8 bytes, or the chat ``messages`` serialised as JSON — prefix-stable
across the turns of a conversation. A body nested deeper than
:data:`~sluicegate.requestcontrol.jsonbytes.MAX_JSON_DEPTH` levels is a 400. Control headers
are parsed here too, so a malformed one (``x-slo-ttft-ms: soon``) is a 400 before any
decision is made.

Trust: the routing-control headers (:data:`ROUTING_HEADERS`: objective, model-name rewrite,
destination hints) choose a request's priority, target model or endpoint, so the hosts
pass them here only from trusted clients (:func:`without_routing_headers` drops them
otherwise); the per-request features — SLO objectives, fairness id,
``x-prediction-based-scheduling`` and its ``-off`` form — are every client's to set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from sluicegate.errors import GatewayError, bad_request
from sluicegate.lax import LaxValueError, as_bool, as_float, as_int
from sluicegate.requestcontrol.jsonbytes import MAX_JSON_DEPTH, within_depth
from sluicegate.tokens import BYTES_PER_TOKEN, count_bytes_tokens

RequestKind = Literal["completions", "chat", "other"]
"""``completions`` and ``chat``: the two generation routes, checked as vLLM checks them;
``other``: any other route the gateway passes through (:func:`parse_other`), of which only
``model``, ``stream`` and the prompt-like fields are read."""

# Header names as in ``pkg/epp/metadata/consts.go`` of GIE at 1748e829
# (https://github.com/kubernetes-sigs/gateway-api-inference-extension) and of llm-d-router
# at ebab6879 (https://github.com/llm-d/llm-d-router). The first name of each pair is the
# current one; the second is kept as an alias.
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
SLO_TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
OBJECTIVE_HEADERS = ("x-gateway-inference-objective", "x-llm-d-inference-objective")
FAIRNESS_HEADERS = ("x-gateway-inference-fairness-id", "x-llm-d-inference-fairness-id")
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
PREDICTION_BASED_HEADER = "x-prediction-based-scheduling"
"""``true``/``false``: schedule this request on latency predictions or not (GIE v1.2.0,
``pkg/epp/scheduling/framework/plugins/profile/slo_aware_profile_handler.go``); absent =
the ``latencyPredictor.predictionBasedSchedulingDefault`` setting."""
PREDICTION_OFF_HEADER = "x-prediction-based-scheduling-off"
"""Present, whatever its value: not on predictions — the opt-out GIE switched to when it made
prediction-based scheduling the default (commit 78ffe619, in v1.3.0; its guide
``site-src/guides/latency-based-predictor.md`` documents it through v1.4.0)."""
REQUEST_ID_HEADER = "x-request-id"
DEFAULT_FLOW = "default-flow"
MAX_HEADER_ID_LENGTH = 256
DESTINATION_HEADERS = (
    "x-gateway-destination-endpoint",
    "x-gateway-destination-endpoint-subset",
    "x-gateway-destination-endpoint-served",
)

# Headers honoured only from trusted clients: they choose priority, target or endpoint.
ROUTING_HEADERS = frozenset({*OBJECTIVE_HEADERS, MODEL_REWRITE_HEADER, *DESTINATION_HEADERS})
# Headers never passed through to a model server: they are the gateway's.
CONTROL_HEADERS = frozenset(
    {*ROUTING_HEADERS, *FAIRNESS_HEADERS, PREDICTION_BASED_HEADER, PREDICTION_OFF_HEADER}
)
# Every header parse_request reads: most requests carry none, and one set check skips them.
_READ_HEADERS = frozenset(
    {
        *SLO_TTFT_HEADERS,
        *SLO_TPOT_HEADERS,
        *OBJECTIVE_HEADERS,
        *FAIRNESS_HEADERS,
        MODEL_REWRITE_HEADER,
        PREDICTION_BASED_HEADER,
        PREDICTION_OFF_HEADER,
    }
)


@dataclass(slots=True)
class ParsedRequest:
    """A decoded request. Token counts are built-in tokens (4 bytes each)."""

    kind: RequestKind
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None
    prompt: bytes
    prompt_tokens: int
    cache_salt: str
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    objective: str | None
    fairness_id: str
    model_rewrite: str | None
    body_bytes: int
    raw: bytes
    """The body as sent (what goes upstream, with only ``model`` replaced if rewritten)."""
    prediction_based: bool | None = None
    """The ``x-prediction-based-scheduling`` header's choice; None when absent."""


def parse_request(kind: RequestKind, raw: bytes, headers: Mapping[str, str]) -> ParsedRequest:
    """Decode and check ``raw`` for the ``kind`` route; raises a 400 GatewayError.

    ``headers`` must have lower-case names.
    """
    body = _decode(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    try:
        stream = as_bool(body["stream"], "stream") if body.get("stream") is not None else False
        max_tokens = _max_tokens(body)
        prompt = _chat_prompt(body) if kind == "chat" else _completion_prompt(body)
    except LaxValueError as exc:
        raise bad_request(str(exc), exc.field) from None
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise bad_request("'cache_salt' must be a string", "cache_salt")
    return _parsed(kind, body, raw, headers, model, stream, max_tokens, prompt, salt or "")


def parse_other(raw: bytes, headers: Mapping[str, str], generates: bool = True) -> ParsedRequest:
    """Decode a request for a route passed through as it is (embeddings, the Responses
    API, tokenize, rerank, audio...); raises a 400 GatewayError.

    A JSON object body (``content-type`` JSON, or absent and the body starting with
    ``{``) is decoded once: its ``model``, when present, must be a non-empty string (it
    chooses the pool, as for completions); ``stream`` chooses how the answer is relayed;
    ``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` bound the expected
    output. The prompt for prefix affinity is the first of ``input``, ``prompt``,
    ``messages``, ``text``, ``query`` present; a JSON body that is not an object is a 400, as
    for completions. Any other body (empty, multipart audio, form data), or an object
    without ``model``, gives a model-less request (``model`` = ""): the director sends it
    to any ready endpoint of the default pool.
    ``generates``: False for routes that produce no tokens (embeddings, tokenize,
    scoring): the expected output is then one token, not a guess from the prompt.
    """
    content_type = headers.get("content-type", "")
    json_body = "json" in content_type.lower() or (
        not content_type and raw[:64].lstrip()[:1] == b"{"
    )
    body = _decode(raw) if json_body and raw else {}
    model = body.get("model", "")
    if not isinstance(model, str) or ("model" in body and not model):
        raise bad_request("'model' must be a non-empty string", "model")
    try:
        stream = as_bool(body["stream"], "stream") if body.get("stream") is not None else False
        max_tokens = _max_tokens(body, _OTHER_MAX_TOKENS) if generates else 1
    except LaxValueError as exc:
        raise bad_request(str(exc), exc.field) from None
    prompt = _other_prompt(body)
    salt = body.get("cache_salt")
    salt = salt if isinstance(salt, str) else ""
    parsed = _parsed("other", body, raw, headers, model, stream, max_tokens, prompt, salt)
    if not model:
        parsed.model_rewrite = None  # no ``model`` field to rewrite
    return parsed


_PROMPT_FIELDS = ("input", "prompt", "messages", "text", "query")
_OTHER_MAX_TOKENS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _other_prompt(body: dict[str, Any]) -> bytes:
    """The prompt-like field of a passed-through body, for prefix affinity only (the
    server judges its validity): text as UTF-8, a list of texts joined, token ids as
    their bytes, anything else (Responses input items, messages) as compact JSON."""
    for name in _PROMPT_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            return value.encode()
        try:
            return _completion_prompt({"prompt": value})
        except LaxValueError:
            return orjson.dumps(value)
    return b""


def _decode(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object within the depth limit; raises a 400 GatewayError."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit"):  # orjson's own, deeper than ours
            raise _too_deep() from None
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if not within_depth(body):
        raise _too_deep()
    return body


def _parsed(
    kind: RequestKind,
    body: dict[str, Any],
    raw: bytes,
    headers: Mapping[str, str],
    model: str,
    stream: bool,
    max_tokens: int | None,
    prompt: bytes,
    cache_salt: str,
) -> ParsedRequest:
    """The request of checked body fields, with its control headers read (a 400
    GatewayError for a malformed one)."""
    parsed = ParsedRequest(
        kind=kind,
        body=body,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        prompt=prompt,
        prompt_tokens=count_bytes_tokens(prompt),
        cache_salt=cache_salt,
        slo_ttft_ms=None,
        slo_tpot_ms=None,
        objective=None,
        fairness_id=DEFAULT_FLOW,
        model_rewrite=None,
        body_bytes=len(raw),
        raw=raw,
    )
    if not _READ_HEADERS.isdisjoint(headers):
        _read_headers(parsed, headers)
    return parsed


def without_routing_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` without the :data:`ROUTING_HEADERS`, for an untrusted client (the same
    mapping, not a copy, when it has none: the common case costs one set check)."""
    if ROUTING_HEADERS.isdisjoint(headers):
        return headers
    return {k: v for k, v in headers.items() if k not in ROUTING_HEADERS}


def _too_deep() -> GatewayError:
    return bad_request(f"request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")


def _read_headers(parsed: ParsedRequest, headers: Mapping[str, str]) -> None:
    """The control headers' values into ``parsed``; raises a 400 GatewayError."""
    try:
        parsed.slo_ttft_ms = _positive_ms(headers, SLO_TTFT_HEADERS)
        parsed.slo_tpot_ms = _positive_ms(headers, SLO_TPOT_HEADERS)
        parsed.prediction_based = _true_or_false(headers, PREDICTION_BASED_HEADER)
        if PREDICTION_OFF_HEADER in headers:  # an opt-out wins over any opt-in
            parsed.prediction_based = False
    except LaxValueError as exc:
        raise bad_request(str(exc), exc.field) from None
    parsed.objective = _identifier(headers, OBJECTIVE_HEADERS)
    parsed.fairness_id = _identifier(headers, FAIRNESS_HEADERS) or DEFAULT_FLOW
    parsed.model_rewrite = _identifier(headers, (MODEL_REWRITE_HEADER,))


def _max_tokens(
    body: dict[str, Any], fields: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
) -> int | None:
    for field in fields:
        value = body.get(field)
        if value is not None:
            number = as_int(value, field)
            if number < 1:
                raise LaxValueError(field, f"'{field}' must be at least 1, got {number}")
            return number
    return None


def _completion_prompt(body: dict[str, Any]) -> bytes:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt).encode()
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return b"".join((t & 0xFFFFFFFF).to_bytes(BYTES_PER_TOKEN, "little") for t in prompt)
    raise LaxValueError(
        "prompt", "'prompt' must be a string, a list of strings, or a list of token ids"
    )


def _chat_prompt(body: dict[str, Any]) -> bytes:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise LaxValueError("messages", "'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise LaxValueError("messages", f"messages[{i}] must be an object with a 'role'")
    return orjson.dumps(messages)


def _header(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


def _positive_ms(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    value = _header(headers, names)
    if value is None or value.strip() == "":
        return None
    name = next(n for n in names if n in headers)
    number = as_float(value, name)
    if number <= 0:
        raise LaxValueError(name, f"header '{name}' must be a positive number of ms")
    return number


def _true_or_false(headers: Mapping[str, str], name: str) -> bool | None:
    """``true`` or ``false`` (any case); None when absent or empty. Stricter than the body's
    booleans on purpose: the header's only spellings in the reference are these two."""
    value = headers.get(name)
    if value is None or value.strip() == "":
        return None
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise LaxValueError(name, f"header '{name}' must be true or false, got {value!r}")
    return lowered == "true"


def _identifier(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    value = _header(headers, names)
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_HEADER_ID_LENGTH or not value.isprintable():
        name = next(n for n in names if n in headers)  # the header actually sent
        # Not printable: control characters, or bytes that are not UTF-8 (the server
        # decodes them as surrogate escapes, which no encoder or log line accepts).
        too_long = len(value) > MAX_HEADER_ID_LENGTH
        problem = (
            f"is longer than {MAX_HEADER_ID_LENGTH} chars"
            if too_long
            else "must be printable UTF-8 text"
        )
        raise bad_request(f"header '{name}' {problem}", name)
    return value
