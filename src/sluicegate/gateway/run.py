"""``sluicegate serve``: run the gateway until interrupted, reloading its configuration.

With ``--config`` the gateway fronts the servers the file lists. Without it, it starts a
simulated pool in the same process (the embedded default), so a newcomer can curl it.
SIGTERM drains: ``/ready`` fails at once, answers carry ``Connection: close``, requests are
served for ``--drain-delay`` seconds more, then the listener closes and requests in progress
get ``--shutdown-grace`` seconds to finish; the process exits 0. SIGINT (Ctrl-C), or a second
signal during a drain, stops at once (requests in progress are cut off).
The configuration file is re-read when it changes (checked every second) or on SIGHUP; an
invalid new version, or one without any InferencePool (unless ``--allow-empty-config``),
is reported and the running one kept (see :mod:`sluicegate.config_watch`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from sluicegate.api.loader import Config, build_config
from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.config_watch import (
    ConfigRules,
    Stamp,
    file_stamp,
    install_signal_handlers,
    read_config,
    watch_config,
)
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.run import completion_command
from sluicegate.sim.server import ReplicaOptions, SimCluster

log = logging.getLogger("sluicegate.gateway")

EMBEDDED_POOL = "sim-pool"


class SimPortsError(OSError):
    """The embedded pool could not listen on the ports ``--sim-base-port`` asked for."""


@dataclass(slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    config_path: Path | None = None
    picker: EndpointPickerConfig | None = None
    """Overrides the configuration's EndpointPickerConfig (``--policy``)."""
    sim_replicas: int = 4
    sim_profile: str = "llama3-8b-h100"
    sim_time_scale: float = 1.0
    sim_base_port: int = 0
    """Embedded pool: replica i listens on ``sim_base_port + i``; 0 = any free ports."""
    allow_empty_config: bool = False
    """Accept a configuration file without any InferencePool (``--allow-empty-config``)."""
    gateway: GatewayOptions = field(default_factory=GatewayOptions)


def embedded_config(urls: list[str], picker: EndpointPickerConfig | None) -> Config:
    """A configuration with one pool of the given simulated servers."""
    docs: list[object] = [
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": EMBEDDED_POOL},
            "spec": {
                "targetPorts": [{"number": 8000}],
                "endpoints": [{"address": u, "name": f"sim-{i}"} for i, u in enumerate(urls)],
            },
        }
    ]
    config = build_config(docs, "<embedded>")
    config.picker = picker
    return config


async def serve(options: ServeOptions, console: Console) -> None:
    cluster: SimCluster | None = None
    since: Stamp | None = None
    rules = ConfigRules(options.picker, allow_empty=options.allow_empty_config)
    if options.config_path is None:
        profile = get_profile(options.sim_profile)
        cluster = SimCluster(
            ReplicaOptions(profile, time_scale=options.sim_time_scale, histogram_max_age_s=1.0),
            options.sim_replicas,
        )
        await _start_cluster(cluster, options.sim_base_port)
        config = embedded_config(cluster.urls, options.picker)
    else:
        since = file_stamp(options.config_path)  # what the watcher compares to, later
        config = read_config(options.config_path, rules)
    gateway = Gateway(config, options.gateway)
    try:
        await gateway.start(options.host, options.port)
        # What start-up built lives as long as the process: keep it out of the garbage
        # collector's scans, whose full passes otherwise stall requests for tens of ms.
        gc.freeze()
    except BaseException:
        if cluster is not None:
            await cluster.stop()
        raise
    _announce(console, gateway, cluster, options)
    stop = asyncio.Event()
    reload_now = asyncio.Event()
    now = asyncio.Event()
    install_signal_handlers(stop, reload_now, now)
    watcher = None
    if options.config_path is not None:
        watcher = asyncio.create_task(
            watch_config(options.config_path, rules, gateway.reload, reload_now, since=since)
        )
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        # SIGTERM: readiness fails first, requests go on for the drain delay, then
        # in-progress ones (streams too) get the grace period (GatewayOptions). SIGINT,
        # or another signal meanwhile: at once.
        await _drain_unless(gateway, now)
        if cluster is not None:
            await cluster.stop()


async def _drain_unless(gateway: Gateway, now: asyncio.Event) -> None:
    """:meth:`Gateway.drain`, cut short (no delay, no grace) as soon as ``now`` is set."""
    if not now.is_set():
        drain = asyncio.create_task(gateway.drain())
        interrupt = asyncio.create_task(now.wait())
        await asyncio.wait([drain, interrupt], return_when=asyncio.FIRST_COMPLETED)
        interrupt.cancel()
        if drain.done():
            drain.result()
            return
        drain.cancel()
        await asyncio.gather(drain, return_exceptions=True)
        log.info("stopping at once")
    await gateway.stop(grace_s=0.0)


async def _start_cluster(cluster: SimCluster, base_port: int) -> None:
    """Start the embedded pool; on failure stop the replicas already listening."""
    try:
        await cluster.start(base_port=base_port)
    except BaseException as exc:
        await cluster.stop()
        if isinstance(exc, OSError) and base_port:
            last = base_port + len(cluster.replicas) - 1
            raise SimPortsError(
                f"cannot start the embedded pool on ports {base_port}-{last}: {exc}"
            ) from exc
        raise


def try_commands(url: str, model: str) -> list[str]:
    """The banner's example commands, one string per line, each a shell can take as pasted:
    backslash-continued lines, and a JSON body that spans two lines inside its quotes.
    Every line is shorter than 80 columns for a loopback ``url``, so an 80-column console
    shows them unwrapped."""
    return [*completion_command(url, model), f"  curl {url}/metrics | grep inference_"]


def _announce(
    console: Console, gateway: Gateway, cluster: SimCluster | None, options: ServeOptions
) -> None:
    url = f"http://{options.host}:{gateway.port}"
    console.print(f"[bold]sluicegate[/] gateway listening on [cyan]{url}[/]")
    if cluster is not None:
        model = cluster.replicas[0].model_name
        console.print(
            f"  fronting an embedded simulated pool: {len(cluster.replicas)} × "
            f"{options.sim_profile} at {', '.join(cluster.urls)}"
        )
        console.print("\nTry:")
        # Printed as they are: soft_wrap stops rich from breaking a line at the console's
        # width (a break inside a command would not paste), no markup or highlighting.
        for line in try_commands(url, model):
            console.print(Text(line), soft_wrap=True, highlight=False)
        console.print()
    else:
        for pool in gateway.datastore.pools.values():
            console.print(f"  pool {pool.name}: {len(pool.endpoints)} endpoint(s)")
