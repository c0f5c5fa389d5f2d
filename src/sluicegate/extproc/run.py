"""``sluicegate extproc``: run the endpoint picker until SIGINT/SIGTERM.

Two sources of pools, models and endpoints:

- **the configuration file** (default): its InferencePools (static endpoints),
  InferenceModels and InferenceObjectives. The file is re-read when it changes (checked
  every second) or on SIGHUP, as ``sluicegate serve`` does; an invalid version, or one
  without any InferencePool (unless ``--allow-empty-config``), is reported and the running
  one kept;
- **Kubernetes** (``--kubernetes``): the InferencePools, InferenceModels,
  InferenceObjectives and pods of one namespace, watched live
  (:class:`~sluicegate.k8s.KubernetesDiscovery`). The file then only supplies the
  EndpointPickerConfig and GatewayConfig (still reloaded on change; a version holding no
  document at all is refused unless ``--allow-empty-config``). Until the discovery
  has synced (and the ``--pool-name`` pool exists) readiness is NOT_SERVING and requests
  get 503.

SIGTERM drains (see :class:`~sluicegate.extproc.server.ExtProcServer`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from sluicegate.api.loader import Config
from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.config_watch import (
    ConfigRules,
    file_stamp,
    install_signal_handlers,
    read_config,
    watch_config,
)
from sluicegate.extproc.server import ExtProcOptions, ExtProcServer
from sluicegate.runtime import Runtime, RuntimeOptions

if TYPE_CHECKING:
    from sluicegate.k8s import KubernetesDiscovery

log = logging.getLogger("sluicegate.extproc")

SYNC_WARNING_S = 30.0
"""Seconds without a first Kubernetes sync before a warning (then every as many)."""


@dataclass(slots=True)
class RunOptions:
    """Everything ``sluicegate extproc`` was asked to do."""

    config_path: Path | None = None
    picker: EndpointPickerConfig | None = None
    """Overrides the configuration's EndpointPickerConfig (``--policy``)."""
    server: ExtProcOptions = field(default_factory=ExtProcOptions)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    kubernetes: bool = False
    namespace: str | None = None
    pool_name: str | None = None
    kubeconfig: str | None = None
    allow_empty_config: bool = False
    """Accept a configuration file without any InferencePool (``--allow-empty-config``)."""

    @property
    def rules(self) -> ConfigRules:
        """What the configuration file must hold, at start and on reloads."""
        return ConfigRules(
            self.picker, pools_from_file=not self.kubernetes, allow_empty=self.allow_empty_config
        )


def _base_config(options: RunOptions) -> Config:
    if options.config_path is not None:
        return read_config(options.config_path, options.rules)
    return Config(picker=options.picker)


async def run_extproc(options: RunOptions, console: Console) -> None:
    """Serve until SIGINT or SIGTERM."""
    # Taken before the start-up read: a change made while starting is reloaded.
    since = file_stamp(options.config_path) if options.config_path is not None else None
    base = _base_config(options)
    if options.kubernetes:  # pools, models and objectives come from the API server only
        runtime = Runtime(_settings_only(base), options.runtime)
    else:
        runtime = Runtime(base, options.runtime)
    api = None
    discovery: KubernetesDiscovery | None = None
    if options.kubernetes:
        from sluicegate.k8s import KubernetesDiscovery, default_namespace, load_api_client

        api = await load_api_client(options.kubeconfig)
        discovery = KubernetesDiscovery(
            api,
            options.namespace or default_namespace(),
            options.pool_name,
            on_change=runtime.reload,
            base=base,
            seed=options.runtime.seed,
        )
    server = ExtProcServer(
        runtime, options.server, synced=(lambda: discovery.ready) if discovery else None
    )
    tasks: list[asyncio.Task[None]] = []
    try:
        await server.start()
        # As `sluicegate serve` does: start-up's long-lived objects out of the garbage
        # collector's scans, whose full passes otherwise stall decisions for tens of ms.
        gc.freeze()
        _announce(console, server, options, runtime)
        stop, reload_now = asyncio.Event(), asyncio.Event()
        install_signal_handlers(stop, reload_now)
        if discovery is not None:
            await discovery.start()
            tasks.append(asyncio.create_task(_report_sync(discovery)))
        if options.config_path is not None:
            tasks.append(
                asyncio.create_task(
                    watch_config(
                        options.config_path,
                        options.rules,
                        _file_applier(runtime, discovery),
                        reload_now,
                        since=since,
                    )
                )
            )
        await stop.wait()
        log.info("stopping: draining streams in flight")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.stop()
        if discovery is not None:
            await discovery.stop()
        if api is not None:
            await api.close()


def _file_applier(
    runtime: Runtime, discovery: KubernetesDiscovery | None
) -> Callable[[Config], Awaitable[None]]:
    """How a new version of the file takes effect."""
    if discovery is None:
        return runtime.reload

    async def apply(config: Config) -> None:
        # Only the picker and gateway settings come from the file here.
        discovery.base = _settings_only(config)
        if discovery.synced:
            snapshot = discovery.assemble()
            await runtime.reload(snapshot.config, snapshot.endpoints)

    return apply


def _settings_only(config: Config) -> Config:
    """``config`` without pools, models and objectives (Kubernetes supplies those)."""
    return dataclasses.replace(config, pools={}, models={}, objectives={})


async def _report_sync(discovery: KubernetesDiscovery) -> None:
    """Log the first sync, and warn while it does not come."""
    while True:
        try:
            async with asyncio.timeout(SYNC_WARNING_S):
                snapshot = await discovery.wait_synced()
        except TimeoutError:
            log.warning(
                "kubernetes discovery has not synced after %.0f s; problems so far: %s",
                SYNC_WARNING_S,
                "; ".join(discovery.problems) or "none reported",
            )
            continue
        pools = {name: len(specs) for name, specs in snapshot.endpoints.items()}
        log.info("kubernetes discovery synced: endpoints by pool %s", pools)
        return


def _announce(
    console: Console, server: ExtProcServer, options: RunOptions, runtime: Runtime
) -> None:
    host = options.server.host
    console.print(
        f"[bold]sluicegate[/] endpoint picker: ext_proc gRPC on [cyan]{host}:{server.grpc_port}"
        f"[/], gRPC health on {host}:{server.health_port}, /metrics on "
        f"http://{host}:{server.metrics_port}/metrics"
    )
    if options.kubernetes:
        console.print(
            f"  pools from Kubernetes: namespace {options.namespace or '(the pod’s)'}, "
            f"pool {options.pool_name or '(all)'}"
        )
    else:
        for pool in runtime.datastore.pools.values():
            console.print(f"  pool {pool.name}: {len(pool.endpoints)} endpoint(s)")
