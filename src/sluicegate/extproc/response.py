"""The response side of one request through Envoy: what the body says, and the model name
put back.

A :class:`ResponseRelay` sees the model server's response body chunk by chunk as Envoy
sends it and returns what Envoy should pass on:

- a streamed (SSE) answer goes on as it arrives; its token events and ``usage`` block are
  counted (:class:`~sluicegate.requestcontrol.responses.ResponseStats`) and, when the
  request was rewritten to a target model, the target's name is replaced by the client's
  one complete event at a time (an incomplete tail waits for the rest of its event);
- a whole JSON answer is copied (up to ``buffer_limit`` bytes) to read its ``usage`` at the
  end. It goes on as it arrives, unless the model name must be restored: then it is held
  until it ends and re-encoded. Past ``buffer_limit`` the copy is dropped (usage unknown)
  and the name is restored chunk by chunk by pattern, so memory stays bounded.
"""

from __future__ import annotations

from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.responses import (
    EventRewriter,
    ModelNameRewriter,
    ResponseStats,
    json_or_none,
    restore_model_name,
)

DEFAULT_BUFFER_LIMIT = 16 * 1024 * 1024
"""Bytes of a non-streamed answer kept to read its usage (and restore its model name)."""


_STREAM, _WHOLE, _PASS = 0, 1, 2


class ResponseRelay:
    """Reads (and, if needed, rewrites) one response body; see the module docstring."""

    __slots__ = ("_buffer", "_events", "_limit", "_mode", "_pattern", "_public", "_target", "stats")

    def __init__(
        self, dispatch: Dispatch, streaming: bool, buffer_limit: int = DEFAULT_BUFFER_LIMIT
    ) -> None:
        self.stats = ResponseStats()
        request = dispatch.request
        self._target, self._public = request.target_model, request.model
        self._pattern = (
            ModelNameRewriter(self._target, self._public) if dispatch.rewrites_model else None
        )
        self._events = EventRewriter(self._pattern) if streaming and self._pattern else None
        self._mode = _STREAM if streaming else _WHOLE
        self._buffer = bytearray()
        self._limit = buffer_limit

    @property
    def holds_body(self) -> bool:
        """True when a whole answer is held back until it ends (its model name must be
        restored)."""
        return self._mode == _WHOLE and self._pattern is not None

    def feed(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """The bytes to pass on for ``chunk`` (``chunk`` itself when unchanged; empty
        while the body is held back)."""
        self.stats.response_bytes += len(chunk)
        if self._mode == _STREAM:
            return self._feed_stream(chunk, end_of_stream)
        if self._mode == _WHOLE:
            return self._feed_whole(chunk, end_of_stream)
        return self._pattern(chunk) if self._pattern is not None and chunk else chunk

    def abort(self) -> bytes:
        """Stop reading (after a fault) and pass everything on unchanged from now on;
        returns what was held back (an incomplete SSE event with the model name restored,
        or the part of a whole answer read so far)."""
        held = bytes(self._buffer) if self.holds_body else b""
        if self._events is not None:
            held += self._events.flush()
        self._mode, self._pattern, self._events, self._buffer = _PASS, None, None, bytearray()
        return held

    def _feed_stream(self, chunk: bytes, end_of_stream: bool) -> bytes:
        self.stats.observe_stream_chunk(chunk)
        out = self._events.feed(chunk) if self._events is not None else chunk
        if end_of_stream:
            self.stats.end_stream()
            if self._events is not None:
                out += self._events.flush()
        return out

    def _feed_whole(self, chunk: bytes, end_of_stream: bool) -> bytes:
        buffer = self._buffer
        buffer += chunk
        if len(buffer) > self._limit:
            # Too large to keep: give up on usage; restore the name by pattern from here.
            held = bytes(buffer) if self.holds_body else chunk
            self._mode, self._buffer = _PASS, bytearray()
            return self._pattern(held) if self._pattern is not None else held
        if not end_of_stream:
            return b"" if self.holds_body else chunk
        data = bytes(buffer)
        self._mode, self._buffer = _PASS, bytearray()
        payload = json_or_none(data)
        self.stats.observe_json(payload)
        if self._pattern is None:
            return chunk
        return restore_model_name(payload, data, self._target, self._public) or data
