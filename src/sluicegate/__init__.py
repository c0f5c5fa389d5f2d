"""sluicegate: an inference gateway for self-hosted LLM fleets.

The names below are the embedding API: load a configuration, run the standalone gateway
(or just the picker's runtime, as the Envoy endpoint picker does), and build plugins on
the framework layer (:mod:`sluicegate.framework`). They are imported on first use, so
``import sluicegate.framework`` stays free of the gateway and its plugins.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

from sluicegate import lazy

try:
    __version__ = metadata.version("sluicegate")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    "Config": "sluicegate.api.loader",
    "ConfigError": "sluicegate.api.loader",
    "load_config": "sluicegate.api.loader",
    "parse_config": "sluicegate.api.loader",
    "GatewayError": "sluicegate.errors",
    "Gateway": "sluicegate.gateway.app",
    "GatewayOptions": "sluicegate.gateway.app",
    "Runtime": "sluicegate.runtime",
    "RuntimeOptions": "sluicegate.runtime",
    "default_registry": "sluicegate.builtins",
}

if TYPE_CHECKING:
    from sluicegate.api.loader import Config, ConfigError, load_config, parse_config
    from sluicegate.builtins import default_registry
    from sluicegate.errors import GatewayError
    from sluicegate.gateway.app import Gateway, GatewayOptions
    from sluicegate.runtime import Runtime, RuntimeOptions


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "Config",
    "ConfigError",
    "Gateway",
    "GatewayError",
    "GatewayOptions",
    "Runtime",
    "RuntimeOptions",
    "__version__",
    "default_registry",
    "load_config",
    "parse_config",
]
