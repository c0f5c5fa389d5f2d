"""What can go wrong talking to a model server, as the proxy needs to tell it apart.

The proxy retries a request on another endpoint when it failed before the client saw a
byte, unless the failure is a timeout waiting for a byte: the request may still be running
there, so it is answered 504 instead.
"""

from __future__ import annotations


class UpstreamError(Exception):
    """A request to a model server failed."""


class UpstreamConnectError(UpstreamError):
    """No connection could be made (refused, unreachable, or the connect timeout passed)."""


class UpstreamDroppedError(UpstreamError):
    """The server closed or reset the connection before its answer was complete."""


class UpstreamProtocolError(UpstreamError):
    """The server sent something that is not a valid HTTP/1.1 answer."""


class UpstreamTimeoutError(UpstreamError, TimeoutError):
    """No byte of the answer arrived within the read timeout."""


__all__ = [
    "UpstreamConnectError",
    "UpstreamDroppedError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamTimeoutError",
]
