"""Running until told to stop, re-reading the configuration file when it changes.

Shared by ``sluicegate serve`` (:mod:`sluicegate.gateway.run`) and ``sluicegate extproc``
(:mod:`sluicegate.extproc.run`):

- :func:`read_config` — load the file, with the ``--policy`` preset in place of its
  EndpointPickerConfig;
- :func:`install_signal_handlers` — SIGINT/SIGTERM set a stop event, SIGHUP a reload event;
- :func:`watch_config` — re-read the file when its modification time changes (checked
  every ``interval_s`` seconds) or on the reload event, and hand the new configuration to
  ``apply``; an invalid new version is logged and the running one kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from sluicegate.api.loader import Config, ConfigError, load_config
from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.framework import PluginConfigError

log = logging.getLogger("sluicegate.config")


def read_config(path: Path, picker: EndpointPickerConfig | None = None) -> Config:
    """Load ``path``; ``picker`` (a ``--policy`` preset) replaces its EndpointPickerConfig."""
    config = load_config(path)
    if picker is not None:
        config.picker = picker
    return config


def install_signal_handlers(stop: asyncio.Event, reload_now: asyncio.Event | None = None) -> None:
    """SIGINT and SIGTERM set ``stop``; SIGHUP sets ``reload_now`` (where signals exist)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if reload_now is not None:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, reload_now.set)


async def watch_config(
    path: Path,
    load: Callable[[Path], Config],
    apply: Callable[[Config], None],
    reload_now: asyncio.Event,
    interval_s: float = 1.0,
) -> None:
    """Until cancelled: ``apply(load(path))`` whenever ``path`` changes or ``reload_now``
    is set. Errors from either are logged; the watcher outlives any bad file."""
    last = _mtime(path)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reload_now.wait(), timeout=interval_s)
        forced = reload_now.is_set()
        reload_now.clear()
        current = _mtime(path)
        if not forced and current == last:
            continue
        last = current
        try:
            apply(load(path))
        except (ConfigError, PluginConfigError, OSError) as exc:
            log.error("configuration %s not applied; keeping the running one:\n%s", path, exc)
        except Exception:
            log.exception("configuration %s not applied; keeping the running one", path)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0
