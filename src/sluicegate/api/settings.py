"""``GatewayConfig`` (``sluicegate.dev/v1alpha1``): the settings of the standalone gateway
and of the endpoint picker beyond what the Gateway API Inference Extension's resources say —
the latency predictor, outlier detection, client limits, keys and trust. Durations in ms."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sluicegate.api.base import Model, ObjectMeta
from sluicegate.api.hardware import AcceleratorClass, ClassKeyed
from sluicegate.api.keys import check_keys
from sluicegate.api.units import Bytes


class LatencyPredictorSettings(Model):
    """Where the predicted-latency plugins get TTFT/TPOT predictions. Durations in ms.

    Without ``predictionUrls`` the models are trained and evaluated in the picker's own
    process, on its own traffic. With them, predictions come from prediction servers and
    samples go to ``trainingUrl`` (``sluicegate predictor`` servers, or any server speaking
    the reference predictor's HTTP API). The environment variables ``PREDICTION_SERVER_URL``
    (comma-separated) and ``TRAINING_SERVER_URL`` fill both when the file leaves them out,
    as the reference endpoint picker reads them (llm-d-router,
    https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/latencypredictorclient/types.go).
    """

    prediction_urls: list[str] = Field(default_factory=list)
    training_url: str | None = None
    timeout_ms: Annotated[float, Field(gt=0)] = 100.0
    """How long a remote prediction may take before the request is scheduled without it."""
    retrain_interval_ms: Annotated[float, Field(gt=0)] = 10_000.0
    min_samples: Annotated[int, Field(ge=1)] = 100
    """Samples needed before the first in-process training."""
    model_dir: str | None = None
    """Where in-process models are saved after each training and loaded at start."""
    objective: Literal["quantile", "mean"] = "quantile"
    quantile: Annotated[float, Field(gt=0, lt=1)] = 0.9
    """The latency quantile predicted with the quantile objective (0.9: p90)."""
    online_calibration: bool = True
    """With the quantile objective: rescale predictions online so that, on the requests
    actually routed, the share ``quantile`` of outcomes stays at or below them (routing to
    the lowest prediction otherwise makes them optimistic near saturation)."""
    class_speeds: Annotated[
        dict[AcceleratorClass, Annotated[float, Field(gt=0, allow_inf_nan=False)]], ClassKeyed
    ] = Field(default_factory=dict, max_length=64)
    """Relative speed per hardware class (e.g. ``{h100-80gb: 3, a100-80gb: 1}``; higher is
    faster). Keys are normalized like an endpoint's ``accelerator``
    (``NVIDIA-H100-80GB-HBM3`` → ``h100-80gb``); one entry per class. A class without a
    model of its own borrows the model of the trained class of closest speed, scaled by the
    speed ratio, until its own samples measure the ratio (``sluicegate.latency.hardware``).
    Empty: no configured ratios."""
    prediction_based_scheduling_default: bool = True
    """Whether a request without an ``x-prediction-based-scheduling`` header is scheduled
    on predictions (true) or on the predicted-latency plugins' heuristic fallback (false).
    Applied on reload. The header is GIE v1.2.0's:
    https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v1.2.0/pkg/epp/scheduling/framework/plugins/profile/slo_aware_profile_handler.go"""


class OutlierDetectionSettings(Model):
    """Ejecting endpoints whose requests fail (``sluicegate.datalayer.outlier``, after
    Envoy's outlier detection). Durations in ms, shares in percent; a threshold of 0 turns
    its test off."""

    enabled: bool = True
    consecutive_5xx: Annotated[int, Field(ge=0)] = Field(5, alias="consecutive5xx")
    """Server errors in a row (5xx but 501, gateway failures included) that eject."""
    consecutive_gateway_failure: Annotated[int, Field(ge=0)] = 3
    """Attempts in a row without a usable answer (connect error, reset, first-byte
    timeout) that eject."""
    interval_ms: Annotated[float, Field(gt=0)] = 10_000.0
    """How often the success-rate and failure-percentage tests run."""
    base_ejection_time_ms: Annotated[float, Field(gt=0)] = 30_000.0
    """An ejection lasts this times the endpoint's ejection count."""
    max_ejection_time_ms: Annotated[float, Field(gt=0)] = 300_000.0
    max_ejection_percent: Annotated[float, Field(ge=0, le=100)] = 50.0
    """Most of a pool ejected at once (at least one endpoint may go; never the last)."""
    success_rate_minimum_hosts: Annotated[int, Field(ge=0)] = 5
    success_rate_request_volume: Annotated[int, Field(ge=1)] = 20
    success_rate_stdev_factor: Annotated[float, Field(gt=0)] = 1.9
    failure_percentage_threshold: Annotated[float, Field(ge=0, le=100)] = 50.0
    failure_percentage_minimum_hosts: Annotated[int, Field(ge=1)] = 2
    failure_percentage_request_volume: Annotated[int, Field(ge=1)] = 20
    stall_timeout_ms: Annotated[float, Field(ge=0)] = 30_000.0
    """An endpoint with requests in flight and no progress (no byte relayed, its token
    counter still) for this long is stalled: ejected, its requests retried elsewhere
    (``sluicegate.datalayer.stall``). 0: off."""


class RedisSettings(Model):
    """The Redis server the replicas share state through. Durations in ms."""

    model_config = ConfigDict(hide_input_in_errors=True)

    url: SecretStr
    """``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``). It may carry a
    password: it is never logged or echoed in errors (logs name host, port and db only)."""
    key_prefix: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")] = "sluicegate"
    """Every key and stream this gateway uses starts with it; replicas that should share
    state use the same prefix (and the same Redis database)."""
    timeout_ms: Annotated[float, Field(gt=0)] = 100.0
    """The longest any Redis operation may take (connect included); past it the replica
    falls back to its local state until Redis answers again."""

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: SecretStr) -> SecretStr:
        problem = redis_url_problem(url.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return url


def redis_url_problem(url: str) -> str | None:
    """Why the client could not connect to ``url``, or None. The reason never quotes the
    URL or any part of it: it may hold a password (``redis://:sec#ret@host`` reads as
    port ``sec`` to the client, which would put the password into its error)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises when what follows the host is not a number
        host = parts.hostname
    except ValueError:
        return (
            "is not a valid URL (a port that is not a number, or unbalanced [ ] around an "
            "IPv6 address; percent-encode # / ? @ : in a password)"
        )
    if parts.scheme in ("redis", "rediss"):
        if not host:
            return "names no host"
        if port == 0:
            return "port must be 1-65535"
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            return "path must be a database number (redis://host:port/0)"
        return None
    if parts.scheme == "unix":
        return None if parts.path else "names no socket path (unix:///path/to/redis.sock)"
    return "must start with redis://, rediss:// or unix://"


def redacted_url(url: str) -> str:
    """``url`` without its user name and password: what logs may show. Never raises (a
    URL it cannot read becomes its scheme and ``…``); IPv6 hosts keep their brackets."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        return f"{scheme}://…" if scheme.isalnum() else "…"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path}"


class SharedStateSettings(Model):
    """Routing state the gateway replicas share (``docs/replicas.md``). Durations in ms;
    fixed at start (a reload that changes them is reported and applied at the next start)."""

    model_config = ConfigDict(hide_input_in_errors=True)

    redis: RedisSettings
    replica_id: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """This replica's name in the shared state; None: host name, process id and a random
    suffix (unique per start). Two processes given one id overwrite each other's counts:
    each logs a warning (once) when it sees the other's claim on the id."""
    prefix_index: bool = True
    """Share the approximate prefix index (every prefix producer's decisions)."""
    inflight: bool = True
    """Share in-flight counts per endpoint (summed into the load estimates)."""
    lease_ms: Annotated[float, Field(gt=0)] = 2000.0
    """How long a replica's published in-flight counts live without a refresh: a replica
    that dies (or loses Redis) stops counting within this, plus one sync interval of the
    readers."""
    inflight_sync_ms: Annotated[float, Field(gt=0)] = 25.0
    """How often each replica publishes its in-flight counts and reads the others'."""
    prefix_flush_ms: Annotated[float, Field(gt=0)] = 5.0
    """How long a prefix decision may wait before it is shipped to the other replicas (the
    batching window)."""
    prefix_stream_max_entries: Annotated[int, Field(ge=16)] = 4096
    """Batches the shared prefix stream keeps (approximately; each batch at most 64 KiB):
    what a replica that starts or reconnects replays, and the bound on Redis memory."""
    prefix_ttl_ms: Annotated[float, Field(gt=0)] = 600_000.0
    """Decisions older than this are not replayed, and the stream expires when no replica
    has written to it for this long."""
    retry_ms: Annotated[float, Field(gt=0)] = 1000.0
    """While Redis is unreachable, how often a replica tries again."""
    backlog: bool = True
    """Share flow control's waiting counts per pool and priority, and hold lower-priority
    requests for the other replicas' higher ones while the pool is saturated
    (``docs/flow-control.md#across-replicas``)."""
    backlog_sync_ms: Annotated[float, Field(gt=0)] = 25.0
    """How often each replica publishes its waiting counts and reads the others' (under
    the same ``leaseMs``)."""
    max_yield_ms: Annotated[float, Field(gt=0)] = 5000.0
    """How long a request holds for the other replicas' higher bands, at most, after it
    first held: then it goes anyway."""

    @model_validator(mode="after")
    def _lease_outlives_sync(self) -> SharedStateSettings:
        for name, every in (
            ("inflightSyncMs", self.inflight_sync_ms),
            ("backlogSyncMs", self.backlog_sync_ms),
        ):
            if self.lease_ms < 2 * every:
                raise ValueError(
                    f"leaseMs ({self.lease_ms}) must be at least twice {name} "
                    f"({every}): a live replica's counts would blink out"
                )
        return self


class GatewaySettings(Model):
    """Settings of the standalone gateway. Durations are in milliseconds."""

    # Errors never echo the input: it may hold API keys.
    model_config = ConfigDict(hide_input_in_errors=True)

    api_keys: list[str] = Field(default_factory=list)
    """Bearer tokens accepted from clients; empty = no authentication. Each must pass
    :func:`sluicegate.api.keys.key_problem` (RFC 6750 characters, at least 16 of them)."""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024
    scrape_interval_ms: Annotated[float, Field(gt=0)] = 50.0
    scrape_timeout_ms: Annotated[float, Field(gt=0)] = 1000.0
    metrics_staleness_ms: Annotated[float, Field(gt=0)] = 1000.0
    models_refresh_interval_ms: Annotated[float, Field(gt=0)] = 10_000.0
    eject_after_failures: Annotated[int, Field(ge=1)] = 3
    max_retries: Annotated[int, Field(ge=0)] = 2
    connect_timeout_ms: Annotated[float, Field(gt=0)] = 2000.0
    request_timeout_ms: Annotated[float, Field(gt=0)] = 600_000.0
    """The longest wait for any byte of an answer (each read, not the answer's total)."""
    first_byte_timeout_ms: Annotated[float, Field(gt=0)] | None = 30_000.0
    """How long a streamed answer's status and first chunk may take; past it the attempt
    counts as an endpoint failure and is retried elsewhere. None: ``requestTimeoutMs``."""
    non_streaming_first_byte_timeout_ms: Annotated[float, Field(gt=0)] | None = None
    """The same bound for non-streamed answers, whose first byte comes with the whole
    answer (so it bounds the generation). None: ``requestTimeoutMs``."""
    outlier_detection: OutlierDetectionSettings = Field(default_factory=OutlierDetectionSettings)
    latency_predictor: LatencyPredictorSettings = Field(default_factory=LatencyPredictorSettings)
    max_connections: Annotated[int, Field(ge=1)] = 4096
    """Client connections open at once; more are refused (fixed at start)."""
    max_buffered_body_bytes: Annotated[Bytes, Field(ge=1024)] = 256 * 1024 * 1024
    """Request-body bytes buffered across all client connections at once (fixed at start)."""
    body_timeout_ms: Annotated[float, Field(gt=0)] = 60_000.0
    """Longest a request body may take to arrive after its head (fixed at start)."""
    trust_control_headers: bool = False
    """Honour the routing-control headers (objective, model-name rewrite, destination
    hints) from every client; false: only from ``trustedApiKeys`` requests."""
    trusted_api_keys: list[str] = Field(default_factory=list)
    """Bearer tokens whose requests are trusted with the routing-control headers (they are
    accepted keys too)."""
    metrics_auth: bool = False
    """``/metrics`` needs an accepted API key (when keys are configured)."""
    metrics_names: Literal["gateway-api", "llm-d", "both"] = "gateway-api"
    """The names ``/metrics`` uses: the Gateway API Inference Extension's, llm-d-router's
    ``llm_d_epp_*``, or both (see docs/metrics.md)."""
    shared_state: SharedStateSettings | None = None
    """Share the approximate prefix index and in-flight counts with the other replicas
    through Redis (``docs/replicas.md``); None: this replica routes on its own state."""

    @model_validator(mode="after")
    def _buffer_holds_a_body(self) -> GatewaySettings:
        if self.max_buffered_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"maxBufferedBodyBytes ({self.max_buffered_body_bytes}) must be at least "
                f"maxBodyBytes ({self.max_body_bytes}): one largest body must fit"
            )
        return self

    @field_validator("api_keys", "trusted_api_keys")
    @classmethod
    def _api_keys(cls, keys: list[str], info: ValidationInfo) -> list[str]:
        # A bad key is refused (at start and on reload) rather than silently never
        # matching or, empty, matching a request without a key. The message names the
        # field and index, never the key.
        name = "apiKeys" if info.field_name == "api_keys" else "trustedApiKeys"
        if problems := check_keys(keys, name):
            raise ValueError("; ".join(problems))
        return keys


class GatewayConfig(Model):
    # As GatewaySettings: the input shown by str(ValidationError) is the outer model's.
    model_config = ConfigDict(hide_input_in_errors=True)

    api_version: str
    kind: Literal["GatewayConfig"]
    metadata: ObjectMeta | None = None
    spec: GatewaySettings = Field(default_factory=GatewaySettings)


__all__ = [
    "GatewayConfig",
    "GatewaySettings",
    "LatencyPredictorSettings",
    "OutlierDetectionSettings",
    "RedisSettings",
    "SharedStateSettings",
    "redacted_url",
    "redis_url_problem",
]
