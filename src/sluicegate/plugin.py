"""The plugin machinery shared by scheduling and flow control.

A plugin is a class with a ``type_name``, registered with :func:`register`, whose
configuration (``parameters`` in YAML, camelCase) is validated against its nested
``Parameters`` model. :func:`create_plugin` turns ``type: queue-scorer`` plus parameters
into an object; each kind of plugin (filter, scorer, picker, saturation detector, ordering
policy, ...) is an abstract class built on :class:`Plugin` in the package that uses it.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from sluicegate.clock import Clock


@dataclass(slots=True)
class PluginContext:
    """What a plugin may use: the clock and a seed for its random choices."""

    clock: Clock
    seed: int = 0
    lookup: Mapping[str, Plugin] = field(default_factory=dict)
    """Plugins by name, for plugins that read another plugin's output."""
    services: Mapping[str, object] = field(default_factory=dict)
    """Shared objects the host provides by name (e.g. ``latency-predictor``)."""

    def rng_for(self, plugin_name: str) -> random.Random:
        """A random stream of the plugin's own, fixed by the seed and the plugin's name, so
        adding or removing one plugin does not change another's choices."""
        return random.Random(f"{self.seed}:{plugin_name}")


class PluginParameters(BaseModel):
    """Base of plugin parameter models: camelCase in YAML, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Plugin(abc.ABC):
    """Base of every plugin. ``type_name`` is the name used in configuration.

    A plugin with parameters declares a nested ``Parameters`` model (a subclass of
    :class:`PluginParameters`) and annotates ``params`` with it; the registry validates
    configuration against it and passes the result to the constructor.
    """

    type_name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()
    """Types of producer plugins this plugin reads; created automatically if missing."""
    Parameters: ClassVar[type[PluginParameters]] = PluginParameters
    params: PluginParameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        self.name = name
        self.context = context
        self.rng = context.rng_for(name)
        self.params = params if params is not None else type(self).Parameters()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


P = TypeVar("P", bound=type[Plugin])

_REGISTRY: dict[str, type[Plugin]] = {}
_ALIASES: dict[str, str] = {}


class PluginConfigError(ValueError):
    """A plugin reference or its parameters are invalid; the message says which and why."""


def register(*aliases: str) -> Any:
    """Class decorator registering a plugin under its ``type_name`` (and ``aliases``)."""

    def wrap(cls: P) -> P:
        name = cls.type_name
        if not name:
            raise TypeError(f"{cls.__name__} has no type_name")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise TypeError(f"plugin type {name!r} registered twice")
        _REGISTRY[name] = cls
        for alias in aliases:
            if alias in _REGISTRY or _ALIASES.get(alias, name) != name:
                raise TypeError(f"plugin alias {alias!r} is already taken")
            _ALIASES[alias] = name
        return cls

    return wrap


def _load_builtins() -> None:
    # Importing the packages registers every built-in plugin.
    import sluicegate.flowcontrol.policies
    import sluicegate.scheduling.plugins  # noqa: F401


def plugin_types() -> dict[str, type[Plugin]]:
    """Every registered plugin type, by type name."""
    _load_builtins()
    return dict(sorted(_REGISTRY.items()))


def resolve_type(type_name: str) -> type[Plugin]:
    _load_builtins()
    canonical = _ALIASES.get(type_name, type_name)
    try:
        return _REGISTRY[canonical]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise PluginConfigError(
            f"unknown plugin type {type_name!r}; known types: {known}"
        ) from None


def create_plugin(
    type_name: str, name: str, parameters: Mapping[str, Any] | None, context: PluginContext
) -> Plugin:
    """Build a plugin, validating ``parameters`` against its ``Parameters`` model."""
    cls = resolve_type(type_name)
    try:
        params = cls.Parameters.model_validate(dict(parameters or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'parameters'}: {err['msg']}"
            for err in exc.errors()
        )
        raise PluginConfigError(f"plugin {name!r} ({cls.type_name}): {problems}") from None
    return cls(name, context, params)
