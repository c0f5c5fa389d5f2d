"""OpenAI-style request parsing and response bodies, as lax as vLLM's.

Numeric fields accept numbers or numeric strings (``"temperature": "0"``), booleans accept
``true``/``false`` in any of the forms pydantic's lax mode takes. Errors carry the HTTP
status and name the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from sluicegate.lax import LaxValueError, as_bool, as_float, as_int
from sluicegate.sim.text import PromptError, render_chat, render_prompt


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


def parse_generate(raw: bytes, chat: bool) -> GenerateRequest:
    """Parse and validate a ``/v1/completions`` (or chat, if ``chat``) request body."""
    try:
        return _parse_generate(raw, chat)
    except LaxValueError as exc:
        raise ApiError(400, str(exc), exc.field) from None


def _parse_generate(raw: bytes, chat: bool) -> GenerateRequest:
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

    max_tokens: int | None = None
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is not None:
            max_tokens = as_int(value, field)
            if max_tokens < 1:
                raise ApiError(400, f"'{field}' must be at least 1, got {max_tokens}", field)
            break
    n = body.get("n")
    if n is not None and as_int(n, "n") != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if body.get(field) is not None:
            as_float(body[field], field)
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
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": max(0, cached_tokens)},
    }


def completion_body(
    req_id: str,
    created: int,
    model: str,
    chat: bool,
    text: str,
    finish_reason: str,
    usage_block: dict[str, Any],
) -> bytes:
    """A whole non-streaming response."""
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        kind = "text_completion"
    return orjson.dumps(
        {
            "id": req_id,
            "object": kind,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage_block,
        }
    )


def stream_chunk(
    req_id: str,
    created: int,
    model: str,
    chat: bool,
    text: str | None,
    finish_reason: str | None,
    usage_block: dict[str, Any] | None = None,
    role: bool = False,
) -> bytes:
    """One SSE frame (``data: {...}\\n\\n``). ``text=None`` makes a usage-only chunk."""
    chunk: dict[str, Any] = {
        "id": req_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
    }
    if text is None:
        chunk["choices"] = []
    elif chat:
        delta: dict[str, Any] = (
            {"role": "assistant", "content": text} if role else {"content": text}
        )
        chunk["choices"] = [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        ]
    else:
        chunk["choices"] = [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ]
    if usage_block is not None:
        chunk["usage"] = usage_block
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


STREAM_DONE = b"data: [DONE]\n\n"
