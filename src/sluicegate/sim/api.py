"""OpenAI-style request parsing and response bodies, as lax as vLLM's.

Numeric fields accept numbers or numeric strings (``"temperature": "0"``), booleans accept
``true``/``false`` in any of the forms pydantic's lax mode takes. Errors carry the HTTP
status and name the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from sluicegate.lax import LaxValueError, as_bool, as_float, as_int
from sluicegate.sim.text import PromptError, render_chat, render_prompt, token_logprobs

if TYPE_CHECKING:
    from sluicegate.sim.prompt_tokens import PromptTokens

MAX_N = 64
"""Most choices one request may ask for (vLLM's limit, ``VLLM_MAX_N_SEQUENCES``, is 16,384:
the simulator keeps a request's fan-out within what a test or benchmark needs)."""
MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""
FULL_VOCAB_SIZE = 128_256
"""What ``logprobs: -1`` (the whole vocabulary) means: Llama-3's vocabulary size."""


class ApiError(Exception):
    """An error answered to the client as ``{"error": {...}}`` with ``status``."""

    _TYPES: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        404: "NotFoundError",
        413: "BadRequestError",
    }

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self._TYPES.get(self.status, "InternalServerError"),
                    "param": self.param,
                    "code": self.status,
                }
            }
        )


@dataclass(slots=True)
class GenerateRequest:
    """The fields of a completions or chat request the simulator acts on."""

    chat: bool
    model: str
    prompt: bytes
    max_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    cache_salt: str
    n: int = 1
    """Choices to generate; each is its own sequence in the engine."""
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    """Top log-probabilities per token (completions ``logprobs``, chat ``top_logprobs``);
    ``None``: no logprobs at all."""

    @property
    def hold_back(self) -> int:
        """Characters a stream holds back while a stop string may be forming (as vLLM's
        ``output_text_buffer_length``)."""
        if self.stop and not self.include_stop_str:
            return max(len(s) for s in self.stop) - 1
        return 0


def parse_generate(raw: bytes, chat: bool, tokens: PromptTokens | None = None) -> GenerateRequest:
    """Parse and validate a ``/v1/completions`` (or chat, if ``chat``) request body;
    with ``tokens``, a prompt it can render is sized in that model's tokens
    (:mod:`sluicegate.sim.prompt_tokens`)."""
    try:
        return _parse_generate(raw, chat, tokens)
    except LaxValueError as exc:
        raise ApiError(400, str(exc), exc.field) from None


def _parse_generate(raw: bytes, chat: bool, tokens: PromptTokens | None) -> GenerateRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must be a non-empty string", "model")
    try:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise ApiError(400, "'messages' must be a list", "messages")
            prompt = render_chat(messages)
        else:
            if "prompt" not in body:
                raise ApiError(400, "'prompt' is required", "prompt")
            prompt = render_prompt(body["prompt"])
    except PromptError as exc:
        raise ApiError(400, str(exc), "messages" if chat else "prompt") from None
    if not prompt:
        raise ApiError(400, "the prompt is empty", "messages" if chat else "prompt")
    if tokens is not None:
        prompt = tokens.encode(body, chat) or prompt

    max_tokens: int | None = None
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is not None:
            max_tokens = as_int(value, field)
            if max_tokens < 1:
                raise ApiError(400, f"'{field}' must be at least 1, got {max_tokens}", field)
            break
    n = 1 if body.get("n") is None else as_int(body["n"], "n")
    if n < 1:
        raise ApiError(400, f"n must be at least 1, got {n}.", "n")
    if n > MAX_N:
        raise ApiError(400, f"n must be at most {MAX_N}, got {n}.", "n")
    for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if body.get(field) is not None:
            as_float(body[field], field)
    if (
        n > 1
        and body.get("temperature") is not None
        and as_float(body["temperature"], "temperature") == 0
    ):
        raise ApiError(400, f"n must be 1 when using greedy sampling, got {n}.", "n")
    min_tokens = 0 if body.get("min_tokens") is None else as_int(body["min_tokens"], "min_tokens")
    if min_tokens < 0:
        raise ApiError(
            400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.", "min_tokens"
        )
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(
            400,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            "min_tokens",
        )
    stop, stop_ids = _parse_stop(body)
    include_stop = False
    if body.get("include_stop_str_in_output") is not None:
        include_stop = as_bool(body["include_stop_str_in_output"], "include_stop_str_in_output")
    stream = as_bool(body["stream"], "stream") if body.get("stream") is not None else False
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not isinstance(options, dict):
            raise ApiError(400, "'stream_options' must be an object", "stream_options")
        if options.get("include_usage") is not None:
            include_usage = as_bool(options["include_usage"], "stream_options.include_usage")
        if options.get("continuous_usage_stats") is not None:
            continuous = as_bool(
                options["continuous_usage_stats"], "stream_options.continuous_usage_stats"
            )
        # As in vLLM, per-chunk usage is only sent when usage is asked for at all.
        continuous = continuous and include_usage
    ignore_eos = False
    if body.get("ignore_eos") is not None:
        ignore_eos = as_bool(body["ignore_eos"], "ignore_eos")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise ApiError(400, "'cache_salt' must be a string", "cache_salt")
    return GenerateRequest(
        chat=chat,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        cache_salt=salt or "",
        n=n,
        stop=stop,
        stop_token_ids=stop_ids,
        include_stop_str=include_stop,
        min_tokens=min_tokens,
        logprobs=_parse_logprobs(body, chat),
    )


def _parse_stop(body: dict[str, Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    raw = body.get("stop")
    if raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(raw, str):
        stop = (raw,)
    elif isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        stop = tuple(dict.fromkeys(raw))
    else:
        raise ApiError(400, "'stop' must be a string or a list of strings", "stop")
    if any(not s for s in stop):
        raise ApiError(400, "stop cannot contain an empty string.", "stop")
    raw_ids = body.get("stop_token_ids")
    if raw_ids is None:
        ids: tuple[int, ...] = ()
    elif isinstance(raw_ids, list):
        ids = tuple(dict.fromkeys(as_int(t, "stop_token_ids") for t in raw_ids))
    else:
        raise ApiError(400, "'stop_token_ids' must be a list of integers", "stop_token_ids")
    return stop, ids


def _parse_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """The number of top logprobs asked for, checked as vLLM checks it; None: none."""
    if chat:
        wanted = body.get("logprobs") is not None and as_bool(body["logprobs"], "logprobs")
        top = (
            0 if body.get("top_logprobs") is None else as_int(body["top_logprobs"], "top_logprobs")
        )
        if top < 0 and top != -1:
            raise ApiError(400, "`top_logprobs` must be a positive value or -1.", "top_logprobs")
        if top != 0 and not wanted:
            raise ApiError(
                400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        if not wanted:
            return None
        count = top
    else:
        if body.get("logprobs") is None:
            return None
        count = as_int(body["logprobs"], "logprobs")
        if count < 0 and count != -1:
            raise ApiError(400, "`logprobs` must be a positive value or -1.", "logprobs")
    requested = FULL_VOCAB_SIZE if count == -1 else count
    if requested > MAX_LOGPROBS:
        raise ApiError(
            400,
            f"Requested sample logprobs of {requested}, which is greater than max allowed: "
            f"{MAX_LOGPROBS} (parameter=logprobs, value={count})",
            "logprobs",
        )
    return requested


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": max(0, cached_tokens)},
    }


def completion_logprobs(seed: int, start: int, end: int, k: int, offset: int) -> dict[str, Any]:
    """vLLM's completions ``logprobs`` for generated tokens ``start``..``end-1``.

    ``top_logprobs`` maps the sampled token first, then the top ``k`` (so ``k + 1`` entries
    when the sampled token is not among them); ``text_offset`` counts characters from
    ``offset`` (the text already returned), each token adding its full length.
    """
    tokens: list[str] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    offsets: list[int] = []
    for i in range(start, end):
        lp = token_logprobs(seed, i, k)
        token = lp.piece.decode()
        top = {token: lp.logprob}
        for piece, value in lp.top:
            top.setdefault(piece.decode(), value)
        tokens.append(token)
        values.append(lp.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def chat_logprobs(seed: int, start: int, end: int, k: int) -> dict[str, Any]:
    """vLLM's chat ``logprobs`` (``{"content": [...]}``) for tokens ``start``..``end-1``.

    As vLLM builds it, ``top_logprobs`` is the first ``k`` of: the sampled token, then the
    likeliest others.
    """
    content: list[dict[str, Any]] = []
    for i in range(start, end):
        lp = token_logprobs(seed, i, k)
        token = lp.piece.decode()
        ranked = {token: lp.logprob}
        for piece, value in lp.top:
            ranked.setdefault(piece.decode(), value)
        top = [
            {"token": t, "logprob": v, "bytes": list(t.encode())}
            for t, v in list(ranked.items())[:k]
        ]
        content.append(
            {
                "token": token,
                "logprob": lp.logprob,
                "bytes": list(token.encode()),
                "top_logprobs": top,
            }
        )
    return {"content": content}


def choice(
    chat: bool,
    index: int,
    text: str,
    finish_reason: str | None,
    stop_reason: str | int | None,
    logprobs: dict[str, Any] | None,
    stream: bool,
    role: bool = False,
) -> dict[str, Any]:
    """One entry of ``choices``: whole (``stream`` false) or a stream delta."""
    if not chat:
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }
    if stream:
        delta: dict[str, Any] = (
            {"role": "assistant", "content": text} if role else {"content": text}
        )
        out = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            out["stop_reason"] = stop_reason
        return out
    return {
        "index": index,
        "message": {"role": "assistant", "content": text, "tool_calls": []},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def completion_body(
    req_id: str,
    created: int,
    model: str,
    chat: bool,
    choices: list[dict[str, Any]],
    usage_block: dict[str, Any],
) -> bytes:
    """A whole non-streaming response."""
    return orjson.dumps(
        {
            "id": req_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": usage_block,
        }
    )


def stream_chunk(
    req_id: str,
    created: int,
    model: str,
    chat: bool,
    choices: list[dict[str, Any]],
    usage_block: dict[str, Any] | None = None,
) -> bytes:
    """One SSE frame (``data: {...}\\n\\n``); no ``choices`` makes a usage-only chunk."""
    chunk: dict[str, Any] = {
        "id": req_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage_block is not None:
        chunk["usage"] = usage_block
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


STREAM_DONE = b"data: [DONE]\n\n"
