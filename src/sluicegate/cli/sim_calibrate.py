"""``sluicegate sim calibrate``: fit a simulator profile to a real server's timings."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from sluicegate.cli.common import Subparsers, console, fail


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("batch sizes must be positive integers")
    return sizes


def add_parser(sub: Subparsers) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="fit a simulator profile to a real OpenAI-compatible server",
        description="Drive a running vLLM (or other OpenAI-compatible) server with designed "
        "probes, fit the simulator's step-time function and KV capacity, print the fit's "
        "error per point and write a profile file for `sluicegate sim --profile-file` and "
        "`sluicegate bench run --profile-file`. See docs/simulator.md.",
    )
    cal.add_argument("--target", required=True, metavar="URL", help="server base URL")
    cal.add_argument("--model", default=None, help="model to probe (default: the first served)")
    cal.add_argument("--out", required=True, metavar="FILE", help="profile file to write")
    cal.add_argument("--name", default=None, help="profile name (default calibrated-MODEL)")
    cal.add_argument(
        "--base",
        default="llama3-8b-h100",
        help="built-in profile for the model's shape and limits not measured "
        "(default llama3-8b-h100)",
    )
    cal.add_argument("--max-num-seqs", type=int, default=None, help="the server's --max-num-seqs")
    cal.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the server's --max-num-batched-tokens",
    )
    cal.add_argument(
        "--budget-s", type=float, default=180.0, help="time budget in seconds (default 180)"
    )
    cal.add_argument(
        "--batch-sizes",
        type=_sizes,
        default=(1, 8, 32, 128),
        help="decode batch sizes (default 1,8,32,128; capped by --max-num-seqs)",
    )
    cal.add_argument(
        "--decode-tokens", type=int, default=48, help="tokens per decode probe (default 48)"
    )
    cal.add_argument("--repeats", type=int, default=3, help="repeats per prefill (default 3)")
    cal.add_argument(
        "--passes",
        type=int,
        default=2,
        help="times the whole plan runs, budget permitting; each point is the median over "
        "passes (default 2)",
    )
    cal.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="for a `sluicegate sim --time-scale X` target: X (default 1)",
    )
    cal.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="the served model's tokenizer.json (or its folder), written into the profile: "
        "the simulator then sizes text prompts in the model's tokens, as the server does "
        "(default: built-in 4-byte tokens)",
    )
    cal.set_defaults(func=_cmd_calibrate)


def _relative_to(path: str, folder: Path) -> str:
    """``path`` as a profile file in ``folder`` names it: a relative path becomes relative
    to ``folder`` (a profile's paths are relative to its own folder); ``~/…`` and absolute
    paths are kept as given. The folders on both sides are resolved through symlinks
    first: the loader joins the path to the folder the file is in, and the system resolves
    a ``..`` from where a symlinked folder really is. The tokenizer's own name is kept (a
    Hugging Face cache links ``tokenizer.json`` to a blob with no config beside it)."""
    if path.startswith("~") or os.path.isabs(path):
        return path
    head, name = os.path.split(os.path.abspath(path))
    target = os.path.join(os.path.realpath(head), name)
    return os.path.relpath(target, os.path.realpath(folder))


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import asyncio
    from dataclasses import replace

    from rich.progress import Progress

    from sluicegate.sim.calibrate import CalibrateOptions, calibrate
    from sluicegate.sim.calibrate.client import ServerError
    from sluicegate.sim.profile_file import dump_profile
    from sluicegate.sim.profiles import PROFILES

    if args.base not in PROFILES:
        return fail(f"--base: unknown profile {args.base!r}; known: {', '.join(sorted(PROFILES))}")
    # Each must be a positive finite number; the two server limits may be left out (None:
    # the base profile's), but 0 or less is refused like any other.
    for flag, value in (
        ("--budget-s", args.budget_s),
        ("--time-scale", args.time_scale),
        ("--decode-tokens", args.decode_tokens),
        ("--repeats", args.repeats),
        ("--passes", args.passes),
        ("--max-num-seqs", args.max_num_seqs),
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            return fail(f"{flag} must be a positive number, got {value}")
    tokenizer = None
    if args.tokenizer is not None:
        from sluicegate.model_tokenizer import TokenizerLoadError
        from sluicegate.sim.prompt_tokens import PromptTokens

        try:
            PromptTokens.load(args.tokenizer)
        except TokenizerLoadError as exc:
            return fail(f"--tokenizer: {exc}")
        tokenizer = _relative_to(args.tokenizer, Path(args.out).parent)
    options = CalibrateOptions(
        target=args.target,
        model=args.model,
        base=args.base,
        name=args.name,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        budget_s=args.budget_s,
        batch_sizes=args.batch_sizes,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
        passes=args.passes,
        time_scale=args.time_scale,
    )
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("calibrating", total=None)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=label, completed=done, total=total)
            if not console.is_terminal and done < total:
                console.print(f"[{done + 1}/{total}] {label}")

        try:
            result = asyncio.run(calibrate(options, progress))
        except (ServerError, ValueError) as exc:
            return fail(str(exc), status=1)
    print(result.table())
    fit = result.fit
    print(f"\nKV cache: {result.kv_source}; terms fixed at 0: {', '.join(fit.fixed) or 'none'}")
    for note in result.notes:
        print(f"note: {note}")
    out = Path(args.out)
    profile = replace(fit.profile, tokenizer=tokenizer)
    out.write_text(dump_profile(profile, result.document()))
    console.print(f"wrote {out} (profile {fit.profile.name})")
    return 0
