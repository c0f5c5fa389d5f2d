"""The configuration API: the resources a configuration file (or Kubernetes) declares.

- :mod:`~sluicegate.api.loader` — reading and cross-checking a configuration
  (``load_config``, ``parse_config``, ``build_config`` → ``Config``; ``ConfigError``);
- :mod:`~sluicegate.api.resources` — the resource models: ``InferencePool``,
  ``InferenceModel``, ``InferenceModelRewrite``, ``InferenceObjective``,
  ``EndpointPickerConfig`` and their parts (the picker's in :mod:`~sluicegate.api.picker`);
- :mod:`~sluicegate.api.settings` — ``GatewayConfig``: the gateway's own settings;
- :mod:`~sluicegate.api.base` — what every model shares (strict camelCase, metadata);
- :mod:`~sluicegate.api.units` — durations (``Seconds``, ``parse_duration_s``) and sizes
  (``parse_bytes``, bytes) as a configuration spells them;
- :mod:`~sluicegate.api.keys` — API keys for the gateway: where they come from, what makes
  one usable.

The re-exports are eager: the package is the lowest layer, imports only itself and
pydantic/YAML, and every user of one of its modules ends up loading the loader anyway.
"""

from sluicegate.api.keys import (
    KeySourceError,
    check_keys,
    collect_keys,
    key_problem,
    keys_from_env,
    keys_from_file,
)
from sluicegate.api.loader import Config, ConfigError, build_config, load_config, parse_config
from sluicegate.api.resources import (
    EndpointPickerConfig,
    FlowControlSpec,
    InferenceModel,
    InferenceModelRewrite,
    InferenceObjective,
    InferencePool,
    LabelSelector,
    PluginSpec,
    PriorityBandSpec,
    SchedulingProfileSpec,
    StaticEndpoint,
)
from sluicegate.api.settings import (
    GatewayConfig,
    GatewaySettings,
    LatencyPredictorSettings,
    OutlierDetectionSettings,
    RedisSettings,
    SharedStateSettings,
)
from sluicegate.api.units import Seconds, parse_bytes, parse_duration_s

__all__ = [
    "Config",
    "ConfigError",
    "EndpointPickerConfig",
    "FlowControlSpec",
    "GatewayConfig",
    "GatewaySettings",
    "InferenceModel",
    "InferenceModelRewrite",
    "InferenceObjective",
    "InferencePool",
    "KeySourceError",
    "LabelSelector",
    "LatencyPredictorSettings",
    "OutlierDetectionSettings",
    "PluginSpec",
    "PriorityBandSpec",
    "RedisSettings",
    "SchedulingProfileSpec",
    "Seconds",
    "SharedStateSettings",
    "StaticEndpoint",
    "build_config",
    "check_keys",
    "collect_keys",
    "key_problem",
    "keys_from_env",
    "keys_from_file",
    "load_config",
    "parse_bytes",
    "parse_config",
    "parse_duration_s",
]
