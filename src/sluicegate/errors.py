"""Errors the gateway answers on purpose, with the status and body clients expect.

Every deliberate decision has its status (the project's principle "errors are answers",
and the endpoint picker protocol's 429 for shedding and 503 when no endpoint is ready):
400 bad input, 401 missing or wrong API key, 404 unknown model, 413 body too large, 429 shed
(with ``Retry-After``), 503 no endpoint or queue expiry, 502/504 upstream failure. Protocol:
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/docs/proposals/004-endpoint-picker-protocol/README.md
Bodies are OpenAI-style::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "model",
               "code": "model_not_found"}}
"""

from __future__ import annotations

import orjson

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    501: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class GatewayError(Exception):
    """A request the gateway answers itself instead of forwarding."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
        reason: str | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.detail = detail
        """What the operator needs to know beyond ``message`` (logged, never sent)."""
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        self.reason = reason or code or str(status)
        """Short label for metrics and the ``x-sluicegate-dropped-reason`` header."""

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": _TYPES.get(self.status, "api_error"),
                    "param": self.param,
                    "code": self.code,
                }
            }
        )

    def headers(self) -> dict[str, str]:
        out = {"x-sluicegate-dropped-reason": self.reason}
        if self.retry_after_s is not None:
            out["Retry-After"] = str(self.retry_after_s)
        return out


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code="invalid_request", reason="bad-request")


def unknown_model(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model '{model}' does not exist.",
        param="model",
        code="model_not_found",
        reason="unknown-model",
    )


def no_endpoint(message: str = "no ready endpoint can serve this request") -> GatewayError:
    return GatewayError(503, message, code="no_endpoint", retry_after_s=1, reason="no-endpoint")


def shed(message: str, retry_after_s: int = 1, reason: str = "rejected-saturated") -> GatewayError:
    return GatewayError(429, message, code="shed", retry_after_s=retry_after_s, reason=reason)
