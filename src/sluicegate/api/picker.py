"""``EndpointPickerConfig``: the plugins, scheduling profiles, saturation detector and
flow control of the endpoint picker, in the shape GIE and llm-d document
(https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/site-src/guides/epp-configuration/config-text.md).
:mod:`sluicegate.api.resources` re-exports every name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from sluicegate.api.base import Model
from sluicegate.api.units import Bytes, Seconds


class PluginSpec(Model):
    type: Annotated[str, Field(min_length=1)]
    name: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)

    @property
    def ref(self) -> str:
        return self.name or self.type


class ProfilePluginRef(Model):
    plugin_ref: Annotated[str, Field(min_length=1)]
    weight: Annotated[float, Field(ge=0)] | None = None


class SchedulingProfileSpec(Model):
    name: Annotated[str, Field(min_length=1)]
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class PluginRef(Model):
    plugin_ref: str


class PriorityBandSpec(Model):
    """One priority band of flow control; omitted fields take the default band's."""

    priority: int | None = None
    max_bytes: Bytes | None = None
    max_requests: Annotated[int, Field(ge=1)] | None = None
    ordering_policy_ref: str | None = None
    fairness_policy_ref: str | None = None


class FlowControlSpec(Model):
    """The ``flowControl`` section, as GIE documents it:
    https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/site-src/guides/epp-configuration/config-text.md"""

    max_bytes: Bytes | None = None
    max_requests: Annotated[int, Field(ge=1)] | None = None
    default_request_ttl: Seconds | None = Field(60.0, alias="defaultRequestTTL")
    """How long a request may wait; 0 or null waits until dispatched or cancelled."""
    default_priority_band: PriorityBandSpec = Field(default_factory=PriorityBandSpec)
    priority_bands: list[PriorityBandSpec] = Field(default_factory=list)
    usage_limit_policy_plugin_ref: str | None = None

    @model_validator(mode="after")
    def _bands(self) -> FlowControlSpec:
        priorities = [b.priority for b in self.priority_bands]
        if any(p is None for p in priorities):
            raise ValueError("every entry of priorityBands needs a priority")
        if len(set(priorities)) != len(priorities):
            raise ValueError("priorityBands priorities must be unique")
        return self


class EndpointPickerConfig(Model):
    """``EndpointPickerConfig``: plugins and scheduling profiles. It has no metadata."""

    api_version: str
    kind: Literal["EndpointPickerConfig"]
    feature_gates: list[str] = Field(default_factory=list)
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileSpec] = Field(default_factory=list)
    saturation_detector: PluginRef | None = None
    flow_control: FlowControlSpec | None = None
    # Sections of the reference endpoint picker's configuration that sluicegate accepts so
    # existing files load, and does not act on: metrics collection is built in
    # (datalayer/), and requests are always parsed as OpenAI-style.
    data_layer: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    parser: dict[str, Any] | None = None
    engine_configs: list[Any] | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _references(self) -> EndpointPickerConfig:
        # Every problem is reported, each with the path of the field it is about.
        problems: list[str] = []
        names = [p.ref for p in self.plugins]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            problems.append(f"plugins: plugin names must be unique: {', '.join(duplicates)}")
        known = set(names)
        for i, profile in enumerate(self.scheduling_profiles):
            for j, ref in enumerate(profile.plugins):
                if ref.plugin_ref not in known:
                    problems.append(
                        f"schedulingProfiles.{i}.plugins.{j}.pluginRef: profile "
                        f"{profile.name!r} references unknown plugin {ref.plugin_ref!r}"
                    )
        profiles = [p.name for p in self.scheduling_profiles]
        duplicate_profiles = sorted({n for n in profiles if profiles.count(n) > 1})
        if duplicate_profiles:
            problems.append(
                "schedulingProfiles: schedulingProfiles names must be unique: "
                + ", ".join(duplicate_profiles)
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


__all__ = [
    "EndpointPickerConfig",
    "FlowControlSpec",
    "PluginRef",
    "PluginSpec",
    "PriorityBandSpec",
    "ProfilePluginRef",
    "SchedulingProfileSpec",
]
