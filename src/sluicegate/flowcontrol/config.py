"""Building flow control from an ``EndpointPickerConfig``.

- ``featureGates: [flowControl]`` turns it on for every pool; an InferencePool annotated
  ``inference-epp-env.networking.x-k8s.io/experimental-use-queueing: "true"`` turns it on
  for that pool (as the public guide's manifests do).
- ``saturationDetector: {pluginRef: NAME}`` picks the detector among ``plugins``
  (default: a ``utilization-detector`` with its defaults). The detector also drives
  shedding when flow control is off.
- ``flowControl``: global ``maxRequests`` / ``maxBytes``, ``defaultRequestTTL`` (60 s),
  ``defaultPriorityBand`` and ``priorityBands`` (per-priority ``maxRequests``,
  ``maxBytes`` — 1 GB by default —, ``orderingPolicyRef``, ``fairnessPolicyRef``), and
  ``usageLimitPolicyPluginRef``. A policy reference names a configured plugin or a
  policy type, which is then created with its defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluicegate.api.resources import EndpointPickerConfig, FlowControlSpec, PriorityBandSpec
from sluicegate.flowcontrol.controller import BandPolicy, FlowControlSettings
from sluicegate.framework import (
    BandLimits,
    FairnessPolicy,
    OrderingPolicy,
    Plugin,
    PluginConfigError,
    PluginContext,
    PluginRegistry,
    SaturationDetector,
    UsageLimitPolicy,
)

FEATURE_GATE = "flowControl"
POOL_ANNOTATION = "inference-epp-env.networking.x-k8s.io/experimental-use-queueing"

DEFAULT_DETECTOR = "utilization-detector"
DEFAULT_USAGE_LIMIT = "static-usage-limit-policy"
DEFAULT_ORDERING = "fcfs-ordering-policy"
DEFAULT_FAIRNESS = "global-strict-fairness-policy"


@dataclass(slots=True)
class FlowControlSetup:
    """Everything flow control needs, built once per configuration."""

    enabled: bool
    """On for every pool (the feature gate)."""
    detector: SaturationDetector
    usage_limit: UsageLimitPolicy
    settings: FlowControlSettings

    def enabled_for(self, annotations: Mapping[str, str]) -> bool:
        return self.enabled or annotations.get(POOL_ANNOTATION, "").lower() == "true"


class _Resolver:
    """Finds a plugin by name among the configured ones, or creates one by type."""

    def __init__(
        self, plugins: Mapping[str, Plugin], context: PluginContext, registry: PluginRegistry
    ) -> None:
        self.plugins = plugins
        self.context = context
        self.registry = registry
        self._created: dict[str, Plugin] = {}

    def get(self, ref: str, kind: Any, what: str) -> Any:
        """The plugin ``ref`` (a configured name or a type name), checked to be a ``kind``
        (typed ``Any``: the kinds are abstract classes)."""
        plugin = self.plugins.get(ref) or self._created.get(ref)
        if plugin is None:
            plugin = self._created[ref] = self.registry.create(ref, ref, None, self.context)
        if not isinstance(plugin, kind):
            raise PluginConfigError(
                f"{what} {ref!r} is a {type(plugin).type_name}, not a {kind.__name__}"
            )
        return plugin


def build_flow_control(
    config: EndpointPickerConfig | None,
    plugins: Mapping[str, Plugin],
    context: PluginContext,
    registry: PluginRegistry,
) -> FlowControlSetup:
    """Flow control for ``config``; ``plugins`` are the instances built from its list, and
    policies it names by type are created from ``registry``."""
    resolve = _Resolver(plugins, context, registry)
    detector_ref = (
        config.saturation_detector.plugin_ref
        if config is not None and config.saturation_detector
        else DEFAULT_DETECTOR
    )
    detector: SaturationDetector = resolve.get(
        detector_ref, SaturationDetector, "saturationDetector"
    )
    spec = (config.flow_control if config is not None else None) or FlowControlSpec()
    usage: UsageLimitPolicy = resolve.get(
        spec.usage_limit_policy_plugin_ref or DEFAULT_USAGE_LIMIT,
        UsageLimitPolicy,
        "usageLimitPolicyPluginRef",
    )
    default = _band_policy(spec.default_priority_band, None, resolve)
    bands = {
        band.priority: _band_policy(band, default, resolve)
        for band in spec.priority_bands
        if band.priority is not None
    }
    ttl = spec.default_request_ttl
    settings = FlowControlSettings(
        default_band=default,
        bands=bands,
        max_requests=spec.max_requests,
        max_bytes=spec.max_bytes,
        default_ttl_s=ttl if ttl else None,
    )
    enabled = config is not None and FEATURE_GATE in config.feature_gates
    return FlowControlSetup(enabled, detector, usage, settings)


def _band_policy(spec: PriorityBandSpec, base: BandPolicy | None, resolve: _Resolver) -> BandPolicy:
    limits = BandLimits(
        max_requests=spec.max_requests
        if spec.max_requests is not None
        else (base.limits.max_requests if base else None),
        max_bytes=spec.max_bytes
        if spec.max_bytes is not None
        else (base.limits.max_bytes if base else BandLimits().max_bytes),
    )
    ordering = (
        resolve.get(spec.ordering_policy_ref, OrderingPolicy, "orderingPolicyRef")
        if spec.ordering_policy_ref
        else base.ordering
        if base
        else resolve.get(DEFAULT_ORDERING, OrderingPolicy, "orderingPolicyRef")
    )
    fairness = (
        resolve.get(spec.fairness_policy_ref, FairnessPolicy, "fairnessPolicyRef")
        if spec.fairness_policy_ref
        else base.fairness
        if base
        else resolve.get(DEFAULT_FAIRNESS, FairnessPolicy, "fairnessPolicyRef")
    )
    return BandPolicy(limits, ordering, fairness)
