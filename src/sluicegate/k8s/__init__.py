"""Kubernetes discovery: InferencePools, InferenceModels, InferenceObjectives and pods.

- :class:`KubernetesDiscovery` — list+watch one namespace, deliver ``(Config,
  endpoints_by_pool)`` on every change (debounced);
- :func:`load_api_client`, :func:`default_namespace` — connect from a pod or a kubeconfig.

Modules:

- :mod:`~sluicegate.k8s.discovery` — ``KubernetesDiscovery`` and its settings;
- :mod:`~sluicegate.k8s.reflector` — list-then-watch one collection (``ReflectorSettings``);
- :mod:`~sluicegate.k8s.kinds` — the resources read and how to ask for them
  (``ResourceKind``, ``ALL_KINDS``);
- :mod:`~sluicegate.k8s.objects` — what is kept of each watched object;
- :mod:`~sluicegate.k8s.assemble` — watched objects → ``Config`` and endpoint lists;
- :mod:`~sluicegate.k8s.client` — connecting to the API server.

This package imports ``sluicegate.api`` and ``sluicegate.datalayer`` only. The re-exports
are eager: the package is loaded only where discovery runs (``sluicegate extproc`` on
Kubernetes), and discovery needs all of it.
"""

from sluicegate.k8s.assemble import ENGINE_TYPE_LABELS, Assembly, assemble, pool_endpoints
from sluicegate.k8s.client import api_client_for, default_namespace, load_api_client
from sluicegate.k8s.discovery import (
    DiscoverySettings,
    EndpointsByPool,
    KubernetesDiscovery,
    OnChange,
    Snapshot,
)
from sluicegate.k8s.kinds import ALL_KINDS, ResourceKind
from sluicegate.k8s.reflector import ReflectorSettings

__all__ = [
    "ALL_KINDS",
    "ENGINE_TYPE_LABELS",
    "Assembly",
    "DiscoverySettings",
    "EndpointsByPool",
    "KubernetesDiscovery",
    "OnChange",
    "ReflectorSettings",
    "ResourceKind",
    "Snapshot",
    "api_client_for",
    "assemble",
    "default_namespace",
    "load_api_client",
    "pool_endpoints",
]
