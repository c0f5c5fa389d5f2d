"""Connecting to the API server: in-cluster service account, or a kubeconfig file."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import ApiClient, Configuration

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def in_cluster() -> bool:
    """True inside a pod (the API server's address is in the environment)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


async def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """An ``ApiClient`` for the current cluster; the caller closes it.

    Inside a pod (and without ``kubeconfig``) the service account's token and CA are used
    (the token is re-read as it rotates); otherwise ``kubeconfig`` (default ``$KUBECONFIG``
    or ``~/.kube/config``) and its ``context``.
    """
    configuration = Configuration()
    if kubeconfig is None and context is None and in_cluster():
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        await k8s_config.load_kube_config(
            config_file=path, context=context, client_configuration=configuration
        )
    return ApiClient(configuration)


def api_client_for(host: str) -> ApiClient:
    """An ``ApiClient`` for an unauthenticated API server at ``host`` (``http://…``), such
    as ``kubectl proxy`` or a test server."""
    return ApiClient(Configuration(host=host))


def default_namespace(fallback: str = "default") -> str:
    """The pod's own namespace when running in a pod, else ``fallback``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or fallback
    except OSError:
        return fallback
