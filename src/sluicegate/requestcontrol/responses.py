"""What a model server's answer tells about the request it served.

Shared by every host that sees the response bytes — the standalone gateway's proxy
(:mod:`sluicegate.gateway.proxy`) and the Envoy endpoint picker's response phase
(:mod:`sluicegate.extproc.response`) — so usage, token-event counts and the model-name
rewrite back behave the same whichever way sluicegate runs:

- :class:`ResponseStats` reads the ``usage`` block (prompt, completion and cached prompt
  tokens) of a JSON answer or of a streamed (SSE) answer's events, and counts the streamed
  token events, which stand in for the completion tokens when the server reports no usage;
- :class:`ModelNameRewriter` puts the client's model name back where the server wrote the
  target model's (the request was rewritten to a target model);
- :class:`EventRewriter` applies it to a stream, one complete SSE event at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from sluicegate.requestcontrol.jsonbytes import replace_top_level_string

MAX_EVENT_BYTES = 1024 * 1024
"""Longest incomplete SSE event (bytes) held across chunks: a longer one is dropped from
the usage scan and passed on without waiting for its end (its bytes still reach the
client)."""


@dataclass(slots=True)
class Usage:
    """What the server reported about a finished response (token counts)."""

    output_tokens: int = 0
    """Completion tokens (or streamed chunks when the server reported no usage)."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    response_bytes: int | None = None
    """Bytes of the response body as the model server sent it (None: not counted)."""


@dataclass(slots=True)
class ResponseStats:
    """Token counts read from one response, as the server reports them."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    chunks: int = 0
    """Streamed token events seen (events with a choice, less the chat role event; for
    the Responses API its ``response.output_text.delta`` events)."""
    response_bytes: int = 0
    """Body bytes read from the model server so far (before any model-name rewrite)."""
    _tail: bytes = field(default=b"", repr=False)
    """The incomplete last SSE event of the stream so far."""

    def usage(self) -> Usage:
        """Token counts for the runtime (streamed chunks stand in for unreported usage)."""
        return Usage(
            self.completion_tokens or self.chunks,
            self.prompt_tokens,
            self.cached_tokens,
            self.response_bytes,
        )

    def observe_stream_chunk(self, chunk: bytes) -> None:
        """Count the token events of the complete SSE events so far and read any usage;
        an event split across chunks is read once it is complete."""
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n\n") + 2
        if cut < 2:
            self._tail = data if len(data) <= MAX_EVENT_BYTES else b""
            return
        self._tail = data[cut:] if len(data) - cut <= MAX_EVENT_BYTES else b""
        self._observe_events(data[:cut] if cut < len(data) else data)

    def end_stream(self) -> None:
        """The stream ended: read its last event even without the closing blank line."""
        if self._tail:
            tail, self._tail = self._tail, b""
            self._observe_events(tail)

    def observe_json(self, payload: Any) -> None:
        """Read the ``usage`` block of a whole (non-streamed) JSON answer."""
        if isinstance(payload, dict):
            self._read_usage(_usage_of(payload))

    def _observe_events(self, events: bytes) -> None:
        # vLLM writes compact JSON, so these byte patterns find the events with a choice.
        chunks = events.count(b'"choices":[{') - events.count(b'"delta":{"role"')
        if not chunks:  # not chat or completions: Responses API text deltas, if any
            chunks = events.count(b'"type":"response.output_text.delta"')
        self.chunks += chunks
        if b'"usage"' not in events:
            return
        for event in events.split(b"\n\n"):
            start = event.find(b"{")
            if start < 0 or b'"usage"' not in event:
                continue
            payload = json_or_none(event[start:])
            if isinstance(payload, dict):
                self._read_usage(_usage_of(payload))

    def _read_usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        # Chat and completions name them prompt/completion tokens; the Responses API
        # input/output tokens (https://platform.openai.com/docs/api-reference/responses).
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if _count(prompt):
            self.prompt_tokens = prompt
        if _count(completion):
            self.completion_tokens = completion
        details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
        if isinstance(details, dict) and _count(cached := details.get("cached_tokens")):
            self.cached_tokens = cached


def _count(value: object) -> TypeGuard[int]:
    """Whether a usage field is a token count: an int ≥ 0 (JSON ``true`` is not one)."""
    return type(value) is int and value >= 0


def _usage_of(payload: dict[str, Any]) -> object:
    """The ``usage`` block of an answer or stream event: top level (completions, chat,
    embeddings, a whole Responses answer), or in the ``response`` of a Responses stream's
    ``response.completed`` event."""
    usage = payload.get("usage")
    if usage is None:
        response = payload.get("response")
        if isinstance(response, dict):
            return response.get("usage")
    return usage


class ModelNameRewriter:
    """Puts the client's model name back where the server wrote the target's."""

    __slots__ = ("_pattern", "_replacement")

    def __init__(self, target: str, public: str) -> None:
        self._pattern = re.compile(rb'("model"\s*:\s*)' + re.escape(orjson.dumps(target)))
        self._replacement = rb"\g<1>" + orjson.dumps(public).replace(b"\\", b"\\\\")

    def __call__(self, data: bytes) -> bytes:
        return self._pattern.sub(self._replacement, data)


class EventRewriter:
    """Applies a :class:`ModelNameRewriter` to a stream one complete SSE event at a time:
    the incomplete tail of a chunk is held back until the rest of its event arrives."""

    __slots__ = ("_pending", "_rewrite")

    def __init__(self, rewrite: ModelNameRewriter) -> None:
        self._rewrite = rewrite
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The rewritten complete events of ``chunk`` (and of what was held back). An
        incomplete event longer than :data:`MAX_EVENT_BYTES` is not held any longer: it
        goes on, rewritten as far as it is (memory stays bounded)."""
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(b"\n\n") + 2
        if cut < 2:
            if len(data) > MAX_EVENT_BYTES:
                self._pending = b""
                return self._rewrite(data)
            self._pending = data
            return b""
        self._pending = data[cut:]
        return self._rewrite(data[:cut])

    def flush(self) -> bytes:
        """What is still held back, rewritten (the stream ended)."""
        pending, self._pending = self._pending, b""
        return self._rewrite(pending) if pending else b""

    def discard(self) -> None:
        """Forget what is held back (an error event replaces it)."""
        self._pending = b""


def restore_model_name(payload: Any, data: bytes, target: str, public: str) -> bytes | None:
    """The JSON answer ``data`` (decoded: ``payload``) with its top-level ``model`` set back
    to ``public``, or None when its ``model`` is not ``target`` (nothing to restore). Only
    the bytes of the ``model`` value change: big integers, deep nesting and the server's
    formatting pass as they are."""
    if not isinstance(payload, dict) or payload.get("model") != target:
        return None
    return replace_top_level_string(data, "model", public)


def json_or_none(data: bytes) -> Any:
    """``data`` decoded as JSON, or None when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


__all__ = [
    "EventRewriter",
    "ModelNameRewriter",
    "ResponseStats",
    "Usage",
    "json_or_none",
    "restore_model_name",
]
