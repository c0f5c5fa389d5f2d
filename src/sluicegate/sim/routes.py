"""The simulator's routes beyond completions and chat: embeddings, the Responses API,
tokenize and detokenize and the model list, in the shapes vLLM serves them.

- ``POST /v1/embeddings``: one deterministic unit vector per input (a string, a list of
  strings, token ids or lists of token ids) derived from its bytes, as floats or — the
  OpenAI SDK's default, ``encoding_format: "base64"`` — as the base64 of little-endian
  float32s. Answered at once (the simulated engine models generation only).
- ``POST /v1/responses``: the Responses API, through the engine
  (:mod:`sluicegate.sim.responses_api`).
- ``POST /tokenize``: a ``prompt`` or chat ``messages`` → ``{"count", "max_model_len",
  "tokens", "token_strs"}``; a token is four bytes of the prompt (the last one padded with
  NUL bytes), as the engine counts them;
- ``POST /detokenize``: ``{"tokens": [...]}`` → ``{"prompt": text}``, the inverse of
  ``/tokenize``.
- ``GET /v1/models``: vLLM's model cards (``owned_by: "vllm"``, ``root``, ``parent``,
  ``max_model_len``, ``permission``); a LoRA adapter has ``parent`` = the base model and
  ``root`` = its path.

Shapes as in vLLM's ``vllm/entrypoints/openai/protocol.py`` and the OpenAI API reference
(https://platform.openai.com/docs/api-reference/responses-streaming).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from typing import TYPE_CHECKING

from aiohttp import web

from sluicegate.lax import LaxValueError, as_int
from sluicegate.sim import api
from sluicegate.sim.reply import bind, inject_faults, json_body, json_reply, model_of
from sluicegate.sim.responses_api import responses
from sluicegate.sim.text import PromptError, render_chat, render_prompt
from sluicegate.tokens import BYTES_PER_TOKEN, count_bytes_tokens

if TYPE_CHECKING:
    from sluicegate.sim.server import Replica

EMBEDDING_DIMENSIONS = 256
"""Length of an embedding unless the request's ``dimensions`` asks for fewer or more."""
MAX_EMBEDDING_DIMENSIONS = 8192


def register(app: web.Application, replica: Replica) -> None:
    """Add this module's routes for ``replica`` to ``app``."""
    app.router.add_get("/v1/models", bind(models, replica))
    app.router.add_post("/v1/embeddings", bind(embeddings, replica))
    app.router.add_post("/v1/responses", bind(responses, replica))
    app.router.add_post("/tokenize", bind(tokenize, replica))
    app.router.add_post("/detokenize", bind(detokenize, replica))


# --------------------------------------------------------------------------- models


async def models(replica: Replica, request: web.Request) -> web.Response:
    created = int(time.time())
    max_len = replica.options.profile.max_model_len
    cards = [_card(replica.model_name, replica.model_name, None, created, max_len)]
    for name, path in sorted(replica.loras.items()):
        cards.append(_card(name, path, replica.model_name, created, max_len))
    return json_reply(replica, {"object": "list", "data": cards})


def _card(
    model_id: str, root: str, parent: str | None, created: int, max_len: int
) -> dict[str, object]:
    permission = {
        "id": f"modelperm-{hashlib.blake2b(model_id.encode(), digest_size=8).hexdigest()}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_len,
        "permission": [permission],
    }


# --------------------------------------------------------------------------- embeddings


async def embeddings(replica: Replica, request: web.Request) -> web.Response:
    await inject_faults(replica)
    body = await json_body(request)
    model, _ = model_of(replica, body)
    inputs = _embedding_inputs(body.get("input"))
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise api.ApiError(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = EMBEDDING_DIMENSIONS
    if body.get("dimensions") is not None:
        try:
            dimensions = as_int(body["dimensions"], "dimensions")
        except LaxValueError as exc:
            raise api.ApiError(400, str(exc), "dimensions") from None
        if not 1 <= dimensions <= MAX_EMBEDDING_DIMENSIONS:
            raise api.ApiError(
                400, f"'dimensions' must be 1 to {MAX_EMBEDDING_DIMENSIONS}", "dimensions"
            )
    data = []
    tokens = 0
    for index, item in enumerate(inputs):
        tokens += count_bytes_tokens(item)
        vector = embedding_vector(item, dimensions)
        encoded: object = (
            base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
            if encoding == "base64"
            else vector
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return json_reply(
        replica,
        {
            "id": f"embd-{replica.index}-{time.monotonic_ns()}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        },
    )


def _embedding_inputs(value: object) -> list[bytes]:
    """The inputs' bytes: a string, a list of strings, token ids, or lists of token ids."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            value = [value]
        try:
            items = [render_prompt(v) for v in value]
        except PromptError:
            items = []
        if items and all(items):
            return items
    raise api.ApiError(
        400,
        "'input' must be a non-empty string, a list of strings, token ids, or lists of ids",
        "input",
    )


def embedding_vector(text: bytes, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text``: the same bytes always give the same
    vector, different ones (almost surely) different vectors."""
    raw = bytearray()
    counter = 0
    while len(raw) < 4 * dimensions:
        raw += hashlib.blake2b(text, digest_size=64, salt=counter.to_bytes(16, "little")).digest()
        counter += 1
    values = [(v / 0x7FFFFFFF) for v in struct.unpack(f"<{dimensions}i", raw[: 4 * dimensions])]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    # Rounded through float32, as a server's vectors are: float and base64 agree exactly.
    packed = struct.pack(f"<{dimensions}f", *(v / norm for v in values))
    return list(struct.unpack(f"<{dimensions}f", packed))


# --------------------------------------------------------------------------- tokenize


async def tokenize(replica: Replica, request: web.Request) -> web.Response:
    body = await json_body(request)
    try:
        if "messages" in body:
            prompt = render_chat(body["messages"])
        elif "prompt" in body:
            prompt = render_prompt(body["prompt"])
        else:
            raise api.ApiError(400, "'prompt' or 'messages' is required")
    except PromptError as exc:
        raise api.ApiError(400, str(exc)) from None
    model_tokens = replica.driver.engine.prompt_tokens
    if model_tokens is not None:  # the profile's tokenizer: the ids the engine counts
        prompt = model_tokens.encode(body, "messages" in body) or prompt
    padded = prompt + b"\0" * (-len(prompt) % 4)
    tokens = [int.from_bytes(padded[i : i + 4], "little") for i in range(0, len(padded), 4)]
    return json_reply(
        replica,
        {
            "count": len(tokens),
            "max_model_len": replica.options.profile.max_model_len,
            "tokens": tokens,
            "token_strs": None,  # vLLM's, unless ``return_token_strs``
        },
    )


async def detokenize(replica: Replica, request: web.Request) -> web.Response:
    body = await json_body(request)
    if "model" in body:
        model_of(replica, body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in tokens
    ):
        raise api.ApiError(400, "'tokens' must be a list of token ids", "tokens")
    raw = b"".join(t.to_bytes(BYTES_PER_TOKEN, "little") for t in tokens)
    # /tokenize pads the prompt to whole tokens with NUL bytes: they are not text.
    return json_reply(replica, {"prompt": raw.rstrip(b"\0").decode("utf-8", "replace")})


__all__ = ["EMBEDDING_DIMENSIONS", "embedding_vector", "register"]
