"""The framework layer: what plugins and hosts build on, and nothing they build.

- plugins: :class:`Plugin`, :class:`PluginParameters`, :class:`PluginContext`,
  :class:`PluginRegistry` (type names → classes; built-ins and entry points are registered
  by :func:`sluicegate.builtins.default_registry`);
- scheduling: :class:`LLMRequest`, :class:`CycleState` and :class:`StateKey`, and the plugin
  kinds of one scheduling cycle (:class:`DataProducer`, :class:`Filter`, :class:`Scorer`,
  :class:`Picker`, :class:`ProfileHandler`, ...);
- flow control: :class:`QueueItem`, :class:`FlowQueue`, :class:`Band` and the policy kinds
  (:class:`SaturationDetector`, :class:`UsageLimitPolicy`, :class:`FairnessPolicy`,
  :class:`OrderingPolicy`);
- shared state: the keys and value types several plugins or the host read
  (:data:`PREFIX_MATCH`, :data:`PREDICTIONS`, :data:`PREDICTION_OUTCOME`, ...).

It imports nothing of the plugins, the flow controller or the hosts (a test checks).
"""

from sluicegate.framework.flowcontrol import (
    FairnessPolicy,
    OrderingPolicy,
    SaturationDetector,
    UsageLimitPolicy,
)
from sluicegate.framework.plugin import Plugin, PluginConfigError, PluginContext, PluginParameters
from sluicegate.framework.queues import Band, BandLimits, FlowQueue, ItemState, QueueItem
from sluicegate.framework.registry import ENTRY_POINT_GROUP, PluginRegistry
from sluicegate.framework.scheduling import (
    PREFETCH_PASS,
    RESPONSE_HEADERS,
    Admitter,
    AsyncDataProducer,
    CycleState,
    DataProducer,
    EndpointObserver,
    Filter,
    LLMRequest,
    Picker,
    PickerParameters,
    PrefixIndexer,
    PreRequest,
    ProfileHandler,
    ProfileResult,
    ResponseObserver,
    ResponseOutcome,
    SchedulerProfileLike,
    SchedulingError,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
    StateKey,
)
from sluicegate.framework.state import (
    PREDICTION_OUTCOME,
    PREDICTIONS,
    PREDICTOR_SERVICE,
    PREFIX_MATCH,
    PREFIX_PRODUCER_TYPE,
    EndpointPrediction,
    PredictionOutcome,
    PredictionStatus,
    PrefixMatch,
    ReuseDistances,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "PREDICTIONS",
    "PREDICTION_OUTCOME",
    "PREDICTOR_SERVICE",
    "PREFETCH_PASS",
    "PREFIX_MATCH",
    "PREFIX_PRODUCER_TYPE",
    "RESPONSE_HEADERS",
    "Admitter",
    "AsyncDataProducer",
    "Band",
    "BandLimits",
    "CycleState",
    "DataProducer",
    "EndpointObserver",
    "EndpointPrediction",
    "FairnessPolicy",
    "Filter",
    "FlowQueue",
    "ItemState",
    "LLMRequest",
    "OrderingPolicy",
    "Picker",
    "PickerParameters",
    "Plugin",
    "PluginConfigError",
    "PluginContext",
    "PluginParameters",
    "PluginRegistry",
    "PreRequest",
    "PredictionOutcome",
    "PredictionStatus",
    "PrefixIndexer",
    "PrefixMatch",
    "ProfileHandler",
    "ProfileResult",
    "QueueItem",
    "ResponseObserver",
    "ResponseOutcome",
    "ReuseDistances",
    "SaturationDetector",
    "SchedulerProfileLike",
    "SchedulingError",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
    "StateKey",
    "UsageLimitPolicy",
]
