"""What every configuration model shares: strict camelCase models, Kubernetes object
metadata, and the resource envelope (``apiVersion``, ``kind``, ``metadata``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ObjectMeta(BaseModel):
    """Kubernetes object metadata; fields other than these are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: Annotated[str, Field(min_length=1, max_length=253)]
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: str | None = Field(None, alias="creationTimestamp")
    """RFC 3339 (sorts as text); decides which InferenceModelRewrite is older."""

    @field_validator("creation_timestamp", mode="before")
    @classmethod
    def _timestamp(cls, value: object) -> object:
        # YAML reads an unquoted timestamp as a datetime; the API server sends text.
        if isinstance(value, datetime):
            aware = value if value.tzinfo else value.replace(tzinfo=UTC)
            return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return value


class Resource(Model):
    api_version: str
    kind: str
    metadata: ObjectMeta


__all__ = ["Model", "ObjectMeta", "Resource"]
