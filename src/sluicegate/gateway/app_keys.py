"""The standalone gateway's API keys (part of :mod:`sluicegate.gateway.app`): the paths
that need none, the 401 for a request without a valid one, how a bearer token is compared
with the keys, and :class:`_KeyCheck`, which holds the keys in force and checks requests."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluicegate.errors import GatewayError
from sluicegate.gateway.http import JSON_CONTENT_TYPE, Refusal
from sluicegate.requestcontrol.ids import request_id_from

if TYPE_CHECKING:
    from sluicegate.api.loader import Config
    from sluicegate.gateway.http import Request

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
_UNAUTHORIZED_HEAD = [
    JSON_CONTENT_TYPE,
    ("www-authenticate", "Bearer"),
    *_UNAUTHORIZED.headers().items(),
]
_UNAUTHORIZED_BODY = _UNAUTHORIZED.body()


@dataclass(frozen=True, slots=True)
class _Keys:
    """The API keys of one configuration, as bytes."""

    accepted: tuple[bytes, ...]
    """Every key a request may carry (``apiKeys``, ``--api-key``, ``trustedApiKeys``)."""
    trusted: tuple[bytes, ...]
    """The keys whose requests may use the routing-control headers."""


class _KeyCheck:
    """The API keys in force (the configuration's ``apiKeys`` and ``trustedApiKeys``, and
    ``extra``, the gateway options' keys), re-read when the configuration changes, and the
    checks of requests against them."""

    __slots__ = ("_extra", "_keys", "_keys_of")

    def __init__(self, extra: Sequence[str]) -> None:
        self._extra = tuple(extra)
        self._keys = _Keys((), ())
        self._keys_of: Config | None = None

    def keys(self, config: Config) -> _Keys:
        """The API keys of ``config`` (and of the options)."""
        if self._keys_of is not config:
            settings = config.gateway
            trusted = tuple(k.encode() for k in settings.trusted_api_keys)
            accepted = tuple(k.encode() for k in (*settings.api_keys, *self._extra))
            self._keys, self._keys_of = _Keys(accepted + trusted, trusted), config
        return self._keys

    def refusal(self, request: Request, config: Config) -> Refusal | None:
        """The 401 for ``request``'s head without a valid key where one is needed, or
        None to go on."""
        path = request.path
        if path in _OPEN_PATHS or (path == "/metrics" and not config.gateway.metrics_auth):
            return None
        accepted = self.keys(config).accepted
        if not accepted or _one_of(_bearer_token(request.headers), accepted):
            return None
        request_id = request_id_from(request.headers.get("x-request-id"))
        headers = [*_UNAUTHORIZED_HEAD, ("x-request-id", request_id)]
        return Refusal(401, headers, _UNAUTHORIZED_BODY)

    def trusted(self, headers: Mapping[str, str], config: Config) -> bool:
        """Whether a request with ``headers`` may use the routing-control headers."""
        if config.gateway.trust_control_headers:
            return True
        trusted = self.keys(config).trusted
        return bool(trusted) and _one_of(_bearer_token(headers), trusted)


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
