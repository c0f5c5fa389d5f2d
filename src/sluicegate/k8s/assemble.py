"""Turn the watched objects into what the gateway consumes: a Config and endpoint lists.

**Config.** Every custom object is validated with :func:`sluicegate.api.loader.build_config`
(the same validation a configuration file gets), one object at a time so that an invalid
object is reported and left out while the valid ones are kept:

- InferencePools first. When a pool name exists in both API groups, the
  ``inference.networking.k8s.io/v1`` object wins and the ``v1alpha2`` one is reported.
- InferenceModels, InferenceObjectives and InferenceModelRewrites are validated together
  with the pool they refer to, so a reference to a missing (or invalid) pool is reported
  and the object left out. Rewrites keep their ``creationTimestamp``: the older one wins a
  name two of them match (``sluicegate.requestcontrol.models``).
  Two InferenceModels serving the same ``modelName``: the older one (creation time, then
  name) wins.
- With a ``pool_name``, only that pool is kept, and objects that refer to other pools are
  skipped silently (they are another endpoint picker's).

The EndpointPickerConfig and GatewayConfig come from the ``base`` Config (the ``--config``
file), since they are not Kubernetes resources.

**Endpoints.** For each valid pool, every pod that is ready, not being deleted, has an IP and
carries all the labels of the pool's selector becomes one endpoint per target port, named
``<pod>-rank-<i>`` (``i`` = index of the port in ``targetPorts``; a single port gives
``<pod>-rank-0``), at ``podIP:port``, with the pod's labels, and with the engine type from the
label ``inference.networking.k8s.io/engine-type`` (else ``llm-d.ai/engine-type``, else
``vllm``), and with the hardware class and cost its labels declare
(``sluicegate.dev/accelerator``, ``nvidia.com/gpu.product``, ``sluicegate.dev/cost-per-hour``;
:mod:`sluicegate.datalayer.hardware`) or the pool's ``spec.hardware`` defaults. An empty
selector selects nothing (and is reported): it would otherwise select
every pod of the namespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluicegate.api.loader import Config, ConfigError, build_config
from sluicegate.api.resources import InferencePool
from sluicegate.datalayer.datastore import EndpointSpec
from sluicegate.datalayer.hardware import hardware_from_labels
from sluicegate.datalayer.parsers import ENGINES
from sluicegate.k8s.kinds import POOLS_V1
from sluicegate.k8s.objects import CustomObject, PodInfo

ENGINE_TYPE_LABELS = ("inference.networking.k8s.io/engine-type", "llm-d.ai/engine-type")
"""Pod labels naming the model server's engine, in order of precedence."""
DEFAULT_ENGINE_TYPE = "vllm"

_SOURCE = "apiserver"
_LOADER_PREFIX = re.compile(rf"^{_SOURCE} document \d+ \([^)]*\): ")


@dataclass(slots=True)
class Assembly:
    """The result of one assembly."""

    config: Config
    endpoints: dict[str, list[EndpointSpec]]
    """Endpoints of every pool in ``config.pools`` (an empty list when no pod serves)."""
    problems: list[str] = field(default_factory=list)


def engine_type(labels: Mapping[str, str]) -> str:
    """The engine type a pod declares by label, or ``vllm``."""
    for key in ENGINE_TYPE_LABELS:
        value = labels.get(key)
        if value:
            return value
    return DEFAULT_ENGINE_TYPE


def _label(obj: CustomObject, namespace: str) -> str:
    return f"{obj.kind.kind} {namespace}/{obj.name} ({obj.kind.api_version})"


def _validate(documents: list[Mapping[str, Any]], obj: CustomObject, namespace: str) -> list[str]:
    """Problems of ``obj`` when validated with ``documents`` (it is the last of them)."""
    try:
        build_config([dict(d) for d in documents], source=_SOURCE)
    except ConfigError as exc:
        return [f"{_label(obj, namespace)}: {_LOADER_PREFIX.sub('', p)}" for p in exc.problems]
    return []


def _pool_ref(obj: CustomObject) -> str | None:
    spec = obj.document.get("spec")
    ref = spec.get("poolRef") if isinstance(spec, Mapping) else None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else None


def _model_name(obj: CustomObject) -> str:
    spec = obj.document.get("spec")
    return str(spec.get("modelName")) if isinstance(spec, Mapping) else ""


def _age(obj: CustomObject) -> tuple[str, str]:
    return (obj.created or "~", obj.name)  # "~" sorts after any timestamp


def assemble(
    namespace: str,
    pools: Iterable[CustomObject],
    models: Iterable[CustomObject],
    objectives: Iterable[CustomObject],
    pods: Iterable[PodInfo],
    *,
    pool_name: str | None = None,
    base: Config | None = None,
    rewrites: Iterable[CustomObject] = (),
) -> Assembly:
    """Validate the objects and compute every pool's endpoints (see the module docstring)."""
    problems: list[str] = []

    # Pools: v1 before v1alpha2, so a name defined in both resolves to v1.
    accepted_pools: dict[str, CustomObject] = {}
    rejected_pools: set[str] = set()
    for obj in sorted(pools, key=lambda o: (o.kind != POOLS_V1, o.name)):
        if pool_name is not None and obj.name != pool_name:
            continue
        if obj.name in accepted_pools:
            winner = accepted_pools[obj.name].kind.api_version
            problems.append(
                f"{_label(obj, namespace)}: ignored: an InferencePool of the same name "
                f"exists in {winner}"
            )
            continue
        found = _validate([obj.document], obj, namespace)
        if found:
            problems.extend(found)
            rejected_pools.add(obj.name)
        else:
            accepted_pools[obj.name] = obj

    # Models and objectives, each validated with the pool it refers to.
    accepted: list[CustomObject] = []
    served_by: dict[str, CustomObject] = {}
    for group in (models, objectives, rewrites):
        for obj in sorted(group, key=_age):
            ref = _pool_ref(obj)
            if pool_name is not None and ref is not None and ref != pool_name:
                continue
            if ref in rejected_pools and ref not in accepted_pools:
                problems.append(
                    f"{_label(obj, namespace)}: ignored: spec.poolRef.name refers to "
                    f"InferencePool {ref!r}, which is invalid"
                )
                continue
            pool = accepted_pools.get(ref) if ref is not None else None
            documents = [pool.document, obj.document] if pool else [obj.document]
            found = _validate(documents, obj, namespace)
            if found:
                problems.extend(found)
                continue
            if obj.kind.kind == "InferenceModel":
                public = _model_name(obj)
                if public in served_by:
                    problems.append(
                        f"{_label(obj, namespace)}: ignored: modelName {public!r} is already "
                        f"served by the older InferenceModel {served_by[public].name!r}"
                    )
                    continue
                served_by[public] = obj
            accepted.append(obj)

    documents = [dict(o.document) for o in (*accepted_pools.values(), *accepted)]
    try:
        config = build_config(documents, source=_SOURCE)
    except ConfigError as exc:  # every object passed on its own; should not happen
        problems.extend(exc.problems)
        try:
            config = build_config([dict(o.document) for o in accepted_pools.values()])
        except ConfigError:
            config = Config()
    if base is not None:
        config.picker = base.picker
        config.gateway = base.gateway

    pod_list = sorted(pods, key=lambda p: p.name)
    for pod in pod_list:
        kind = engine_type(pod.labels)
        if pod.ready and kind not in ENGINES:
            problems.append(
                f"Pod {namespace}/{pod.name}: unknown engine type {kind!r} "
                f"(known: {', '.join(sorted(ENGINES))}); its metrics will not be read"
            )
    endpoints = {
        name: pool_endpoints(pool, pod_list, namespace, problems)
        for name, pool in config.pools.items()
    }
    return Assembly(config, endpoints, problems)


def pool_endpoints(
    pool: InferencePool,
    pods: Iterable[PodInfo],
    namespace: str = "",
    problems: list[str] | None = None,
) -> list[EndpointSpec]:
    """The endpoints ``pods`` give ``pool``, in pod-name then port order."""
    selector = pool.spec.match_labels
    ports = pool.spec.ports
    where = f"InferencePool {namespace}/{pool.metadata.name}" if namespace else pool.metadata.name
    if not selector:
        if problems is not None:
            problems.append(f"{where}: empty selector; no pod is selected")
        return []
    if not ports:
        if problems is not None:
            problems.append(f"{where}: no targetPorts; no pod endpoint can be made")
        return []
    out: list[EndpointSpec] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if not pod.ready or pod.deleting or not pod.ip:
            continue
        if any(pod.labels.get(key) != value for key, value in selector.items()):
            continue
        kind = engine_type(pod.labels)
        hardware = hardware_from_labels(
            pod.labels,
            pool.spec.hardware,
            problems if problems is not None else [],
            f"Pod {namespace}/{pod.name}",
        )
        for index, port in enumerate(ports):
            out.append(
                EndpointSpec(
                    f"{pod.name}-rank-{index}",
                    pod.ip,
                    port,
                    dict(pod.labels),
                    kind,
                    hardware=hardware,
                )
            )
    return out
