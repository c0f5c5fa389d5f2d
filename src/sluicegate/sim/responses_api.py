"""The simulator's ``POST /v1/responses`` (the OpenAI Responses API, as vLLM serves it).

``input`` (a string or message items with text parts) and ``instructions`` become a chat
prompt that goes through the engine like a chat request, so it costs simulated time and KV
cache. The answer is a Response object, or — ``stream: true`` — its events
(``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, one ``response.output_text.delta`` per token,
``response.output_text.done`` … ``response.completed``, whose ``response.usage`` carries
``input_tokens`` / ``output_tokens``), each as ``event: <type>`` and ``data: <json>``
lines. Shapes as in the OpenAI API reference
(https://platform.openai.com/docs/api-reference/responses-streaming) and vLLM's
``vllm/entrypoints/openai/serving_responses.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from sluicegate.lax import LaxValueError, as_bool, as_int
from sluicegate.sim import api
from sluicegate.sim.reply import (
    inject_faults,
    json_body,
    json_reply,
    model_of,
    replica_headers,
)
from sluicegate.sim.text import PromptError, render_chat

if TYPE_CHECKING:
    from sluicegate.sim.driver import Handle
    from sluicegate.sim.server import Replica


@dataclass(slots=True)
class _Exchange:
    """One Responses request in the engine."""

    handle: Handle
    body: dict[str, Any]
    model: str
    created: int
    """Unix time (s) the request arrived."""

    @property
    def ids(self) -> tuple[str, str]:
        """The response's and its message's ids."""
        suffix = self.handle.seq.request_id.removeprefix("chatcmpl-")
        return f"resp_{suffix}", f"msg_{suffix}"

    def message(self, text: str, status: str) -> dict[str, object]:
        part: dict[str, object] = {
            "type": "output_text",
            "text": text,
            "annotations": [],
            "logprobs": None,
        }
        return {
            "id": self.ids[1],
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [part] if status == "completed" else [],
        }

    def response(self, done: bool) -> dict[str, object]:
        """The Response object: ``in_progress`` without output, or finished —
        ``completed``, ``incomplete`` when cut at ``max_output_tokens``."""
        seq, body = self.handle.seq, self.body
        status = "in_progress"
        if done:
            status = "incomplete" if seq.finish_reason == "length" else "completed"
        usage = None
        if done:
            usage = {
                "input_tokens": seq.prompt_tokens,
                "input_tokens_details": {"cached_tokens": max(0, seq.num_cached_prompt_tokens)},
                "output_tokens": seq.num_output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": seq.prompt_tokens + seq.num_output,
            }
        return {
            "id": self.ids[0],
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "output": [self.message(seq.output_text(), "completed")] if done else [],
            "parallel_tool_calls": True,
            "temperature": body.get("temperature", 1.0),
            "top_p": body.get("top_p", 1.0),
            "tool_choice": "auto",
            "tools": [],
            "previous_response_id": None,
            "reasoning": None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "metadata": body.get("metadata"),
            "user": None,
            "error": None,
            "usage": usage,
        }


def _text_part(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": None}


async def responses(replica: Replica, request: web.Request) -> web.StreamResponse:
    await inject_faults(replica)
    body = await json_body(request)
    model, lora = model_of(replica, body)
    try:
        params = _responses_params(model, body)
    except LaxValueError as exc:
        raise api.ApiError(400, str(exc), exc.field) from None
    # The replica's own context check and sequence builder: the same engine accounting
    # as a chat request.
    request_id = replica.check_context(params)
    handle = replica.driver.submit(replica.sequence(params, lora, request_id, 0))
    exchange = _Exchange(handle, body, model, int(time.time()))
    try:
        if params.stream:
            return await _stream_response(replica, request, exchange)
        while not handle.done:
            await handle.event.wait()
            handle.event.clear()
        return json_reply(replica, exchange.response(done=True))
    finally:
        replica.driver.release(handle)


def _responses_params(model: str, body: dict[str, Any]) -> api.GenerateRequest:
    messages: list[object] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise LaxValueError("instructions", "'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise LaxValueError("input", f"input[{i}] must be a message with a 'role'")
            messages.append({"role": item["role"], "content": _item_text(item.get("content"))})
    else:
        raise LaxValueError("input", "'input' must be a string or a non-empty list of items")
    max_tokens = None
    if body.get("max_output_tokens") is not None:
        max_tokens = as_int(body["max_output_tokens"], "max_output_tokens")
        if max_tokens < 1:
            raise LaxValueError("max_output_tokens", "'max_output_tokens' must be at least 1")
    stream = as_bool(body["stream"], "stream") if body.get("stream") is not None else False
    salt = body.get("cache_salt")
    try:
        prompt = render_chat(messages)
    except PromptError as exc:
        raise LaxValueError("input", str(exc)) from None
    return api.GenerateRequest(
        chat=True,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=False,
        stream=stream,
        include_usage=False,
        continuous_usage=False,
        cache_salt=salt if isinstance(salt, str) else "",
    )


def _item_text(content: object) -> str:
    """Text of a Responses message's ``content``: a string or ``input_text`` /
    ``output_text`` / ``text`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise LaxValueError("input", "content parts must be objects with a 'text'")
            if part.get("type") not in ("input_text", "output_text", "text"):
                kind = part.get("type")
                raise LaxValueError("input", f"content part type {kind!r} is not supported")
            parts.append(part["text"])
        return "".join(parts)
    raise LaxValueError("input", "message content must be a string or a list of parts")


async def _stream_response(
    replica: Replica, request: web.Request, exchange: _Exchange
) -> web.StreamResponse:
    headers = {
        **replica_headers(replica),
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
    }
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    number = 0

    def event(kind: str, **fields: object) -> bytes:
        nonlocal number
        payload = {"type": kind, "sequence_number": number, **fields}
        number += 1
        return f"event: {kind}\ndata: ".encode() + orjson.dumps(payload) + b"\n\n"

    async def send(*frames: bytes) -> bool:
        try:
            await response.write(b"".join(frames))
        except ConnectionResetError:
            return False  # aiohttp treats the unfinished response as a client disconnect
        return True

    handle = exchange.handle
    part = {"item_id": exchange.ids[1], "output_index": 0, "content_index": 0}
    empty: dict[str, object] = {
        "type": "output_text",
        "text": "",
        "annotations": [],
        "logprobs": None,
    }
    started = exchange.response(done=False)
    opening = (
        event("response.created", response=started),
        event("response.in_progress", response=started),
        event(
            "response.output_item.added", output_index=0, item=exchange.message("", "in_progress")
        ),
        event("response.content_part.added", **part, part=empty),
    )
    if not await send(*opening):
        return response
    sent = 0
    while not (handle.done and sent == handle.visible):
        if sent == handle.visible:
            await handle.event.wait()
            handle.event.clear()
            continue
        produced = handle.visible
        text = handle.seq.output_text
        deltas = [
            event("response.output_text.delta", **part, delta=text(i, i + 1), logprobs=[])
            for i in range(sent, produced)
        ]
        if not await send(*deltas):
            return response
        sent = produced
    whole = handle.seq.output_text()
    await send(
        event("response.output_text.done", **part, text=whole, logprobs=[]),
        event("response.content_part.done", **part, part=_text_part(whole)),
        event(
            "response.output_item.done", output_index=0, item=exchange.message(whole, "completed")
        ),
        event("response.completed", response=exchange.response(done=True)),
    )
    return response


__all__ = ["responses"]
