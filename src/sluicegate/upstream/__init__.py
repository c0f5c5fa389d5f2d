"""The gateway's HTTP/1.1 client for model servers: pooled keep-alive connections, answers
read whole or as they stream (see :mod:`sluicegate.upstream.pool`)."""

from sluicegate.upstream.connection import UpstreamResponse
from sluicegate.upstream.errors import (
    UpstreamAbortedError,
    UpstreamConnectError,
    UpstreamDroppedError,
    UpstreamError,
    UpstreamFirstByteTimeoutError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from sluicegate.upstream.pool import UpstreamPool

__all__ = [
    "UpstreamAbortedError",
    "UpstreamConnectError",
    "UpstreamDroppedError",
    "UpstreamError",
    "UpstreamFirstByteTimeoutError",
    "UpstreamPool",
    "UpstreamProtocolError",
    "UpstreamResponse",
    "UpstreamTimeoutError",
]
