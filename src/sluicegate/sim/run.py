"""Run a simulated pool until interrupted (the ``sluicegate sim`` command)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal

from rich.console import Console
from rich.text import Text

from sluicegate.sim.faults import Faults
from sluicegate.sim.profiles import EngineProfile
from sluicegate.sim.server import ReplicaOptions, SimCluster


def fault_table(
    specs: list[tuple[int | None, dict[str, object]]], replicas: int
) -> dict[int, Faults]:
    """Faults per replica index from parsed ``--fault`` options (later ones win)."""
    table: dict[int, Faults] = {}
    for replica, changes in specs:
        targets = range(replicas) if replica is None else [replica]
        for i in targets:
            if not 0 <= i < replicas:
                raise ValueError(f"--fault names replica {i}, but there are {replicas}")
            table.setdefault(i, Faults()).update(dict(changes))
    return table


async def serve_pool(
    options: ReplicaOptions,
    replicas: int,
    host: str,
    port: int,
    faults: dict[int, Faults],
    console: Console,
    profiles: tuple[EngineProfile, ...] = (),
) -> None:
    """Serve ``replicas`` simulated servers from ``port`` on until SIGINT/SIGTERM;
    ``profiles``: one per replica for a mixed pool (else all run ``options.profile``)."""
    cluster = SimCluster(options, replicas, faults, profiles)
    try:
        await cluster.start(host, port)
    except OSError:
        await cluster.stop()  # the replicas that did start
        raise
    profile = options.profile
    mixed = len({p.name for p in profiles}) > 1
    what = "a mixed pool" if mixed else f"[cyan]{profile.name}[/] ({profile.description})"
    console.print(
        f"[bold]sluicegate sim[/]: {replicas} replica(s) of {what}, time scale {options.time_scale}"
    )
    for replica in cluster.replicas:
        own = replica.options.profile
        hardware = f"  [cyan]{own.name}[/] ({own.accelerator or 'no class'})" if mixed else ""
        console.print(
            f"  {replica.pod_name}: http://{host}:{replica.port}  "
            f"model [green]{replica.model_name}[/]{hardware}"
        )
        publisher = replica.kv_publisher
        if publisher is not None:
            replay = publisher.replay_address or "none"
            console.print(f"    kv events: {publisher.pub_address}  replay: {replay}")
    first = cluster.replicas[0]
    console.print("\nTry:")
    # soft_wrap: rich must not break a line at the console's width (it would not paste)
    for line in completion_command(f"http://{host}:{first.port}", first.model_name):
        console.print(Text(line), soft_wrap=True, highlight=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await cluster.stop()


def completion_command(url: str, model: str) -> list[str]:
    """A curl command for one completion at ``url``, one string per line as a shell takes
    it pasted: backslash-continued lines, the JSON body spanning two lines inside its
    quotes; every line under 80 columns for a loopback ``url``."""
    return [
        f"  curl {url}/v1/completions \\",
        "    -H 'content-type: application/json' \\",
        f'    -d \'{{"model": {json.dumps(model)},',
        '         "prompt": "Hello, sluicegate", "max_tokens": 16}\'',
    ]
