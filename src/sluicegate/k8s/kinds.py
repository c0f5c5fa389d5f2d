"""The Kubernetes resources sluicegate reads, and how to ask the API server for them.

Each :class:`ResourceKind` names one collection (group, version, plural). Pods come from the
core API (``/api/v1/namespaces/{ns}/pods``); the inference-extension objects are custom
resources (``/apis/{group}/{version}/namespaces/{ns}/{plural}``). Both are requested with
the kubernetes-asyncio client, without deserialisation (``_preload_content=False``): the
discovery wants the raw JSON, in the camelCase shape ``sluicegate.api`` validates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """One watched collection."""

    group: str
    """API group; ``""`` for the core group (pods)."""
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """A short unique name, e.g. ``inferencepools.inference.networking.k8s.io/v1``."""
        return f"{self.plural}.{self.group}/{self.version}" if self.group else self.plural

    def __str__(self) -> str:
        return self.key


PODS = ResourceKind("", "v1", "pods", "Pod")
POOLS_V1 = ResourceKind("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
POOLS_V1ALPHA2 = ResourceKind(
    "inference.networking.x-k8s.io", "v1alpha2", "inferencepools", "InferencePool"
)
MODELS_V1ALPHA2 = ResourceKind(
    "inference.networking.x-k8s.io", "v1alpha2", "inferencemodels", "InferenceModel"
)
OBJECTIVES_V1ALPHA2 = ResourceKind(
    "inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"
)
REWRITES_V1ALPHA2 = ResourceKind(
    "inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"
)
"""GIE's group for it (``apix/v1alpha2`` at 1748e829); llm-d-router moved it to ``llm-d.ai``
(``apix/v1alpha2/zz_generated.register.go`` at ebab6879), which is not watched."""

ALL_KINDS: tuple[ResourceKind, ...] = (
    POOLS_V1,
    POOLS_V1ALPHA2,
    MODELS_V1ALPHA2,
    OBJECTIVES_V1ALPHA2,
    REWRITES_V1ALPHA2,
    PODS,
)
"""Everything the discovery watches (the RBAC Role in ``deploy/`` grants exactly these)."""


async def request(
    api: ApiClient,
    kind: ResourceKind,
    namespace: str,
    *,
    watch: bool = False,
    resource_version: str | None = None,
    limit: int | None = None,
    continue_token: str | None = None,
    timeout_seconds: int | None = None,
    request_timeout: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientResponse:
    """Start a list (or, with ``watch``, a watch) request; the caller reads and releases it.

    The response is returned whatever its status; the caller checks ``status``.
    """
    kwargs: dict[str, Any] = {"_preload_content": False}
    if watch:
        kwargs["watch"] = True
        kwargs["allow_watch_bookmarks"] = True
    if resource_version:
        kwargs["resource_version"] = resource_version
    if limit:
        kwargs["limit"] = limit
    if continue_token:
        kwargs["_continue"] = continue_token
    if timeout_seconds:
        kwargs["timeout_seconds"] = timeout_seconds
    if request_timeout is not None:
        kwargs["_request_timeout"] = request_timeout
    # With _preload_content=False the generated methods return the aiohttp response.
    if not kind.group:
        result: Any = await CoreV1Api(api).list_namespaced_pod(namespace, **kwargs)
    else:
        result = await CustomObjectsApi(api).list_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, **kwargs
        )
    return cast(aiohttp.ClientResponse, result)
