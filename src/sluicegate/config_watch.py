"""Running until told to stop, re-reading the configuration file when it changes.

Shared by ``sluicegate serve`` (:mod:`sluicegate.gateway.run`) and ``sluicegate extproc``
(:mod:`sluicegate.extproc.run`):

- :func:`read_config` — load the file at start, checked against :class:`ConfigRules`;
- :func:`install_signal_handlers` — SIGINT/SIGTERM set a stop event (SIGINT or a second
  signal also an at-once event), SIGHUP a reload event;
- :func:`watch_config` — re-read the file when it changes (checked every ``interval_s``
  seconds) or on the reload event, and hand the new configuration to ``apply``. A version
  that is invalid, or that :class:`ConfigRules` refuses (no InferencePool: an empty or
  truncated file), is logged at ERROR and the running one kept.

A change is detected on the file's device, inode, modification time and size, so a new
file renamed into place (editors, ``kubectl`` ConfigMap mounts swapping a symlink) counts
even when it carries an older modification time. The file is applied only once it stopped
changing: read, wait ``settle_s``, and keep what was read only if none of the four moved
meanwhile; a config tool writing the file in several steps is not caught half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sluicegate.api.loader import Config, ConfigError, parse_config
from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.framework import PluginConfigError

log = logging.getLogger("sluicegate.config")

Stamp = tuple[int, int, int, int]
"""A file's device, inode, modification time (ns) and size (bytes)."""


@dataclass(frozen=True, slots=True)
class ConfigRules:
    """What a configuration file must hold, at start and on every reload."""

    picker: EndpointPickerConfig | None = None
    """A ``--policy`` preset, in place of the file's EndpointPickerConfig."""
    pools_from_file: bool = True
    """The file lists the pools to route to (False with ``--kubernetes``: the API server
    does, and the file only supplies settings)."""
    allow_empty: bool = False
    """``--allow-empty-config``: accept a file without any InferencePool (or, when pools
    come from elsewhere, without any document)."""


def config_from_bytes(data: bytes, path: Path, rules: ConfigRules) -> Config:
    """Parse the file's content; raises :class:`ConfigError` if it is invalid or empty."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text"]) from None
    config = parse_config(text, source=str(path))
    # An empty or cut-short file is far likelier a config tool's partial write than a
    # wish to route nothing: applying it would take all traffic down.
    empty = None
    if rules.pools_from_file and not config.pools:
        empty = "defines no InferencePool to route to (an empty or truncated file?)"
    elif not config.documents:
        empty = "holds no document (empty or only comments)"
    if empty and not rules.allow_empty:
        raise ConfigError([f"{path} {empty}; --allow-empty-config accepts one"])
    if rules.picker is not None:
        config.picker = rules.picker
    return config


def read_config(path: Path, rules: ConfigRules | None = None) -> Config:
    """Load ``path`` now (at start: no waiting for it to settle); raises
    :class:`ConfigError` or ``OSError``."""
    return config_from_bytes(path.read_bytes(), path, rules or ConfigRules())


def install_signal_handlers(
    stop: asyncio.Event,
    reload_now: asyncio.Event | None = None,
    now: asyncio.Event | None = None,
) -> None:
    """SIGINT and SIGTERM set ``stop``; SIGHUP sets ``reload_now`` (where signals exist).

    With ``now`` (a server that drains on SIGTERM): SIGINT (Ctrl-C) sets ``now`` as well —
    stop at once, no drain — and so does any signal after the first, so a second Ctrl-C or
    SIGTERM cuts a drain short."""
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        if stop.is_set() and now is not None:
            now.set()
        stop.set()

    def on_int() -> None:
        if now is not None:
            now.set()
        stop.set()

    for sig, handler in ((signal.SIGINT, on_int), (signal.SIGTERM, on_term)):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, handler)
    if reload_now is not None:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, reload_now.set)


async def watch_config(
    path: Path,
    rules: ConfigRules,
    apply: Callable[[Config], Awaitable[None] | None],
    reload_now: asyncio.Event,
    interval_s: float = 1.0,
    settle_s: float = 0.1,
    settle_tries: int = 20,
    since: Stamp | None = None,
) -> None:
    """Until cancelled: ``apply`` the file's configuration whenever it changes or
    ``reload_now`` is set, once it has been stable for ``settle_s`` seconds (at most
    ``settle_tries`` attempts, then again at the next check). Errors are logged; the
    watcher outlives any bad file.

    ``since``: the :func:`file_stamp` taken before the start-up read, so that a change
    made while the server was starting is not missed (default: the file as it is now)."""
    last = since or file_stamp(path)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reload_now.wait(), timeout=interval_s)
        forced = reload_now.is_set()
        reload_now.clear()
        if not forced and file_stamp(path) == last:
            continue
        try:
            settled = await _read_settled(path, settle_s, settle_tries)
        except OSError as exc:  # unreadable (permissions): reported once per change
            last = file_stamp(path)
            log.error("configuration %s not applied; keeping the running one: %s", path, exc)
            continue
        if settled is None:
            if file_stamp(path) is None:
                if last is not None or forced:
                    log.error("configuration %s is missing; keeping the running one", path)
                last = None
            else:  # `last` stays: the next check tries again
                log.warning(
                    "configuration %s still changing after %.1f s; applied once it settles",
                    path,
                    settle_s * settle_tries,
                )
            continue
        last, data = settled
        try:
            result = apply(config_from_bytes(data, path, rules))
            if inspect.isawaitable(result):  # e.g. tokenizers loaded in a worker thread
                await result
        except (ConfigError, PluginConfigError) as exc:
            log.error("configuration %s not applied; keeping the running one:\n%s", path, exc)
        except Exception:
            log.exception("configuration %s not applied; keeping the running one", path)


async def _read_settled(path: Path, settle_s: float, tries: int) -> tuple[Stamp, bytes] | None:
    """The file's stamp and content once it stayed the same for ``settle_s`` seconds;
    None if it was missing or still changing on every one of ``tries`` attempts."""
    for _ in range(tries):
        before = file_stamp(path)
        data = None
        if before is not None:
            with contextlib.suppress(FileNotFoundError):  # renamed away meanwhile
                data = await asyncio.to_thread(path.read_bytes)
        await asyncio.sleep(settle_s)
        if data is not None and before is not None and file_stamp(path) == before:
            return before, data
    return None


def file_stamp(path: Path) -> Stamp | None:
    """``path``'s :data:`Stamp`, or None if it does not exist (or cannot be looked at)."""
    try:
        st = path.stat()  # follows symlinks: a swapped link target counts as a change
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
