"""Plugin types by name, and plugins built from configuration.

A :class:`PluginRegistry` maps type names (and aliases) to plugin classes. sluicegate's
built-in plugins are registered in one place, :func:`sluicegate.builtins.default_registry`,
which also loads plugins other distributions declare under the ``sluicegate.plugins``
entry-point group (:data:`ENTRY_POINT_GROUP`)::

    # pyproject.toml of a plugin distribution
    [project.entry-points."sluicegate.plugins"]
    my-scorer = "my_package.scorer:MyScorer"

Each entry point names a :class:`~sluicegate.framework.plugin.Plugin` subclass; it is
registered under the class's ``type_name`` (the entry point's name is only a label).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from sluicegate.framework.plugin import Plugin, PluginConfigError, PluginContext

log = logging.getLogger("sluicegate.plugins")

ENTRY_POINT_GROUP = "sluicegate.plugins"


class PluginRegistry:
    """Plugin classes by type name. Built once, then only read."""

    def __init__(self, plugins: Iterable[type[Plugin]] = ()) -> None:
        self._types: dict[str, type[Plugin]] = {}
        self._aliases: dict[str, str] = {}
        for cls in plugins:
            self.register(cls)

    def register(self, cls: type[Plugin]) -> None:
        """Add ``cls`` under its ``type_name`` and ``aliases``; a name taken by another
        class is a ``TypeError``."""
        if not isinstance(cls, type) or not issubclass(cls, Plugin):
            raise TypeError(f"{cls!r} is not a Plugin subclass")
        name = cls.type_name
        if not name:
            raise TypeError(f"{cls.__name__} has no type_name")
        taken = self._types.get(name) or self._types.get(self._aliases.get(name, ""))
        if taken is not None and taken is not cls:
            raise TypeError(f"plugin type {name!r} is already registered by {taken.__name__}")
        self._types[name] = cls
        for alias in cls.aliases:
            if alias in self._types or self._aliases.get(alias, name) != name:
                raise TypeError(f"plugin alias {alias!r} is already taken")
            self._aliases[alias] = name

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Register the plugin classes installed distributions declare under ``group``;
        returns their type names. An entry point that cannot be loaded, or is not a plugin,
        is logged and skipped: one broken distribution must not stop the gateway."""
        loaded = []
        for entry in metadata.entry_points(group=group):
            try:
                cls = entry.load()
                self.register(cls)
            except Exception as exc:  # an import error, a clash: the distribution's fault
                log.error("plugin entry point %s (%s) not loaded: %s", entry.name, entry.value, exc)
                continue
            loaded.append(cls.type_name)
        return loaded

    def types(self) -> dict[str, type[Plugin]]:
        """Every registered plugin type, by type name."""
        return dict(sorted(self._types.items()))

    def resolve(self, type_name: str) -> type[Plugin]:
        """The class registered as ``type_name`` (or as its alias)."""
        canonical = self._aliases.get(type_name, type_name)
        try:
            return self._types[canonical]
        except KeyError:
            known = ", ".join(sorted(self._types))
            raise PluginConfigError(
                f"unknown plugin type {type_name!r}; known types: {known}"
            ) from None

    def create(
        self,
        type_name: str,
        name: str,
        parameters: Mapping[str, Any] | None,
        context: PluginContext,
    ) -> Plugin:
        """Build a plugin, validating ``parameters`` against its ``Parameters`` model."""
        cls = self.resolve(type_name)
        try:
            params = cls.Parameters.model_validate(dict(parameters or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'parameters'}: {err['msg']}"
                for err in exc.errors()
            )
            raise PluginConfigError(f"plugin {name!r} ({cls.type_name}): {problems}") from None
        return cls(name, context, params)


__all__ = ["ENTRY_POINT_GROUP", "PluginRegistry"]
