"""Resource shapes users already write for the Gateway API Inference Extension.

Accepted kinds (the ``api/`` and ``apix/`` types of GIE — v0.5.1 for the v1alpha2 pool and
InferenceModel, 1748e829 otherwise — https://github.com/kubernetes-sigs/gateway-api-inference-extension):

- ``InferencePool`` — v1 (``inference.networking.k8s.io``: ``selector.matchLabels``,
  ``targetPorts``, ``endpointPickerRef``) and v1alpha2 (``inference.networking.x-k8s.io``:
  ``selector`` map, ``targetPortNumber``, ``extensionRef``). For use without Kubernetes a
  pool may list its servers in ``spec.endpoints`` (a sluicegate extension).
- ``InferenceModel`` v1alpha2 — ``modelName``, ``criticality``, weighted ``targetModels``.
- ``InferenceObjective`` v1alpha2 — ``priority`` (negative = sheddable).
- ``InferenceModelRewrite`` v1alpha2 — rules mapping a requested model name (``Exact``
  matches, or every name when a rule has no ``matches``) to weighted ``targets``
  (``modelRewrite``); GIE's ``apix/v1alpha2/inferencemodelrewrite_types.go`` at 1748e829.
- ``EndpointPickerConfig`` — ``plugins`` and ``schedulingProfiles`` (GIE and llm-d groups;
  its models in :mod:`sluicegate.api.picker`, re-exported here).
- ``GatewayConfig`` (``sluicegate.dev/v1alpha1``) — settings of the standalone gateway
  (its models in :mod:`sluicegate.api.settings`).

Every model validates strictly (unknown fields are errors) so a typo is reported, not
ignored; field names are the manifests' camelCase.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from sluicegate.api.base import Model, Resource
from sluicegate.api.hardware import AcceleratorClass, CostPerHour, PoolHardware

# Re-exported (``X as X``): the picker's models were defined here and are imported from here.
from sluicegate.api.picker import EndpointPickerConfig as EndpointPickerConfig
from sluicegate.api.picker import FlowControlSpec as FlowControlSpec
from sluicegate.api.picker import PluginRef as PluginRef
from sluicegate.api.picker import PluginSpec as PluginSpec
from sluicegate.api.picker import PriorityBandSpec as PriorityBandSpec
from sluicegate.api.picker import ProfilePluginRef as ProfilePluginRef
from sluicegate.api.picker import SchedulingProfileSpec as SchedulingProfileSpec
from sluicegate.api.settings import GatewayConfig
from sluicegate.api.tokenizer import TokenizerSettings

# ---------------------------------------------------------------------------- InferencePool


class PortNumber(Model):
    number: Annotated[int, Field(ge=1, le=65535)]


class EndpointPickerRef(Model):
    group: str = ""
    kind: str = "Service"
    name: str
    port: PortNumber | None = None
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


class ExtensionRef(Model):
    """v1alpha2 ``extensionRef``."""

    group: str = ""
    kind: str = "Service"
    name: str
    port_number: Annotated[int, Field(ge=1, le=65535)] | None = None
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


class LabelSelector(Model):
    match_labels: dict[str, str] = Field(default_factory=dict)


_KV_TEMPLATE_FIELDS = {"host": "10.0.0.1", "port": 8000, "name": "e"}


def _check_kv_template(value: str | None, field: str) -> str | None:
    """A ZeroMQ address template: ``tcp://`` or ``ipc://``, placeholders {host}, {port}
    (the endpoint's HTTP port) and {name} only."""
    if value is None:
        return None
    if not value.startswith(("tcp://", "ipc://")):
        raise ValueError(f"{field} must start with tcp:// or ipc://, got {value!r}")
    try:
        value.format(**_KV_TEMPLATE_FIELDS)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"{field} {value!r}: only the placeholders {{host}}, {{port}} and {{name}} are "
            f"known ({exc!r})"
        ) from None
    return value


class KVEventsOverride(Model):
    """One endpoint's changes to its pool's ``kvEvents`` (unset fields: the pool's)."""

    enabled: bool | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    replay_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    endpoint: str | None = None
    replay_endpoint: str | None = None
    topic: str | None = None
    capacity_blocks: Annotated[int, Field(ge=1)] | None = None

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _template(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _check_kv_template(value, to_camel(info.field_name or ""))


class KVEventsSettings(Model):
    """Where a pool's servers publish their KV-cache events (vLLM's ``--kv-events-config``)
    for precise prefix-cache routing; see docs/configuration.md#kvevents."""

    enabled: bool = True
    port: Annotated[int, Field(ge=1, le=65535)] = 5557
    """The PUB port on the endpoint's host (vLLM's default ``tcp://*:5557``)."""
    replay_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """The replay (ROUTER) port; None: no replay (vLLM's default), a gap drops the view."""
    endpoint: str | None = None
    """A PUB address template instead of ``port``, e.g. ``tcp://{host}:5557``."""
    replay_endpoint: str | None = None
    """A replay address template instead of ``replayPort``."""
    topic: str = ""
    """vLLM's ``topic`` (default empty: every message)."""
    capacity_blocks: Annotated[int, Field(ge=1)] | None = None
    """Index entries kept per endpoint; None: the server's ``num_gpu_blocks`` from its
    ``cache_config_info`` gauge plus ``capacityMarginPercent``, else 31,250."""
    capacity_margin_percent: Annotated[float, Field(ge=0, le=100)] = 10.0

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _template(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _check_kv_template(value, to_camel(info.field_name or ""))

    @model_validator(mode="after")
    def _one_address(self) -> KVEventsSettings:
        if self.endpoint is not None and "port" in self.model_fields_set:
            raise ValueError("kvEvents: give port or endpoint, not both")
        if self.replay_endpoint is not None and self.replay_port is not None:
            raise ValueError("kvEvents: give replayPort or replayEndpoint, not both")
        return self

    def merged(self, override: KVEventsOverride | None) -> KVEventsSettings:
        """These settings with an endpoint's override applied."""
        if override is None:
            return self
        changes = {k: getattr(override, k) for k in override.model_fields_set}
        if "endpoint" in changes and "port" not in changes:
            changes["port"] = 5557
        if "port" in changes and "endpoint" not in changes:
            changes["endpoint"] = None
        if "replay_endpoint" in changes and "replay_port" not in changes:
            changes["replay_port"] = None
        if "replay_port" in changes and "replay_endpoint" not in changes:
            changes["replay_endpoint"] = None
        return self.model_copy(update=changes)

    def addresses(self, host: str, port: int, name: str) -> tuple[str, str | None]:
        """The PUB and replay addresses for an endpoint at ``host`` (HTTP ``port``)."""
        bracketed = f"[{host}]" if ":" in host else host
        values = {"host": bracketed, "port": port, "name": name}
        pub = (
            self.endpoint.format(**values)
            if self.endpoint is not None
            else f"tcp://{bracketed}:{self.port}"
        )
        if self.replay_endpoint is not None:
            replay: str | None = self.replay_endpoint.format(**values)
        elif self.replay_port is not None:
            replay = f"tcp://{bracketed}:{self.replay_port}"
        else:
            replay = None
        return pub, replay


class StaticEndpoint(Model):
    """A model server listed explicitly (standalone use, no Kubernetes)."""

    address: str
    """``host:port`` or ``http://host:port``."""
    name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    engine_type: Literal["vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"] = "vllm"
    """Which metric names the server exports (the engine types of GIE's
    https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go)."""
    kv_events: KVEventsOverride | None = None
    """Changes to the pool's ``kvEvents`` for this endpoint (e.g. another port per
    data-parallel rank)."""
    accelerator: AcceleratorClass | None = None
    """Its hardware class, e.g. ``h100-80gb`` (:mod:`sluicegate.api.hardware`); default:
    the pool's ``hardware.accelerator``."""
    cost_per_hour: CostPerHour | None = None
    """What it costs per hour; default: the pool's ``hardware`` costs."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        rest = value.removeprefix("http://").removeprefix("https://").rstrip("/")
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"address must be host:port, got {value!r}")
        return value


class InferencePoolSpec(Model):
    selector: LabelSelector | dict[str, str] = Field(default_factory=dict)
    target_ports: Annotated[list[PortNumber], Field(max_length=8)] = Field(default_factory=list)
    target_port_number: Annotated[int, Field(ge=1, le=65535)] | None = None
    app_protocol: Literal["http", "kubernetes.io/h2c"] = "http"
    endpoint_picker_ref: EndpointPickerRef | None = None
    extension_ref: ExtensionRef | None = None
    endpoints: list[StaticEndpoint] = Field(default_factory=list)
    kv_events: KVEventsSettings | None = None
    """The servers' KV-cache event streams, for the ``precise-prefix-cache-producer`` (a
    sluicegate extension; None: not subscribed)."""
    tokenizer: TokenizerSettings = Field(default_factory=TokenizerSettings)
    """Where the precise producer gets the requests' token ids (a sluicegate extension;
    default ``builtin``)."""
    hardware: PoolHardware = Field(default_factory=PoolHardware)
    """Hardware class and cost defaults of its endpoints (a sluicegate extension)."""

    @model_validator(mode="after")
    def _ports(self) -> InferencePoolSpec:
        names = [e.name or e.address for e in self.endpoints]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"endpoints must have distinct names: {', '.join(duplicated)}")
        ports = [p.number for p in self.target_ports]
        if len(set(ports)) != len(ports):
            raise ValueError("targetPorts must be unique")
        if not ports and self.target_port_number is None and not self.endpoints:
            raise ValueError("a pool needs targetPorts (or targetPortNumber, or endpoints)")
        return self

    @property
    def match_labels(self) -> dict[str, str]:
        sel = self.selector
        return dict(sel.match_labels) if isinstance(sel, LabelSelector) else dict(sel)

    @property
    def ports(self) -> list[int]:
        if self.target_ports:
            return [p.number for p in self.target_ports]
        return [self.target_port_number] if self.target_port_number else []

    @property
    def failure_mode(self) -> str:
        ref = self.endpoint_picker_ref or self.extension_ref
        return ref.failure_mode if ref else "FailClose"


class InferencePool(Resource):
    kind: Literal["InferencePool"]
    spec: InferencePoolSpec


# ---------------------------------------------------------------------------- InferenceModel


class PoolRef(Model):
    group: str = ""
    kind: str = "InferencePool"
    name: str


class TargetModel(Model):
    name: Annotated[str, Field(min_length=1, max_length=253)]
    weight: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


Criticality = Literal["Critical", "Standard", "Sheddable"]


class InferenceModelSpec(Model):
    model_name: Annotated[str, Field(min_length=1, max_length=256)]
    criticality: Criticality | None = None
    target_models: Annotated[list[TargetModel], Field(max_length=10)] = Field(default_factory=list)
    pool_ref: PoolRef

    @model_validator(mode="after")
    def _weights(self) -> InferenceModelSpec:
        problems: list[str] = []
        weighted = [t.weight is not None for t in self.target_models]
        if any(weighted) and not all(weighted):
            problems.append("targetModels weights must be set on all targets or on none")
        names = [t.name for t in self.target_models]
        if len(set(names)) != len(names):
            problems.append("targetModels names must be unique")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class InferenceModel(Resource):
    kind: Literal["InferenceModel"]
    spec: InferenceModelSpec


# ---------------------------------------------------------------------------- InferenceObjective


class InferenceObjectiveSpec(Model):
    priority: int | None = None
    pool_ref: PoolRef


class InferenceObjective(Resource):
    kind: Literal["InferenceObjective"]
    spec: InferenceObjectiveSpec


# ---------------------------------------------------------------------------- InferenceModelRewrite


class ModelMatch(Model):
    type: Literal["Exact"] = "Exact"
    """The only match type the API defines (its default)."""
    value: Annotated[str, Field(min_length=1, max_length=256)]


class RewriteMatch(Model):
    model: ModelMatch


class RewriteTarget(Model):
    model_rewrite: Annotated[str, Field(min_length=1, max_length=253)]
    """The model name the request is sent upstream with."""
    weight: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class RewriteRule(Model):
    matches: Annotated[list[RewriteMatch], Field(max_length=64)] = Field(default_factory=list)
    """Any of these names (logical OR); empty: every requested name."""
    targets: Annotated[list[RewriteTarget], Field(min_length=1, max_length=64)]

    @model_validator(mode="after")
    def _targets(self) -> RewriteRule:
        problems: list[str] = []
        weighted = [t.weight is not None for t in self.targets]
        if any(weighted) and not all(weighted):
            problems.append("targets weights must be set on all targets or on none")
        names = [t.model_rewrite for t in self.targets]
        if len(set(names)) != len(names):
            problems.append("targets modelRewrite names must be unique")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def exact_models(self) -> list[str]:
        """The matched names in order, without repeats (empty for a generic rule)."""
        return list(dict.fromkeys(m.model.value for m in self.matches))


class InferenceModelRewriteSpec(Model):
    pool_ref: PoolRef
    rules: Annotated[list[RewriteRule], Field(min_length=1, max_length=256)]


class InferenceModelRewrite(Resource):
    kind: Literal["InferenceModelRewrite"]
    spec: InferenceModelRewriteSpec


KINDS: dict[str, type[BaseModel]] = {
    "InferencePool": InferencePool,
    "InferenceModel": InferenceModel,
    "InferenceObjective": InferenceObjective,
    "InferenceModelRewrite": InferenceModelRewrite,
    "EndpointPickerConfig": EndpointPickerConfig,
    "GatewayConfig": GatewayConfig,
}
