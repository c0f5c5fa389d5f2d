"""What the commands share: the error line, the event loop, and the options and the one
configuration check of the picker commands (``serve`` and ``extproc``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeAlias

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from sluicegate.config_watch import ConfigRules
    from sluicegate.runtime import RuntimeOptions

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What each command's ``add_parser`` adds itself to (a string: argparse's class is not
subscriptable at run time)."""

console = Console(stderr=True)


def fail(message: str, status: int = 2) -> int:
    """Print ``message`` as an error (verbatim: no markup, no wrapping: a one-line problem
    stays one line for scripts and log collectors) and return ``status``."""
    console.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
    return status


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop until it returns or the user interrupts it."""
    try:
        import uvloop

        runner: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back quietly
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(main)


def add_picker_flags(parser: argparse.ArgumentParser, kubernetes: bool) -> None:
    """``--seed``, ``--allow-empty-config`` and the latency flags, shared by the two
    commands that run a picker (``serve`` and ``extproc``)."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the scheduler's RNG")
    add_allow_empty_flag(parser, kubernetes)
    add_latency_flags(parser)


def add_allow_empty_flag(parser: argparse.ArgumentParser, kubernetes: bool) -> None:
    what = "any InferencePool"
    if kubernetes:  # the pools then come from the API server: only an empty file is refused
        what += " (with --kubernetes: without any document)"
    parser.add_argument(
        "--allow-empty-config",
        action="store_true",
        help=f"accept, at start and on reload, a --config without {what}; refused by "
        "default, since an empty or truncated file is likelier a partial write",
    )


def add_latency_flags(parser: argparse.ArgumentParser) -> None:
    """``--latency-model-dir`` and ``--latency-trace``, for ``serve`` and ``extproc``."""
    parser.add_argument(
        "--latency-model-dir",
        default=None,
        metavar="DIR",
        help="in-process latency models: load the ones saved here at start (a restarted "
        "picker starts warm) and save after each training; overrides latencyPredictor.modelDir",
    )
    parser.add_argument(
        "--latency-trace",
        default=None,
        metavar="FILE",
        help="train the in-process latency models at start on this recorded trace (JSON "
        "Lines samples, as 'sluicegate predictor train --trace' reads)",
    )


def check_latency_flags(args: argparse.Namespace) -> str | None:
    """What is wrong with the latency flags, or None. The trace is opened, not parsed: a
    bad line is reported when the picker starts."""
    directory = args.latency_model_dir
    if directory is not None and os.path.exists(directory) and not os.path.isdir(directory):
        return f"--latency-model-dir {directory}: not a directory"
    if args.latency_trace is not None:
        try:
            with open(args.latency_trace, "rb"):
                pass
        except OSError as exc:
            return f"--latency-trace: {exc}"
    return None


def checked_config(args: argparse.Namespace, pools_from_file: bool) -> ConfigRules:
    """The rules ``--config`` is read by (``--policy``, ``--allow-empty-config``), after
    loading it as start-up and every reload will and building its scheduler and flow
    control: every problem, plugins included, is reported before anything listens.

    Raises ``ConfigError``, ``PluginConfigError`` or ``OSError``."""
    from pathlib import Path

    from sluicegate.config_watch import ConfigRules, read_config
    from sluicegate.runtime import Runtime
    from sluicegate.scheduling.config import load_preset

    picker = load_preset(args.policy) if args.policy else None
    rules = ConfigRules(picker, pools_from_file, allow_empty=args.allow_empty_config)
    if args.config:
        Runtime(read_config(Path(args.config), rules))
    return rules


def runtime_options(args: argparse.Namespace) -> RuntimeOptions:
    """The picker's options from the flags ``serve`` and ``extproc`` share."""
    from sluicegate.runtime import RuntimeOptions

    return RuntimeOptions(
        seed=args.seed,
        latency_model_dir=args.latency_model_dir,
        latency_trace=args.latency_trace,
    )
