"""How the simulator answers a completion or chat request once the engine runs its
sequences: the whole body when every choice has finished, or an event stream of one chunk
per token, as vLLM writes them (shapes in :mod:`sluicegate.sim.api`).

Both honour the replica's ``reset_after_tokens`` fault (the connection is cut once that
many tokens were generated); a client that goes away ends the stream quietly.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sluicegate.sim import api
from sluicegate.sim.driver import Handle
from sluicegate.sim.reply import replica_headers
from sluicegate.sim.text import StopHit, output_bytes, output_text_token
from sluicegate.tokens import BYTES_PER_TOKEN

if TYPE_CHECKING:
    from sluicegate.sim.server import Replica


@dataclass(slots=True, eq=False)
class Choice:
    """One choice of a request: its sequence in the engine and what its answer keeps.

    Text positions are in bytes of generated text, which is ASCII, so they are characters
    too.
    """

    request_id: str
    """The request's id, which the choices share (each sequence has its own)."""
    index: int
    handle: Handle
    stop: StopHit | None
    sent: int = 0
    """Tokens streamed so far."""
    sent_bytes: int = 0
    """Bytes of text streamed so far."""

    @property
    def stop_reason(self) -> str | int | None:
        """The stop string or token id that ended the answer; None for any other end."""
        return self.stop.reason if self.stop is not None else None

    def keep(self, tokens: int) -> int:
        """Bytes of the first ``tokens`` tokens' text that the answer keeps."""
        end = tokens * BYTES_PER_TOKEN
        return min(end, self.stop.text_bytes) if self.stop is not None else end

    def text(self, start: int, end: int) -> str:
        """Generated text from byte ``start`` to ``end``."""
        if end <= start:
            return ""
        first, last = start // BYTES_PER_TOKEN, -(-end // BYTES_PER_TOKEN)
        chunk = output_bytes(self.handle.seq.output_seed, first, last)
        offset = first * BYTES_PER_TOKEN
        return chunk[start - offset : end - offset].decode()


def cut_connection(request: web.Request) -> web.StreamResponse:
    """Drop the client's connection (a fault); returns a response that is never sent.

    Returning (rather than raising) lets aiohttp treat the dead connection as a client
    disconnect: no traceback is logged and the handler task ends normally.
    """
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)


async def respond_whole(
    replica: Replica,
    request: web.Request,
    choices: list[Choice],
    event: asyncio.Event,
    params: api.GenerateRequest,
) -> web.StreamResponse:
    reset_after = replica.faults.reset_after_tokens
    while not all(c.handle.done for c in choices):
        await event.wait()
        event.clear()
        if reset_after is not None and sum(c.handle.visible for c in choices) >= reset_after:
            return cut_connection(request)
    bodies = []
    for c in choices:
        seq = c.handle.seq
        logprobs = None
        if params.logprobs is not None:
            logprobs = (
                api.chat_logprobs(seq.output_seed, 0, seq.num_output, params.logprobs)
                if params.chat
                else api.completion_logprobs(seq.output_seed, 0, seq.num_output, params.logprobs, 0)
            )
        bodies.append(
            api.choice(
                params.chat,
                c.index,
                c.text(0, c.keep(seq.num_output)),
                seq.finish_reason,
                c.stop_reason,
                logprobs,
                stream=False,
            )
        )
    body = api.completion_body(
        choices[0].request_id,
        int(time.time()),
        params.model,
        params.chat,
        bodies,
        usage(choices),
    )
    return web.Response(
        body=body, content_type="application/json", headers=replica_headers(replica)
    )


def usage(choices: list[Choice], partial: Choice | None = None) -> dict[str, Any]:
    """``usage``: the prompt once, every choice's tokens (or ``partial``'s streamed ones)."""
    first = choices[0].handle.seq
    generated = partial.sent if partial else sum(c.handle.seq.num_output for c in choices)
    return api.usage(first.prompt_tokens, generated, first.num_cached_prompt_tokens)


async def stream(
    replica: Replica,
    request: web.Request,
    choices: list[Choice],
    event: asyncio.Event,
    params: api.GenerateRequest,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            **replica_headers(replica),
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
        }
    )
    await response.prepare(request)

    async def send(data: bytes) -> bool:
        """Write ``data``; False if the client has gone away."""
        try:
            await response.write(data)
        except ConnectionResetError:
            return False
        return True

    # On a lost client every path below returns ``response``: aiohttp then fails to
    # finish it, which it treats as a premature disconnect (quietly), and the replica's
    # handler aborts the request in the engine.
    created = int(time.time())
    request_id = choices[0].request_id
    model, chat = params.model, params.chat
    hold_back = params.hold_back
    top = params.logprobs
    reset_after = replica.faults.reset_after_tokens
    budget = reset_after if reset_after is not None else -1  # tokens left before the cut
    role_sent = False
    single = choices[0] if len(choices) == 1 else None
    while True:
        if budget == 0:
            cut_connection(request)
            return response
        # Runs once per step per stream: the common single choice skips the scans.
        if single is not None:
            ready = choices if single.sent < single.handle.visible else []
        else:
            ready = [c for c in choices if c.sent < c.handle.visible]
        if not ready:
            if single.handle.done if single else all(c.handle.done for c in choices):
                break
            await event.wait()
            event.clear()
            continue
        frames: list[bytes] = []
        if chat and not role_sent:
            # As vLLM does, the role arrives with the first token, not before it, one
            # chunk per choice.
            role_sent = True
            first = choices[0].handle.seq
            role_usage = api.usage(first.prompt_tokens, 0, 0) if params.continuous_usage else None
            for c in choices:
                role = api.choice(chat, c.index, "", None, None, None, stream=True, role=True)
                frames.append(
                    api.stream_chunk(request_id, created, model, chat, [role], role_usage)
                )
        for c in ready:
            handle, seq = c.handle, c.handle.seq
            produced = handle.visible
            if budget >= 0:
                produced = min(produced, c.sent + budget)
                budget -= produced - c.sent
            # Without a stop string to cut or hold back, each token's text is one piece.
            plain = c.stop is None and hold_back == 0
            seed = seq.output_seed
            for i in range(c.sent, produced):
                final = handle.done and i == handle.visible - 1
                if plain:
                    text = output_text_token(seed, i)
                    end = (i + 1) * BYTES_PER_TOKEN
                else:
                    end = c.keep(i + 1)
                    if not final:
                        end = min(end, (i + 1) * BYTES_PER_TOKEN - hold_back)
                    end = max(end, c.sent_bytes)
                    text = c.text(c.sent_bytes, end)
                logprobs = None
                if top is not None:
                    logprobs = (
                        api.chat_logprobs(seed, i, i + 1, top)
                        if chat
                        else api.completion_logprobs(seed, i, i + 1, top, c.sent_bytes)
                    )
                delta = api.choice(
                    chat,
                    c.index,
                    text,
                    seq.finish_reason if final else None,
                    c.stop_reason if final else None,
                    logprobs,
                    stream=True,
                )
                c.sent_bytes = end
                c.sent = i + 1
                usage_block = usage(choices, c) if params.continuous_usage else None
                frames.append(
                    api.stream_chunk(request_id, created, model, chat, [delta], usage_block)
                )
        if not await send(b"".join(frames)):
            return response
    if params.include_usage and not await send(
        api.stream_chunk(request_id, created, model, chat, [], usage(choices))
    ):
        return response
    await send(api.STREAM_DONE)
    return response  # aiohttp writes the end of the chunked body


__all__ = ["Choice", "cut_connection", "respond_whole", "stream", "usage"]
