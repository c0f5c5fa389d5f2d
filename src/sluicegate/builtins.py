"""The one place sluicegate's built-in plugins are registered.

:func:`default_registry` is what the hosts (the standalone gateway, the Envoy endpoint
picker, the benchmark lab) build schedulers and flow control from: every built-in
scheduling plugin and flow-control policy, plus the plugins installed distributions declare
under the ``sluicegate.plugins`` entry-point group (see
:mod:`sluicegate.framework.registry` and docs/plugins.md, "Writing a plugin").
"""

from __future__ import annotations

from sluicegate.flowcontrol.policies.fairness import GlobalStrictFairness, RoundRobinFairness
from sluicegate.flowcontrol.policies.ordering import EdfOrdering, FcfsOrdering, SloDeadlineOrdering
from sluicegate.flowcontrol.policies.saturation import ConcurrencyDetector, UtilizationDetector
from sluicegate.flowcontrol.policies.usage_limit import (
    PriorityHoldbackPolicy,
    StaticUsageLimitPolicy,
)
from sluicegate.framework import Plugin, PluginRegistry
from sluicegate.scheduling.plugins.active_request_scorer import ActiveRequestScorer
from sluicegate.scheduling.plugins.cost_aware_scorer import CostAwareScorer
from sluicegate.scheduling.plugins.decision_tree_filter import DecisionTreeFilter
from sluicegate.scheduling.plugins.kv_cache_utilization_scorer import KVCacheUtilizationScorer
from sluicegate.scheduling.plugins.latency_scorer import LatencyScorer
from sluicegate.scheduling.plugins.latency_slo_admitter import LatencySloAdmitter
from sluicegate.scheduling.plugins.least_request_picker import LeastRequestPicker
from sluicegate.scheduling.plugins.load_aware_scorer import LoadAwareScorer
from sluicegate.scheduling.plugins.load_threshold_filter import LoadThresholdFilter
from sluicegate.scheduling.plugins.lora_affinity_scorer import LoraAffinityScorer
from sluicegate.scheduling.plugins.lora_soft_affinity_filter import LoraSoftAffinityFilter
from sluicegate.scheduling.plugins.low_band_filter import LowBandFilter
from sluicegate.scheduling.plugins.max_score_picker import MaxScorePicker
from sluicegate.scheduling.plugins.precise_prefix_cache import PrecisePrefixCacheProducer
from sluicegate.scheduling.plugins.predicted_latency import PredictedLatencyProducer
from sluicegate.scheduling.plugins.prefix_affinity_filter import PrefixCacheAffinityFilter
from sluicegate.scheduling.plugins.prefix_cache import ApproxPrefixCacheProducer, PrefixCacheScorer
from sluicegate.scheduling.plugins.queue_scorer import QueueScorer
from sluicegate.scheduling.plugins.random_picker import RandomPicker
from sluicegate.scheduling.plugins.request_priority_filter import RequestPriorityFilter
from sluicegate.scheduling.plugins.round_robin_picker import RoundRobinPicker
from sluicegate.scheduling.plugins.running_requests_scorer import RunningRequestsSizeScorer
from sluicegate.scheduling.plugins.session_affinity_scorer import SessionAffinityScorer
from sluicegate.scheduling.plugins.single_profile_handler import SingleProfileHandler
from sluicegate.scheduling.plugins.slo_headroom_tier_filter import SloHeadroomTierFilter
from sluicegate.scheduling.plugins.token_load_scorer import TokenLoadScorer
from sluicegate.scheduling.plugins.weighted_random_picker import WeightedRandomPicker

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    # scheduling: producers, filters, scorers, pickers, profile handlers, admitters
    ApproxPrefixCacheProducer,
    PrecisePrefixCacheProducer,
    PredictedLatencyProducer,
    PrefixCacheAffinityFilter,
    SloHeadroomTierFilter,
    RequestPriorityFilter,
    LoadThresholdFilter,
    LowBandFilter,
    LoraSoftAffinityFilter,
    DecisionTreeFilter,
    ActiveRequestScorer,
    CostAwareScorer,
    KVCacheUtilizationScorer,
    LatencyScorer,
    LoadAwareScorer,
    LoraAffinityScorer,
    PrefixCacheScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    SessionAffinityScorer,
    TokenLoadScorer,
    LeastRequestPicker,
    MaxScorePicker,
    RandomPicker,
    RoundRobinPicker,
    WeightedRandomPicker,
    SingleProfileHandler,
    LatencySloAdmitter,
    # flow control: saturation detectors, usage limits, fairness and ordering policies
    UtilizationDetector,
    ConcurrencyDetector,
    StaticUsageLimitPolicy,
    PriorityHoldbackPolicy,
    GlobalStrictFairness,
    RoundRobinFairness,
    FcfsOrdering,
    EdfOrdering,
    SloDeadlineOrdering,
)


def default_registry(entry_points: bool = True) -> PluginRegistry:
    """A registry of every built-in plugin and, with ``entry_points``, every plugin that
    installed distributions declare (a name clash with a built-in is logged and skipped)."""
    registry = PluginRegistry(BUILTIN_PLUGINS)
    if entry_points:
        registry.load_entry_points()
    return registry


__all__ = ["BUILTIN_PLUGINS", "default_registry"]
