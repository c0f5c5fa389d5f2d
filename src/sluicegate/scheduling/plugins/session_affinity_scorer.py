"""``session-affinity-scorer``: keep a client's session on the endpoint that served it.

Type: scorer (affinity) and pre-request hook. Strategy ``encoded_endpoint_header`` — the
stateless one, and the only one implemented: the gateway keeps no session table; the
client carries the endpoint in a token.

Inputs: the request header ``x-session-token``, the URL-safe base64 of an endpoint name
(padding optional; the standard ``+/`` alphabet is accepted too).
Parameters: ``strategy`` (``encoded_endpoint_header``).

Formula: 1.0 for the endpoint the token names, 0 for every other endpoint; all 0 when the
header is absent, is not valid base64 or UTF-8, or names no candidate — a bad token is
never an error. Since it is a soft preference, a gone endpoint simply loses the session.

After scheduling it writes the chosen endpoint's token (URL-safe base64, unpadded) into the
cycle state's :data:`~sluicegate.framework.scheduling.RESPONSE_HEADERS` (merged into the
dict already there) so the gateway returns it to the client, which sends it back with the
session's next request. As llm-d-router's ``session-affinity-scorer``
(https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/sessionaffinity/encoded_endpoint_header.go),
except that llm-d-router encodes ``namespace/name``, sluicegate the endpoint's name.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Literal

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    RESPONSE_HEADERS,
    CycleState,
    LLMRequest,
    PluginParameters,
    PreRequest,
    SchedulingResult,
    Scorer,
)

SESSION_HEADER = "x-session-token"
"""Request and response header carrying the session token (lower-case)."""


def encode_session_token(endpoint_name: str) -> str:
    """The session token naming ``endpoint_name``: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(endpoint_name.encode()).rstrip(b"=").decode("ascii")


def decode_session_token(token: str) -> str | None:
    """The endpoint name in ``token``, or None when it is not a valid token."""
    try:
        raw = token.strip().encode("ascii")
        raw += b"=" * (-len(raw) % 4)
        return base64.b64decode(raw, altchars=b"-_", validate=True).decode()
    except ValueError:  # binascii.Error, UnicodeError
        return None


class SessionAffinityScorer(Scorer, PreRequest):
    type_name = "session-affinity-scorer"
    category = "affinity"

    class Parameters(PluginParameters):
        strategy: Literal["encoded_endpoint_header"] = "encoded_endpoint_header"

    params: Parameters

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        token = request.headers.get(SESSION_HEADER)
        target = decode_session_token(token) if token else None
        if target is None:
            return [0.0] * len(endpoints)
        return [1.0 if e.name == target else 0.0 for e in endpoints]

    def pre_request(self, request: LLMRequest, state: CycleState, result: SchedulingResult) -> None:
        targets = result.targets
        if not targets:
            return
        token = encode_session_token(targets[0].name)
        headers = state.get(RESPONSE_HEADERS)
        if headers is None:
            state.put(RESPONSE_HEADERS, {SESSION_HEADER: token})
        else:
            headers[SESSION_HEADER] = token
