"""Build a :class:`Scheduler` from an ``EndpointPickerConfig``.

Defaults are injected the way the reference endpoint picker does (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/config/loader/defaults.go):
a ``single-profile-handler`` when there is one profile and no handler, a
``max-score-picker`` for a profile without a picker, weight 1.0 for an unweighted scorer,
and any producer a plugin reads (``requires``) when the configuration lacks one. With no
configuration at all the ``default`` preset applies: ``queue-scorer`` ×2,
``kv-cache-utilization-scorer`` ×2, ``prefix-cache-scorer`` ×3, ``max-score-picker``.

Presets (``presets/*.yaml``) are named configurations shipped with sluicegate: ``default``,
``round-robin`` (per request; a Kubernetes Service balances connections), ``random``,
``least-request`` and more; ``sluicegate serve --policy NAME`` and the benchmark lab select
them by name.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

import yaml

from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.framework import (
    Admitter,
    AsyncDataProducer,
    DataProducer,
    EndpointObserver,
    Filter,
    Picker,
    Plugin,
    PluginConfigError,
    PluginContext,
    PluginRegistry,
    PreRequest,
    ProfileHandler,
    ResponseObserver,
    Scorer,
)
from sluicegate.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

DEFAULT_PRESET = "default"


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    folder = resources.files("sluicegate.scheduling").joinpath("presets")
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_preset(name: str) -> EndpointPickerConfig:
    """The shipped preset called ``name``."""
    folder = resources.files("sluicegate.scheduling").joinpath("presets")
    path = folder.joinpath(f"{name}.yaml")
    if not path.is_file():
        raise PluginConfigError(
            f"unknown scheduling preset {name!r}; known presets: {', '.join(preset_names())}"
        )
    return EndpointPickerConfig.model_validate(yaml.safe_load(path.read_text()))


class BuiltScheduler:
    """A scheduler plus every plugin instance it was built from, by role."""

    def __init__(
        self, scheduler: Scheduler, plugins: dict[str, Plugin], registry: PluginRegistry
    ) -> None:
        self.scheduler = scheduler
        self.plugins = plugins
        self.registry = registry
        """The plugin types it was built from (flow control resolves its policies there)."""
        self.observers = [p for p in plugins.values() if isinstance(p, EndpointObserver)]
        """Plugins to tell when an endpoint leaves the pool."""
        self.response_observers = [p for p in plugins.values() if isinstance(p, ResponseObserver)]
        """Plugins to tell how each scheduled request went."""
        self.admitters = [p for p in plugins.values() if isinstance(p, Admitter)]
        self.fetchers = _fetch_order(
            [p for p in plugins.values() if isinstance(p, AsyncDataProducer) and p.fetches]
        )
        """Producers whose data needs I/O; the host awaits their prefetch before submit,
        those whose output another fetcher requires first (the precise prefix producer's
        fetched match before the latency predictor's rows)."""
        self.hardware_aware = any(p.hardware_aware for p in plugins.values())
        """Some plugin accounts for endpoints' hardware classes (see
        :attr:`Plugin.hardware_aware <sluicegate.framework.plugin.Plugin.hardware_aware>`);
        False: the scheduler is hardware-blind."""


def _fetch_order(fetchers: list[AsyncDataProducer]) -> list[AsyncDataProducer]:
    """``fetchers`` with those whose type another one ``requires`` first (stable)."""
    wanted = {t for f in fetchers for t in f.requires}

    def later(f: AsyncDataProducer) -> bool:
        return not wanted.intersection((f.type_name, *f.provides))

    return sorted(fetchers, key=later)


def build_scheduler(
    config: EndpointPickerConfig | None, context: PluginContext, registry: PluginRegistry
) -> BuiltScheduler:
    """Instantiate and wire the plugins of ``config`` (the default preset if None), their
    types looked up in ``registry``."""
    if config is None:
        config = load_preset(DEFAULT_PRESET)
    plugins: dict[str, Plugin] = {}
    context = replace(context, lookup=plugins)
    for plugin_spec in config.plugins:
        plugins[plugin_spec.ref] = registry.create(
            plugin_spec.type, plugin_spec.ref, plugin_spec.parameters, context
        )

    # Producers that configured plugins read, created when missing.
    present = {type(p).type_name for p in plugins.values()}
    present.update(name for p in plugins.values() for name in type(p).provides)
    auto: list[Plugin] = []
    for plugin in list(plugins.values()):
        for needed in plugin.requires:
            canonical = registry.resolve(needed).type_name
            if canonical not in present:
                created = registry.create(canonical, canonical, None, context)
                plugins[canonical] = created
                auto.append(created)
                present.add(canonical)

    profiles: dict[str, SchedulerProfile] = {}
    specs = config.scheduling_profiles
    if not specs:
        raise PluginConfigError("the configuration has no schedulingProfiles")
    for spec in specs:
        filters: list[Filter] = []
        scorers: list[WeightedScorer] = []
        picker: Picker | None = None
        for ref in spec.plugins:
            plugin = plugins[ref.plugin_ref]
            if isinstance(plugin, Filter):
                filters.append(plugin)
            if isinstance(plugin, Scorer):
                scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
            elif ref.weight is not None:
                raise PluginConfigError(
                    f"profile {spec.name!r}: weight given to {ref.plugin_ref!r}, which is not a "
                    "scorer"
                )
            if isinstance(plugin, Picker):
                if picker is not None:
                    raise PluginConfigError(f"profile {spec.name!r} has more than one picker")
                picker = plugin
        if picker is None:
            name = f"{spec.name}-max-score-picker"
            created_picker = registry.create("max-score-picker", name, None, context)
            assert isinstance(created_picker, Picker)
            plugins[name] = picker = created_picker
        profiles[spec.name] = SchedulerProfile(spec.name, picker, filters, scorers)

    handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        raise PluginConfigError("more than one profile handler is configured")
    if handlers:
        handler = handlers[0]
    elif len(profiles) == 1:
        created_handler = registry.create(
            "single-profile-handler", "single-profile-handler", None, context
        )
        assert isinstance(created_handler, ProfileHandler)
        handler = plugins["single-profile-handler"] = created_handler
    else:
        raise PluginConfigError("several schedulingProfiles need a profile handler plugin")

    ordered = auto + [p for p in plugins.values() if p not in auto]
    producers = _dependency_order([p for p in ordered if isinstance(p, DataProducer)], registry)
    pre_request = [p for p in ordered if isinstance(p, PreRequest)]
    scheduler = Scheduler(handler, profiles, producers, pre_request)
    return BuiltScheduler(scheduler, plugins, registry)


def _dependency_order(
    producers: list[DataProducer], registry: PluginRegistry
) -> list[DataProducer]:
    """Producers ordered so each runs after the producer types it ``requires``."""
    by_type = {type(p).type_name: p for p in producers}
    for p in producers:
        for provided in type(p).provides:
            by_type.setdefault(provided, p)
    ordered: list[DataProducer] = []
    visiting: set[str] = set()

    def visit(producer: DataProducer) -> None:
        if producer in ordered:
            return
        name = type(producer).type_name
        if name in visiting:
            raise PluginConfigError(f"producers depend on each other in a cycle at {name!r}")
        visiting.add(name)
        for needed in producer.requires:
            dependency = by_type.get(registry.resolve(needed).type_name)
            if dependency is not None:
                visit(dependency)
        visiting.discard(name)
        ordered.append(producer)

    for producer in producers:
        visit(producer)
    return ordered
