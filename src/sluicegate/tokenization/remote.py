"""``source: server``: the pool's own servers tokenize, through vLLM's ``POST /tokenize``.

The request shape is vLLM's (``vllm/entrypoints/serve/tokenize/protocol.py`` at tag
v0.32.0): ``{"model", "prompt", "add_special_tokens"}`` for a completion (special tokens
added by default, as a completion gets them) and ``{"model", "messages",
"add_generation_prompt", "add_special_tokens", "continue_final_message", "tools",
"chat_template_kwargs"}`` for a chat (the server's own template; no special tokens by
default); the answer's ``tokens`` are the ids. The request's own values of those fields
are passed on, so the ids are the ones its completion will get. A completion prompt of
token ids needs no call. A chat whose messages hold anything but text (images, audio …)
is routed approximately (``unsupported``) without a call, as ``local`` does: the server
would fetch the parts again.

Not to be abused: calls go only to the candidates of the request's pool (the servers
that would serve it, never an address from the request), round robin; at most
``maxConcurrency`` are in flight per pool — a request finding none free is routed
approximately at once rather than queueing behind other requests' calls — and each is
bounded by ``timeout`` (50 ms). A timeout, a failed call or an answer without ids
routes that request approximately, counted by reason. ``/tokenize`` is outside vLLM's
``/v1`` API-key check, so no credential is sent.
"""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections.abc import Sequence

import aiohttp

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import LLMRequest
from sluicegate.model_tokenizer.chat import UnrenderableError, content_texts
from sluicegate.tokenization.base import PoolTokenizer, prompt_token_ids

log = logging.getLogger(__name__)

_CHAT_FIELDS = (
    "add_generation_prompt",
    "add_special_tokens",
    "continue_final_message",
    "tools",
    "chat_template_kwargs",
)


class ServerTokenizer(PoolTokenizer):
    """Token ids from the pool's servers (see the module docstring)."""

    source = "server"
    needs_io = True

    def __init__(self, settings: TokenizerSettings) -> None:
        super().__init__(settings)
        self.in_flight = 0
        self._turn = itertools.count()
        self._session: aiohttp.ClientSession | None = None

    def token_ids(self, request: LLMRequest, max_tokens: int = 0) -> array[int] | None:
        """Without a call only a prompt of token ids has ids (see :meth:`fetch`)."""
        return prompt_token_ids(request)

    async def fetch(
        self, request: LLMRequest, endpoints: Sequence[Endpoint], max_tokens: int = 0
    ) -> array[int] | None:
        """The server tokenizes the whole prompt (``max_tokens`` is not passed on)."""
        given = prompt_token_ids(request)
        if given is not None:
            self.counters.tokenized += 1
            return given
        if request.kind == "chat" and not _text_only(request):
            # the server would fetch the image_url parts again, for ids the gateway
            # does not key by (its token ids of images are placeholders)
            self.counters.fallback("unsupported")
            return None
        body = _tokenize_body(request)
        if body is None:
            self.counters.fallback("kind")
            return None
        if not endpoints:
            self.counters.fallback("error")
            return None
        if self.in_flight >= self.settings.max_concurrency:
            self.counters.fallback("busy")
            return None
        endpoint = endpoints[next(self._turn) % len(endpoints)]
        self.in_flight += 1
        started = time.perf_counter()
        try:
            ids = await self._call(endpoint, body)
        finally:
            self.in_flight -= 1
            self.counters.seconds += time.perf_counter() - started
        if ids is not None:
            self.counters.tokenized += 1
        return ids

    async def _call(self, endpoint: Endpoint, body: dict[str, object]) -> array[int] | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout)
            )
        try:
            async with self._session.post(f"{endpoint.url}/tokenize", json=body) as response:
                if response.status != 200:
                    self.counters.fallback("error")
                    return None
                answer = await response.json(content_type=None)
        except TimeoutError:
            self.counters.fallback("timeout")
            return None
        except (aiohttp.ClientError, ValueError) as exc:
            log.debug("tokenize on %s failed: %s", endpoint.name, exc)
            self.counters.fallback("error")
            return None
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            self.counters.fallback("error")
            return None
        try:
            return array("I", tokens)
        except (TypeError, OverflowError):
            self.counters.fallback("error")
            return None

    async def close(self) -> None:
        """Close the HTTP session (at shutdown, on the event loop)."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _text_only(request: LLMRequest) -> bool:
    """Whether every message's content is text (as the local renderer requires:
    :func:`~sluicegate.model_tokenizer.chat.content_texts`)."""
    messages = request.body.get("messages") if request.body is not None else None
    if not isinstance(messages, list):
        return True  # the server answers what it makes of it
    try:
        for message in messages:
            if isinstance(message, dict):
                content_texts(message.get("content"))
    except UnrenderableError:
        return False
    return True


def _tokenize_body(request: LLMRequest) -> dict[str, object] | None:
    body = request.body
    if body is None:
        return None
    if request.kind == "chat":
        out: dict[str, object] = {"model": request.target_model, "messages": body.get("messages")}
        for name in _CHAT_FIELDS:
            if body.get(name) is not None:
                out[name] = body[name]
        return out
    if request.kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None
        out = {"model": request.target_model, "prompt": prompt}
        if body.get("add_special_tokens") is not None:
            out["add_special_tokens"] = body["add_special_tokens"]
        return out
    return None


__all__ = ["ServerTokenizer"]
