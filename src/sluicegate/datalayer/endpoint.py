"""Endpoints and what the gateway knows about each of them.

An :class:`Endpoint` is one model-server rank at ``host:port``. Its state has three
sources, kept apart so each can be reasoned about:

- :class:`EngineMetrics`: the last successful scrape of the server's ``/metrics``
  (immutable; replaced whole by each scrape, stamped with the clock time it was taken);
- :class:`ServedModels`: the base model and LoRA adapters the server lists in ``/v1/models``;
- :class:`InFlight`: the requests and tokens this gateway dispatched to it and that have
  not finished, updated synchronously on every dispatch and completion, so load is visible
  between scrapes and a burst is never sent to one endpoint because its last scrape looked
  idle;
- :class:`PeerLoad`: the same counts of the other gateway replicas, when they share state
  (``sharedState`` in the GatewayConfig; zero otherwise), summed into the load estimates.

Health (scrape failures, request failures and the ejections they cause) lives here too:
:class:`Health`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Hardware:
    """What an endpoint runs on, for routing that knows a mixed pool.

    Set by discovery (configuration, Kubernetes labels) and kept for the endpoint's life;
    every field is optional, and an endpoint with none set is of the pool's one unnamed
    class.
    """

    accelerator: str | None = None
    """Hardware class, lower-case, e.g. ``h100-80gb``, ``a100-80gb``; None when unknown."""
    cost_per_hour: float | None = None
    """What the endpoint costs to run, in the operator's currency per hour; None when
    unknown."""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape of a model server's metrics. Times are clock seconds."""

    scraped_at: float
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    """KV-cache usage, 0..1."""
    running_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_loras: int = 0
    """LoRA adapters per batch; 0 when the server does not report LoRA."""
    block_size: int | None = None
    """KV block size in tokens, from ``cache_config_info``."""
    num_gpu_blocks: int | None = None
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    generation_tokens: float | None = None
    """The server's running total of generated tokens (vLLM's
    ``vllm:generation_tokens_total``); None when its engine type does not report one. The
    gateway compares it between scrapes to catch a ``/metrics`` that stopped moving."""


@dataclass(frozen=True, slots=True)
class ServedModels:
    """Models a server answers for, from ``/v1/models``."""

    base_models: frozenset[str] = frozenset()
    adapters: frozenset[str] = frozenset()
    fetched_at: float = -1.0
    entries: tuple[Mapping[str, object], ...] = field(default=(), compare=False)
    """The list's entries as the server wrote them (``id``, ``owned_by``, ``root``,
    ``parent``, ``max_model_len``...), for the gateway's own ``/v1/models``; bounded by
    the collector (``parse_models``)."""

    def serves(self, model: str) -> bool:
        return model in self.base_models or model in self.adapters

    @property
    def known(self) -> bool:
        return self.fetched_at >= 0


SAME_ITERATION_S = 0.0005
"""Tokens relayed within 0.5 ms of each other are taken as one engine iteration's (an
iteration takes milliseconds; its chunks reach the gateway microseconds apart)."""


@dataclass(slots=True)
class InFlight:
    """Work this gateway dispatched to an endpoint and that has not finished.

    ``prompt_tokens`` counts uncached prompt tokens still to prefill (released at the first
    response byte); ``decode_tokens`` the expected output tokens of running requests
    (released at completion). ``*_since_scrape`` count what was dispatched after the last
    metrics scrape and reset when a new one arrives; ``token_check`` is what a scrape's
    token counter must exceed (see :meth:`relayed`). ``last_token_at`` and
    ``token_interval_s`` time the endpoint's iterations from the tokens relayed (see
    :meth:`token`); they are not compared.
    """

    requests: int = 0
    prompt_tokens: int = 0
    decode_tokens: int = 0
    requests_since_scrape: int = 0
    prompt_tokens_since_scrape: int = 0
    token_check: float | None = field(default=None, compare=False)
    """The generated-token counter (``EngineMetrics.generation_tokens``) a scrape sent from
    now on must show more than, since this gateway relayed tokens of a request dispatched
    when the endpoint's last scrape showed this count; None when no relayed answer awaits
    a scrape (see :meth:`relayed` and ``datalayer.collector``)."""
    prompt_tokens_before_last_token: int = 0
    """Prompt tokens (cached or not) of requests dispatched before the first token of the
    endpoint's last burst and not answered yet: prefills in the iteration in progress, or
    still queued."""
    prompt_tokens_after_last_token: int = 0
    """Prompt tokens of requests dispatched since: they join its next iteration."""
    token_epoch: int = field(default=0, compare=False)
    """Token bursts (iterations) seen so far: :meth:`prefill_queued` returns it and
    :meth:`prefill_done` takes it back, to know which of the two counts a request is in."""
    last_token_at: float | None = field(default=None, compare=False)
    """Clock time (s) the endpoint last produced a token this gateway relayed."""
    token_interval_s: float = field(default=0.0, compare=False)
    """Seconds between the last two distinct moments it produced tokens: its iteration
    time while it streams (0 until known)."""

    def token(self, now: float) -> None:
        """A token of any request left the endpoint at ``now`` (clock s): a first byte or
        a streamed chunk. An engine emits the tokens of one iteration together, so a chunk
        within :data:`SAME_ITERATION_S` of the previous one belongs to the same burst: the
        burst's end moves on with it (many streams' chunks of one iteration reach the
        gateway spread over more than that), and the interval is measured from it."""
        last = self.last_token_at
        self.last_token_at = now
        if last is not None and now - last < SAME_ITERATION_S:
            return  # the same burst: the next iteration began at its first chunk
        if last is not None:
            self.token_interval_s = now - last
        # A new iteration began: what was dispatched until now was there for it.
        self.token_epoch += 1
        self.prompt_tokens_before_last_token += self.prompt_tokens_after_last_token
        self.prompt_tokens_after_last_token = 0

    def relayed(self, counter_at_dispatch: float | None) -> None:
        """Tokens of a successful answer (a first byte or a streamed chunk) were relayed
        from the endpoint, for a request dispatched when its last scrape's token counter
        read ``counter_at_dispatch`` (None: unknown). They were generated after that
        scrape, so any scrape sent from now on counts them, unless its ``/metrics`` is
        frozen. (A scrape sent before the relay may already count them: the counter
        moves as tokens are generated, before they are sent. Comparing with the last
        scrape instead judged an endpoint frozen whenever a scrape fell between its last
        answer's final token and the relay of that answer and it then went idle.)"""
        if counter_at_dispatch is None:
            return
        if self.token_check is None or counter_at_dispatch > self.token_check:
            self.token_check = counter_at_dispatch

    def dispatch(self, prompt_tokens: int, decode_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.decode_tokens += decode_tokens
        self.requests_since_scrape += 1
        self.prompt_tokens_since_scrape += prompt_tokens

    def prefill_queued(self, prompt_tokens: int) -> int:
        """A request with ``prompt_tokens`` was dispatched; returns the token epoch to hand
        back to :meth:`prefill_done`."""
        self.prompt_tokens_after_last_token += prompt_tokens
        return self.token_epoch

    def prefill_done(self, prompt_tokens: int, epoch: int) -> None:
        """The request queued at ``epoch`` was answered (or left before it was)."""
        if epoch == self.token_epoch:
            left = self.prompt_tokens_after_last_token - prompt_tokens
            self.prompt_tokens_after_last_token = max(0, left)
        else:
            left = self.prompt_tokens_before_last_token - prompt_tokens
            self.prompt_tokens_before_last_token = max(0, left)

    def first_token(self, prompt_tokens: int) -> None:
        self.prompt_tokens = max(0, self.prompt_tokens - prompt_tokens)

    def complete(self, prompt_tokens_left: int, decode_tokens: int) -> None:
        self.requests = max(0, self.requests - 1)
        self.prompt_tokens = max(0, self.prompt_tokens - prompt_tokens_left)
        self.decode_tokens = max(0, self.decode_tokens - decode_tokens)

    def scraped(self) -> None:
        self.requests_since_scrape = 0
        self.prompt_tokens_since_scrape = 0


@dataclass(slots=True)
class PeerLoad:
    """What the *other* gateway replicas dispatched to an endpoint and have not seen finish,
    summed over the replicas whose lease is alive (see ``docs/replicas.md``).

    Written whole by the shared-state synchroniser every ``inflightSyncMs``; all zero when
    sharing is off or the store is unreachable (each replica then falls back to its own
    counts). Never includes this replica's own :class:`InFlight`."""

    requests: int = 0
    prompt_tokens: int = 0
    """Uncached prompt tokens still to prefill."""
    decode_tokens: int = 0
    """Expected output tokens of running requests."""


@dataclass(slots=True)
class Health:
    """Whether an endpoint may take requests, and why not.

    Two independent sources take an endpoint out (``ejected``), each with its own count,
    so one cannot clear the other's:

    - scrapes (:class:`~sluicegate.datalayer.collector.Collector`): ``consecutive_failures``
      failed scrapes in a row set ``scrape_ejected``; the next successful scrape clears it;
    - requests (:class:`~sluicegate.datalayer.outlier.OutlierDetector`): failed answers
      set ``ejected_until`` (a clock time, s); only successful *requests* reset the
      request counts, and the ejection ends when its time is up (see that module).

    ``ejected`` is their union, kept in step by both (call :meth:`sync`); it is a plain
    attribute because the scheduler reads it for every candidate of every request.
    """

    consecutive_failures: int = 0
    """Failed scrapes in a row (a successful scrape resets it)."""
    scrape_ejected: bool = False
    ejected: bool = False
    last_error: str = ""
    consecutive_5xx: int = 0
    """Answers in a row that counted as server errors (see ``outlier.classify_status``),
    gateway failures included."""
    consecutive_gateway_failures: int = 0
    """Attempts in a row that failed without a usable answer: connect errors, resets or
    drops (before or after the first byte), first-byte timeouts."""
    interval_successes: int = 0
    """Successful requests since the last success-rate evaluation."""
    interval_failures: int = 0
    """Failed requests (5xx or gateway failures) since the last evaluation."""
    ejected_until: float | None = None
    """Clock time (s) the current request-failure ejection ends; None when not ejected."""
    ejection_reason: str = ""
    times_ejected: int = 0
    """Back-off multiplier: ejections so far, less one per healthy interval."""
    on_probation: bool = False
    """Back from an ejection and no successful request since: one failure re-ejects."""
    metrics_frozen_at: float | None = None
    """Clock time (s) the endpoint's ``/metrics`` was found frozen (its token counter
    stood still while this gateway relayed its tokens); None while it moves. A frozen
    endpoint's scrapes keep the timestamp of its last believable one, so it is stale."""

    progress_at: float | None = None
    """Clock time (s) since which the endpoint has shown no progress while this gateway had
    requests in flight there; None while it had none (see ``datalayer.stall``)."""
    progress_counter: float | None = None
    """Its generated-token counter at the last stall check."""
    progress_scraped_at: float | None = None
    """When the scrape the last stall check saw was taken (clock s): a check that finds
    no newer one judges nothing."""

    def sync(self) -> None:
        """Recompute ``ejected`` from its two sources."""
        self.ejected = self.scrape_ejected or self.ejected_until is not None


@dataclass(slots=True, eq=False)
class Endpoint:
    """One model-server rank the gateway can send requests to."""

    name: str
    host: str
    port: int
    pool: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    engine_type: str = "vllm"
    scheme: str = "http"
    metrics: EngineMetrics | None = None
    models: ServedModels = field(default_factory=ServedModels)
    inflight: InFlight = field(default_factory=InFlight)
    peers: PeerLoad = field(default_factory=PeerLoad)
    """The other gateway replicas' in-flight counts here (zero without shared state)."""
    health: Health = field(default_factory=Health)
    hardware: Hardware = field(default_factory=Hardware)
    """Its hardware class and cost, from discovery."""
    index: int = 0
    """Position in its pool, stable for the endpoint's life (used by index-based plugins)."""

    @property
    def address(self) -> str:
        """``host:port`` as the endpoint-picker protocol names endpoints."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    def is_stale(self, now: float, staleness_s: float) -> bool:
        """True when there is no scrape or the last one is older than ``staleness_s``."""
        m = self.metrics
        return m is None or now - m.scraped_at > staleness_s

    # Load estimates combine the last scrape with the gateways' own accounting (this
    # replica's and, with shared state, the other replicas'). They never report less load
    # than the gateways themselves have put on the endpoint.

    @property
    def dispatched_requests(self) -> int:
        """Requests in flight here from this replica and its peers."""
        return self.inflight.requests + self.peers.requests

    @property
    def dispatched_tokens(self) -> int:
        """Prompt tokens to prefill plus expected decode tokens in flight here, from this
        replica and its peers."""
        i, p = self.inflight, self.peers
        return i.prompt_tokens + i.decode_tokens + p.prompt_tokens + p.decode_tokens

    @property
    def waiting(self) -> int:
        """Waiting requests: the scrape's count, or what the in-flight counts imply."""
        m = self.metrics
        requests = self.inflight.requests + self.peers.requests
        if m is None:
            return requests  # never scraped: assume all of it waits
        return max(m.waiting, requests - m.running)

    @property
    def running(self) -> int:
        """Running requests: the scrape's count, or what the in-flight counts imply."""
        m = self.metrics
        requests = self.inflight.requests + self.peers.requests
        if m is None:
            return requests
        return max(m.running, requests - m.waiting)

    def kv_usage(self, capacity_tokens: int | None = None) -> float:
        """KV usage 0..1: the scrape plus prompt tokens dispatched since it, when the
        capacity in tokens is known; 1.0 when the endpoint has never been scraped."""
        m = self.metrics
        if m is None:
            return 1.0
        usage = m.kv_usage
        cap = capacity_tokens or self.kv_capacity_tokens
        if cap:
            usage += self.inflight.prompt_tokens_since_scrape / cap
        return min(1.0, usage)

    @property
    def kv_capacity_tokens(self) -> int | None:
        m = self.metrics
        if m is None or not m.block_size or not m.num_gpu_blocks:
            return None
        return m.block_size * m.num_gpu_blocks
