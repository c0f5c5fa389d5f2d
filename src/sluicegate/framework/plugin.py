"""The plugin base every scheduling and flow-control plugin builds on.

A plugin is a class with a ``type_name`` (the name configuration uses) whose
configuration (``parameters`` in YAML, camelCase) is validated against its nested
``Parameters`` model. Each kind of plugin (filter, scorer, picker, data producer,
saturation detector, ordering policy, ...) is an abstract class built on :class:`Plugin`
in :mod:`sluicegate.framework.scheduling` or :mod:`sluicegate.framework.flowcontrol`;
:class:`~sluicegate.framework.registry.PluginRegistry` turns ``type: queue-scorer`` plus
parameters into an object.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict
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


class PluginConfigError(ValueError):
    """A plugin reference or its parameters are invalid; the message says which and why."""


class Plugin(abc.ABC):
    """Base of every plugin. ``type_name`` is the name used in configuration.

    A plugin with parameters declares a nested ``Parameters`` model (a subclass of
    :class:`PluginParameters`) and annotates ``params`` with it; the registry validates
    configuration against it and passes the result to the constructor.
    """

    type_name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names configuration may use for this type."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Types of producer plugins this plugin reads; created automatically if missing."""
    provides: ClassVar[tuple[str, ...]] = ()
    """Producer types whose output this plugin writes in their stead (a plugin requiring
    one of them is then satisfied without creating it)."""
    Parameters: ClassVar[type[PluginParameters]] = PluginParameters
    params: PluginParameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        self.name = name
        self.context = context
        self.rng = context.rng_for(name)
        self.params = params if params is not None else type(self).Parameters()

    @property
    def hardware_aware(self) -> bool:
        """Whether this plugin's choice accounts for each endpoint's hardware class
        (:attr:`Endpoint.hardware <sluicegate.datalayer.endpoint.Endpoint.hardware>`):
        it learns, scales or prices per class. A scheduler none of whose plugins is
        hardware-aware is *hardware-blind*, and a pool mixing classes under it is
        reported (log, ``/health``). Default False; a plugin overrides it, from its
        parameters where a parameter decides (e.g. one latency model per pool)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


__all__ = ["Plugin", "PluginConfigError", "PluginContext", "PluginParameters"]
