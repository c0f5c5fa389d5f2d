"""What the discovery keeps of each object it watches.

Objects are projected on arrival so memory stays proportional to what is used: a pod keeps
its name, IP, readiness, deletion mark and labels (not its spec, status history or managed
fields); a custom resource keeps ``apiVersion``, ``kind``, the identifying metadata (and
``creationTimestamp``) and its ``spec`` (``status`` and other server-managed metadata are
dropped, which also keeps them out of
validation: ``sluicegate.api`` models reject unknown top-level fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluicegate.k8s.kinds import ResourceKind


class ProjectionError(ValueError):
    """The object lacks what every Kubernetes object has (``metadata.name``)."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The part of a pod that decides whether, where and as what it serves."""

    name: str
    ip: str | None
    ready: bool
    """The ``Ready`` condition is ``True``."""
    deleting: bool
    """``metadata.deletionTimestamp`` is set (the pod is shutting down)."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def serving(self) -> bool:
        """Ready, not deleting and addressable: the reference's rule for joining a pool."""
        return self.ready and not self.deleting and bool(self.ip)


@dataclass(frozen=True, slots=True)
class CustomObject:
    """An inference-extension object as read from the API server."""

    kind: ResourceKind
    name: str
    created: str
    """``metadata.creationTimestamp`` (RFC 3339, so it sorts as text); "" if absent."""
    document: Mapping[str, Any]
    """``{apiVersion, kind, metadata: {name, namespace, labels, annotations,
    creationTimestamp}, spec}``."""


def _metadata(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ProjectionError("object without metadata.name")
    return meta


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def project_pod(raw: Mapping[str, Any]) -> PodInfo:
    """Project a core/v1 Pod (as JSON) to :class:`PodInfo`."""
    meta = _metadata(raw)
    status = raw.get("status")
    status = status if isinstance(status, Mapping) else {}
    ready = False
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == "Ready":
                ready = cond.get("status") == "True"
    ip = status.get("podIP")
    return PodInfo(
        name=meta["name"],
        ip=ip if isinstance(ip, str) and ip else None,
        ready=ready,
        deleting=meta.get("deletionTimestamp") is not None,
        labels=_string_map(meta.get("labels")),
    )


def project_custom(raw: Mapping[str, Any], kind: ResourceKind) -> CustomObject:
    """Project a custom resource to :class:`CustomObject`.

    ``apiVersion`` and ``kind`` are filled from the collection when the server left them
    out (list items may omit them).
    """
    meta = _metadata(raw)
    metadata: dict[str, Any] = {"name": meta["name"]}
    for key in ("namespace", "labels", "annotations"):
        if key in meta:
            metadata[key] = meta[key]
    document: dict[str, Any] = {
        "apiVersion": raw.get("apiVersion") or kind.api_version,
        "kind": raw.get("kind") or kind.kind,
        "metadata": metadata,
    }
    if "spec" in raw:
        document["spec"] = raw["spec"]
    created = meta.get("creationTimestamp")
    if isinstance(created, str):  # which InferenceModelRewrite is older decides precedence
        metadata["creationTimestamp"] = created
    return CustomObject(
        kind=kind,
        name=meta["name"],
        created=created if isinstance(created, str) else "",
        document=document,
    )
