"""What can go wrong talking to a model server, as the proxy needs to tell it apart.

The proxy retries a request on another endpoint when it failed before the client saw a
byte: connect errors, drops, and first-byte timeouts (:class:`UpstreamFirstByteTimeoutError`:
the server showed no sign of work within the bound, so the attempt is abandoned). A later
read timeout (:class:`UpstreamTimeoutError`) is answered 504.
"""

from __future__ import annotations


class UpstreamError(Exception):
    """A request to a model server failed."""


class UpstreamConnectError(UpstreamError):
    """No connection could be made (refused, unreachable, or the connect timeout passed)."""


class UpstreamDroppedError(UpstreamError):
    """The server closed or reset the connection before its answer was complete."""


class UpstreamAbortedError(UpstreamDroppedError):
    """The gateway abandoned the exchange itself (:meth:`UpstreamPool.abort
    <sluicegate.upstream.pool.UpstreamPool.abort>`, e.g. its endpoint stalled). A drop, so
    the proxy retries it on another endpoint when nothing reached the client; never resent
    to the same endpoint."""


class UpstreamProtocolError(UpstreamError):
    """The server sent something that is not a valid HTTP/1.1 answer."""


class UpstreamTimeoutError(UpstreamError, TimeoutError):
    """No byte of the answer arrived within the read timeout."""


class UpstreamFirstByteTimeoutError(UpstreamTimeoutError):
    """The answer's first byte (its status and headers, and the first body byte when one
    was asked for) did not arrive within the first-byte timeout."""


__all__ = [
    "UpstreamAbortedError",
    "UpstreamConnectError",
    "UpstreamDroppedError",
    "UpstreamError",
    "UpstreamFirstByteTimeoutError",
    "UpstreamProtocolError",
    "UpstreamTimeoutError",
]
