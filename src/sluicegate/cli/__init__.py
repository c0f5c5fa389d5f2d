"""The ``sluicegate`` command: one module per command (``serve``, ``extproc``, ``sim``,
``bench``, ``predictor``), each adding its parser; what they share is in
:mod:`sluicegate.cli.common`. Heavy imports happen in the handlers, so building the
parser stays cheap."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sluicegate.cli import bench, extproc, predictor, serve, sim

_COMMANDS = (serve, extproc, bench, sim, predictor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluicegate",
        description="An inference gateway for self-hosted LLM fleets.",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    args.argv = raw[raw.index("bench") + 1 :] if "bench" in raw else raw
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    sys.exit(args.func(args))


__all__ = ["build_parser", "main"]
