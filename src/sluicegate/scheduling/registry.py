"""Plugins by type name: how configuration turns ``type: queue-scorer`` into an object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from sluicegate.scheduling.framework import Plugin, PluginContext

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
    # Importing the package registers every built-in plugin.
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
