"""The standalone gateway: an OpenAI-compatible HTTP server in front of a pool.

- :mod:`~sluicegate.gateway.app` — ``Gateway`` (routes, auth, lifecycle) and its
  ``GatewayOptions``; with ``app_keys`` (API keys: the keys in force, the open paths,
  the 401, comparing tokens, which requests are trusted) and ``app_answers``
  (``send_error``, the answers from the gateway's own state: models, metrics, health,
  readiness);
- :mod:`~sluicegate.gateway.proxy` — ``Proxy``: forwarding a routed request, retries, the
  answer back (``ProxySettings``, ``Outcome``);
- :mod:`~sluicegate.gateway.run` — ``sluicegate serve`` (``serve``, ``ServeOptions``);
- :mod:`~sluicegate.gateway.http` — the HTTP/1.1 server, a package of its own.

The names are imported on first use (lazy): importing :mod:`sluicegate.gateway.http` runs
this file, and the HTTP server alone must not load the runtime and every plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "Gateway": "sluicegate.gateway.app",
    "GatewayOptions": "sluicegate.gateway.app",
    "send_error": "sluicegate.gateway.app_answers",
    "SERVED_HEADER": "sluicegate.gateway.proxy",
    "Outcome": "sluicegate.gateway.proxy",
    "Proxy": "sluicegate.gateway.proxy",
    "ProxySettings": "sluicegate.gateway.proxy",
    "upstream_headers": "sluicegate.gateway.proxy",
    "ServeOptions": "sluicegate.gateway.run",
    "embedded_config": "sluicegate.gateway.run",
    "serve": "sluicegate.gateway.run",
}

if TYPE_CHECKING:
    from sluicegate.gateway.app import Gateway, GatewayOptions
    from sluicegate.gateway.app_answers import send_error
    from sluicegate.gateway.proxy import (
        SERVED_HEADER,
        Outcome,
        Proxy,
        ProxySettings,
        upstream_headers,
    )
    from sluicegate.gateway.run import ServeOptions, embedded_config, serve


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "SERVED_HEADER",
    "Gateway",
    "GatewayOptions",
    "Outcome",
    "Proxy",
    "ProxySettings",
    "ServeOptions",
    "embedded_config",
    "send_error",
    "serve",
    "upstream_headers",
]
