"""Load and validate a multi-document YAML configuration.

Documents are told apart by ``kind``. Kinds that belong to the inference-extension, llm-d
or sluicegate API groups must be valid; other Kubernetes objects in the same file (an
``HTTPRoute``, a ``Deployment``) are skipped, so users can point sluicegate at the manifests
they already have. Every error names the document, the object, the field and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sluicegate.api.resources import (
    KINDS,
    EndpointPickerConfig,
    InferenceModel,
    InferenceModelRewrite,
    InferenceObjective,
    InferencePool,
)
from sluicegate.api.settings import GatewayConfig, GatewaySettings

_OUR_GROUPS = ("inference.networking.", "llm-d.ai", "sluicegate.dev")


class ConfigError(ValueError):
    """The configuration is invalid; ``str()`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(slots=True)
class Config:
    """Everything read from the configuration, cross-checked."""

    pools: dict[str, InferencePool] = field(default_factory=dict)
    models: dict[str, InferenceModel] = field(default_factory=dict)
    """InferenceModels by their public ``modelName``."""
    objectives: dict[str, InferenceObjective] = field(default_factory=dict)
    rewrites: dict[str, InferenceModelRewrite] = field(default_factory=dict)
    """InferenceModelRewrites by name, in the order they were read."""
    picker: EndpointPickerConfig | None = None
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    skipped: list[str] = field(default_factory=list)
    """Descriptions of documents of other kinds that were ignored."""
    documents: int = 0
    """Non-empty YAML documents read, of any kind (0: an empty or comments-only file)."""


def load_config(path: str | Path) -> Config:
    """Read ``path``; raises :class:`ConfigError` (or ``OSError`` if it cannot be read)."""
    text = Path(path).read_text(encoding="utf-8")
    return parse_config(text, source=str(path))


def parse_config(text: str, source: str = "<config>") -> Config:
    """Parse YAML ``text`` holding one or more documents."""
    try:
        # Empty documents stay in the list (build_config skips them) so that document
        # numbers in messages count every document of the file.
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: not valid YAML: {exc}"]) from None
    return build_config(documents, source)


def build_config(documents: Iterable[Any], source: str = "<config>") -> Config:
    """Validate already-parsed documents (dicts) into a :class:`Config`."""
    config = Config()
    problems: list[str] = []
    labels: dict[int, str] = {}  # message prefix of each validated object, by id()
    gateway_seen = False
    for number, doc in enumerate(documents, start=1):
        where = f"{source} document {number}"
        if doc is None:  # an empty document (``---`` twice, a trailing ``---``)
            continue
        config.documents += 1
        if not isinstance(doc, dict):
            problems.append(f"{where}: expected a mapping with apiVersion and kind")
            continue
        kind, api_version = doc.get("kind"), str(doc.get("apiVersion", ""))
        name = (
            (doc.get("metadata") or {}).get("name")
            if isinstance(doc.get("metadata"), dict)
            else None
        )
        label = f"{where} ({kind} {name})" if name else f"{where} ({kind})"
        model_cls = KINDS.get(kind) if isinstance(kind, str) else None
        if model_cls is None:
            if api_version.startswith(_OUR_GROUPS) or not kind:
                problems.append(
                    f"{label}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}"
                )
            else:
                config.skipped.append(label)
            continue
        try:
            obj = model_cls.model_validate(doc)
        except ValidationError as exc:
            problems.extend(_describe(label, exc))
            continue
        labels[id(obj)] = label
        if isinstance(obj, GatewayConfig):
            if gateway_seen:
                problems.append(f"{label}: only one GatewayConfig is allowed")
            gateway_seen = True
        _add(config, obj, label, problems)
    _cross_check(config, labels, problems)
    if problems:
        raise ConfigError(problems)
    return config


def _describe(label: str, exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        out.append(f"{label}: {path or '(document)'}: {err['msg']}")
    return out


def _add(config: Config, obj: BaseModel, label: str, problems: list[str]) -> None:
    if isinstance(obj, InferencePool):
        if obj.metadata.name in config.pools:
            problems.append(f"{label}: duplicate InferencePool {obj.metadata.name!r}")
        config.pools[obj.metadata.name] = obj
    elif isinstance(obj, InferenceModel):
        public = obj.spec.model_name
        if public in config.models:
            problems.append(f"{label}: another InferenceModel already serves modelName {public!r}")
        config.models[public] = obj
    elif isinstance(obj, InferenceObjective):
        if obj.metadata.name in config.objectives:
            problems.append(f"{label}: duplicate InferenceObjective {obj.metadata.name!r}")
        config.objectives[obj.metadata.name] = obj
    elif isinstance(obj, InferenceModelRewrite):
        if obj.metadata.name in config.rewrites:
            problems.append(f"{label}: duplicate InferenceModelRewrite {obj.metadata.name!r}")
        config.rewrites[obj.metadata.name] = obj
    elif isinstance(obj, EndpointPickerConfig):
        if config.picker is not None:
            problems.append(f"{label}: only one EndpointPickerConfig is allowed")
        config.picker = obj
    elif isinstance(obj, GatewayConfig):
        config.gateway = obj.spec


def _cross_check(config: Config, labels: dict[int, str], problems: list[str]) -> None:
    referrers: list[InferenceModel | InferenceObjective | InferenceModelRewrite] = [
        *config.models.values(),
        *config.objectives.values(),
        *config.rewrites.values(),
    ]
    for obj in referrers:
        ref = obj.spec.pool_ref.name
        if ref not in config.pools:
            label = labels.get(id(obj), f"{obj.kind} {obj.metadata.name}")
            problems.append(f"{label}: spec.poolRef.name: unknown InferencePool {ref!r}")
