"""The scheduling framework's interfaces.

One scheduling cycle picks endpoints for one request:

    ProfileHandler chooses profiles to run → each profile runs
        Filters   (drop endpoints that must not serve the request)
        Scorers   (each returns a score in [0, 1] per endpoint; combined as Σ weight·score)
        Picker    (chooses the endpoint(s) from the scores)
    → ProfileHandler names the primary profile, whose first endpoint gets the request.

Before the cycle, DataProducers compute per-request data that plugins share through the
:class:`CycleState` (for example the prefix-cache match of every endpoint); after it,
PreRequest hooks learn the decision (for example to record the prompt as cached on the
chosen endpoint). Plugins never do I/O and never read the wall clock: they get time and
randomness from the :class:`PluginContext` they were built with.

Each built-in plugin type is one module under ``scheduling/plugins/`` whose docstring
states its inputs, parameters with defaults, and formula; plugins import only this
framework layer (and the data layer's :class:`~sluicegate.datalayer.endpoint.Endpoint`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework.plugin import Plugin, PluginParameters

T = TypeVar("T")


class StateKey(Generic[T]):
    """A typed key for data shared between plugins during one request."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class CycleState:
    """Per-request data produced and consumed by plugins."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[StateKey[Any], Any] = {}

    def get(self, key: StateKey[T]) -> T | None:
        value: T | None = self._data.get(key)
        return value

    def put(self, key: StateKey[T], value: T) -> None:
        self._data[key] = value

    def discard(self, key: StateKey[Any]) -> None:
        """Forget ``key`` (nothing happens when it is not set)."""
        self._data.pop(key, None)


RESPONSE_HEADERS: StateKey[dict[str, str]] = StateKey("response-headers")
"""Headers plugins want added to the client's response (e.g. a session token)."""
PREFETCH_PASS: StateKey[bool] = StateKey("prefetch-pass")
"""Set while the host runs the producers ahead of the prefetch (their output then feeds
the fetchers only; the pass in ``submit`` is the one that counts)."""
"""Headers plugins want added to the client's response (e.g. a session token)."""


@dataclass(slots=True)
class LLMRequest:
    """What scheduling knows about one request. Token counts are built-in tokens."""

    request_id: str
    model: str
    """Model name the client asked for."""
    target_model: str
    """Model or LoRA adapter the request is sent to (after InferenceModel resolution)."""
    prompt: bytes
    """Prompt text used for prefix affinity: the prompt, or the serialised messages."""
    prompt_tokens: int
    arrival: float
    """Clock time (s) the gateway received the request."""
    max_tokens: int | None = None
    stream: bool = False
    is_adapter: bool = False
    """True when ``target_model`` is a LoRA adapter rather than a base model."""
    priority: int = 0
    """Objective priority; negative means sheddable."""
    fairness_id: str = "default-flow"
    objective: str | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    cache_salt: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Request headers, lower-cased names."""
    body_bytes: int = 0
    model_label: str = ""
    """The ``model_name`` label of this request's metrics: ``model`` (the default), or a
    placeholder when ``model`` is not a bounded name (see ``ModelTable.label``)."""
    prediction_based: bool = True
    """Whether the predicted-latency plugins may schedule it on latency predictions (the
    ``x-prediction-based-scheduling`` header, else the configured default)."""
    kind: str = ""
    """The route's kind: ``chat`` (``messages``), ``completions`` (``prompt``), ``other``
    (a passed-through route), or empty when not from a parsed body (the lab)."""
    body: Mapping[str, object] | None = None
    """The decoded JSON body, read-only (a model's tokenizer renders ``messages`` from
    it); None when not from a parsed body."""

    def __post_init__(self) -> None:
        if not self.model_label:
            self.model_label = self.model

    @property
    def sheddable(self) -> bool:
        return self.priority < 0

    @property
    def expected_output_tokens(self) -> int:
        """Output tokens to expect: ``max_tokens``, else 1.5 × the prompt (the default
        ``outputRatio`` of llm-d-router's ``inflight-load-producer``,
        https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/producer.go),
        capped at 4,096."""
        if self.max_tokens is not None:
            return self.max_tokens
        return min(4096, round(self.prompt_tokens * 1.5))


class DataProducer(Plugin):
    """Computes request data before scheduling and stores it in the cycle state."""

    @abc.abstractmethod
    def produce(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        """Compute data for ``request`` over the candidate ``endpoints``."""


class AsyncDataProducer(Plugin):
    """Fetches request data that needs I/O (e.g. remote predictions) before scheduling.

    The host awaits :meth:`prefetch` once per request, before admission; the plugin's
    synchronous ``produce`` then uses what was fetched, or falls back without it.
    """

    @property
    def fetches(self) -> bool:
        """Whether :meth:`prefetch` does anything here; when no fetcher does, the host
        skips the prefetch pass (and its extra run of the synchronous producers)."""
        return True

    def fetches_for(self, request: LLMRequest, pool: str) -> bool:
        """Whether :meth:`prefetch` does anything for ``request`` in ``pool`` (the host
        skips the prefetch pass when no fetcher does)."""
        return True

    @abc.abstractmethod
    async def prefetch(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        """Fetch data for ``request`` over ``endpoints``; must not raise and must be quick."""


class Filter(Plugin):
    """Removes endpoints that should not serve a request."""

    @abc.abstractmethod
    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        """The endpoints to keep, in their original order."""


class Scorer(Plugin):
    """Scores endpoints for a request; each score is in [0, 1], higher is better."""

    category: ClassVar[str] = "balance"
    """``affinity``, ``distribution`` or ``balance`` (informational)."""

    @abc.abstractmethod
    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        """One score per endpoint, aligned with ``endpoints``."""


@dataclass(slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float


class Picker(Plugin):
    """Chooses endpoints from scored candidates: the primary first, then fallbacks."""

    @abc.abstractmethod
    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        """At least one endpoint when ``scored`` is non-empty."""


class PickerParameters(PluginParameters):
    """The parameters every built-in picker takes."""

    max_num_of_endpoints: int = Field(1, ge=1)
    """Endpoints to return, best first; the extra ones are the proxy's first fallbacks."""


class PreRequest(Plugin):
    """Learns the scheduling decision before the request is sent."""

    @abc.abstractmethod
    def pre_request(self, request: LLMRequest, state: CycleState, result: SchedulingResult) -> None:
        """Called once per scheduled request."""


@dataclass(frozen=True, slots=True)
class ResponseOutcome:
    """How a request ended. Times are clock seconds."""

    endpoint: Endpoint
    """The endpoint that answered (after any retry)."""
    dispatched_at: float
    first_token_at: float | None
    finished_at: float
    output_tokens: int | None
    """Tokens generated, as the server reported them (or counted from the stream)."""
    ok: bool


class ResponseObserver(Plugin):
    """Learns how scheduled requests went: first byte and end (e.g. to train models)."""

    def on_first_token(
        self, request: LLMRequest, state: CycleState, endpoint: Endpoint, now: float
    ) -> None:
        """The first byte of the answer arrived at ``now`` (clock seconds)."""
        return

    @abc.abstractmethod
    def on_complete(self, request: LLMRequest, state: CycleState, outcome: ResponseOutcome) -> None:
        """The request is over."""


class Admitter(Plugin):
    """Decides whether a request may be served at all, after data producers ran."""

    @abc.abstractmethod
    def admit(self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]) -> None:
        """Raise :class:`sluicegate.errors.GatewayError` to refuse the request."""


class PrefixIndexer(Plugin):
    """A plugin that keeps a prefix index, reported as the prefix-indexer size metric."""

    @abc.abstractmethod
    def indexed_blocks(self) -> int:
        """Block hashes the index holds now, over all endpoints."""


class EndpointObserver(Plugin):
    """Learns when an endpoint leaves the pool, to drop state kept for it."""

    @abc.abstractmethod
    def forget_endpoint(self, endpoint: Endpoint) -> None:
        """``endpoint`` is gone; release whatever is held for it."""


@dataclass(slots=True)
class ProfileResult:
    """The endpoints one profile chose, best first."""

    targets: list[Endpoint]
    scores: dict[str, float] = field(default_factory=dict)
    """Combined score per endpoint name (for diagnostics)."""


@dataclass(slots=True)
class SchedulingResult:
    profile_results: dict[str, ProfileResult]
    primary_profile: str

    @property
    def targets(self) -> list[Endpoint]:
        """The primary profile's endpoints: the destination first, then fallbacks."""
        return self.profile_results[self.primary_profile].targets


class ProfileHandler(Plugin):
    """Decides which profiles run for a request and which result is primary."""

    @abc.abstractmethod
    def pick_profiles(
        self,
        request: LLMRequest,
        state: CycleState,
        profiles: Mapping[str, SchedulerProfileLike],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        """Names of the profiles to run next; an empty list ends the cycle."""

    @abc.abstractmethod
    def process_results(
        self, request: LLMRequest, state: CycleState, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        """Combine the profiles' results; raise :class:`SchedulingError` if none is usable."""


class SchedulerProfileLike(abc.ABC):
    """What a profile handler may see of a profile."""

    name: str


class SchedulingError(Exception):
    """No endpoint can take the request (every candidate was filtered out)."""


__all__ = [
    "PREFETCH_PASS",
    "RESPONSE_HEADERS",
    "Admitter",
    "AsyncDataProducer",
    "CycleState",
    "DataProducer",
    "EndpointObserver",
    "Filter",
    "LLMRequest",
    "Picker",
    "PickerParameters",
    "PreRequest",
    "PrefixIndexer",
    "ProfileHandler",
    "ProfileResult",
    "ResponseObserver",
    "ResponseOutcome",
    "SchedulerProfileLike",
    "SchedulingError",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
    "StateKey",
]
