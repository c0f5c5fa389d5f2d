"""Which paths the hosts route to the model servers: the rules both the standalone gateway
and the Envoy endpoint picker apply, so the two route the same paths alike.

The two generation routes (:data:`GENERATION_ROUTES`) are parsed as vLLM checks them.
Besides them and the routes a host answers itself (the model list), the hosts send on the
inference routes of the servers they front — embeddings, the Responses API, tokenize,
pooling, scoring, audio — through the same scheduling, flow control and metrics as
completions. They do *not* send on a server's administrative routes: vLLM serves, next
to its API, routes that change the server (``/v1/load_lora_adapter``,
``/reset_prefix_cache``, ``/sleep``, ``/pause``, ``/update_weights``, ``/collective_rpc``,
...; see ``vllm/entrypoints/serve/`` in https://github.com/vllm-project/vllm), and their
number grows with every release.

So the rule is an allow-list of namespaces with a deny-list inside them, not a deny-list
of everything: a route vLLM adds tomorrow outside the API namespaces stays unreachable
until it is listed here.

- passed through: every path under ``/v1/`` and ``/v2/`` (the OpenAI-compatible API and
  the v2 rerank API), and the top-level inference routes of :data:`TOP_LEVEL_ROUTES`;
- refused (404): the LoRA load/unload routes and any ``admin`` segment under those
  namespaces, every other top-level path (``/reset_prefix_cache``, ``/sleep``,
  ``/metrics/``, ``/admin/...``), and any path not in canonical form (any character
  but letters, digits, ``-._~/`` — so no percent escapes, fragments, parameters or
  backslashes —, ``//``, ``.`` or ``..`` segments) — servers decode and normalise paths
  before routing, so a disguised spelling of a refused route must not get through.

The judgement is on the path alone, lower-cased (servers route case-sensitively, so this
refuses at least what they would serve).
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.errors import GatewayError
from sluicegate.requestcontrol.parse import RequestKind

GENERATION_ROUTES: Mapping[str, RequestKind] = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
}
"""The paths parsed as completions and chat; every other passed path is ``other``."""

PASSED_PREFIXES = ("/v1/", "/v2/")
"""The API namespaces passed through (minus :data:`DENIED_ROUTES`)."""
TOP_LEVEL_ROUTES = frozenset(
    {"/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/invocations"}
)
"""vLLM's inference routes outside ``/v1/``."""
DENIED_ROUTES = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
"""Routes inside the passed namespaces that change a server."""
_NON_GENERATIVE_SUFFIXES = (
    "/embeddings",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
)


def check_passed(method: str, path: str) -> None:
    """Raise a 404 GatewayError unless ``path`` may be passed through (see the module
    docstring)."""
    lowered = path.lower()
    if not _canonical(lowered):
        raise GatewayError(
            404,
            f"{method} {path} is not a route: a passed path holds only letters, digits and "
            "'-._~/' (no percent escapes, fragments or parameters) and no empty, '.' or '..' "
            "segments",
            code="not_found",
        )
    bare = lowered.rstrip("/")
    if bare in DENIED_ROUTES or "/admin/" in lowered or bare.endswith("/admin"):
        raise GatewayError(
            404,
            f"{method} {path} is an administrative route of the model servers: it is not "
            "passed through",
            code="not_found",
        )
    if lowered.startswith(PASSED_PREFIXES) or lowered in TOP_LEVEL_ROUTES:
        return
    raise GatewayError(404, f"{method} {path} is not a route", code="not_found")


def generates(path: str) -> bool:
    """Whether a passed-through route generates tokens (False for embeddings, tokenize,
    pooling and scoring routes: their expected output is nil)."""
    return not path.rstrip("/").endswith(_NON_GENERATIVE_SUFFIXES)


_PATH_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._~/")
"""What a passed path (lower-cased) may hold: RFC 3986's unreserved characters and ``/``.
Anything else — ``%`` escapes, ``#`` fragments, ``;`` parameters, ``:``, ``\\``, spaces —
may be decoded, dropped or split differently by the server than here, so a refused route
could hide behind it (``/v1/load_lora_adapter#x`` is that route to aiohttp and uvicorn)."""


def _canonical(path: str) -> bool:
    if not path.startswith("/") or "//" in path or not _PATH_CHARACTERS.issuperset(path):
        return False
    return not any(segment in (".", "..") for segment in path.split("/"))


__all__ = [
    "DENIED_ROUTES",
    "GENERATION_ROUTES",
    "PASSED_PREFIXES",
    "TOP_LEVEL_ROUTES",
    "check_passed",
    "generates",
]
