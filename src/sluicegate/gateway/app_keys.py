"""The standalone gateway's API keys (part of :mod:`sluicegate.gateway.app`): the paths
that need none, the 401 for a request without a valid one, and how a bearer token is
compared with the keys."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from sluicegate.errors import GatewayError
from sluicegate.gateway.app_answers import _JSON

_OPEN_PATHS = frozenset({"/health", "/ready"})
"""Paths answered without an API key (probes)."""
_UNAUTHORIZED = GatewayError(
    401,
    "a valid API key is required (Authorization: Bearer ...)",
    code="invalid_api_key",
    reason="unauthorized",
)
# A 401 names the scheme it wants: RFC 9110, section 15.5.2
# (https://www.rfc-editor.org/rfc/rfc9110#section-15.5.2).
_UNAUTHORIZED_HEAD = [_JSON, ("www-authenticate", "Bearer"), *_UNAUTHORIZED.headers().items()]
_UNAUTHORIZED_BODY = _UNAUTHORIZED.body()


@dataclass(frozen=True, slots=True)
class _Keys:
    """The API keys of one configuration, as bytes."""

    accepted: tuple[bytes, ...]
    """Every key a request may carry (``apiKeys``, ``--api-key``, ``trustedApiKeys``)."""
    trusted: tuple[bytes, ...]
    """The keys whose requests may use the routing-control headers."""


def _bearer_token(headers: Mapping[str, str]) -> bytes:
    """The ``Authorization: Bearer`` token as the client sent its bytes (b"" if none).
    Header values arrive decoded with surrogate escapes: encoding them the same way gives
    back the exact bytes, whatever they are."""
    header = headers.get("authorization")
    if header is None or header[:7].lower() != "bearer ":
        return b""
    return header[7:].strip().encode("utf-8", "surrogateescape")


def _one_of(token: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether ``token`` is one of ``keys`` (compared in constant time; never an empty
    token, whatever the keys)."""
    return bool(token) and any(hmac.compare_digest(token, key) for key in keys)


__all__: list[str] = []
