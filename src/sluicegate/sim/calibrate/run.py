"""``sluicegate sim calibrate``: the probe plan, its run within a time budget, the fit and
the profile file.

The plan is sized from the server: ``max_model_len`` from ``/v1/models``, the KV cache
(``num_gpu_blocks`` × ``block_size``) from ``vllm:cache_config_info``, and the scheduler
limits the caller states (``max_num_seqs``, ``max_num_batched_tokens``: vLLM does not
export them; default the base profile's). Probes run cheapest first — idle prefills,
cached-prefix prefills, decode batches at a short then a long context, a decode batch with
prefills mixed in — and the run stops starting probes once ``budget_s`` has passed.
"""

from __future__ import annotations

import asyncio
import re
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial

import aiohttp

from sluicegate.sim.calibrate.client import Target
from sluicegate.sim.calibrate.fit import Fit, fit_profile
from sluicegate.sim.calibrate.probes import Point, Prober
from sluicegate.sim.profiles import EngineProfile, get_profile

PREFILL_LENGTHS = (32, 128, 512, 2048, 8192)
CACHED_NEW_TOKENS = (128, 512)
CACHED_PREFIX_TOKENS = 2048
SHORT_CONTEXT = 32
LONG_CONTEXT = 1024
MIXED_TOKENS = 512
"""Tokens of a mixed iteration: ``B`` decoding plus a prefill of ``512 − B``, so it lands
on the knot of the 512-token idle prefill."""


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    """What ``sluicegate sim calibrate`` is told. Times in seconds."""

    target: str
    model: str | None = None
    base: str = "llama3-8b-h100"
    """Built-in profile giving the model shape (layers, hidden size, KV bytes per token),
    LoRA settings and any limit neither the server nor these options state."""
    name: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    budget_s: float = 180.0
    batch_sizes: tuple[int, ...] = (1, 8, 32, 128)
    decode_tokens: int = 48
    repeats: int = 3
    passes: int = 2
    """Times the whole plan runs (budget permitting); a point is the median over passes,
    so a burst of other load on the host spoils one pass's value, not the point."""
    time_scale: float = 1.0
    """Wall seconds per simulated second of a ``sluicegate sim --time-scale`` target."""
    timeout_s: float = 120.0
    seed: int = 0


@dataclass(slots=True)
class Calibration:
    fit: Fit
    points: list[Point]
    notes: list[str] = field(default_factory=list)
    target: str = ""
    kv_source: str = ""

    def errors(self) -> list[tuple[Point, float, float]]:
        """(point, fitted ms, relative error) per measured point."""
        out = []
        for p in self.points:
            fitted = self.fit.predict_ms(p)
            out.append((p, fitted, (fitted - p.measured_ms) / p.measured_ms))
        return out

    def table(self) -> str:
        """The fit's error per point, as a Markdown table."""
        lines = [
            "| point | tokens | measured ms | fitted ms | error | samples | source |",
            "|---|---|---|---|---|---|---|",
        ]
        for p, fitted, err in self.errors():
            lines.append(
                f"| {p.label} | {p.batched_tokens} | {p.measured_ms:.3f} | {fitted:.3f} | "
                f"{err * 100:+.1f} % | {p.samples} | {p.source} |"
            )
        return "\n".join(lines)

    def document(self) -> dict[str, object]:
        """The ``calibration`` section of the profile file."""
        fit = self.fit
        return {
            "target": self.target,
            "kv_cache": self.kv_source,
            "fixed_at_zero": list(fit.fixed),
            "notes": list(self.notes),
            "points": [
                {
                    "point": p.label,
                    "batched_tokens": p.batched_tokens,
                    "decode_seqs": p.decode_seqs,
                    "decode_context": p.decode_context,
                    "prefill_chunks": [list(c) for c in p.chunks],
                    "measured_ms": round(p.measured_ms, 4),
                    "fitted_ms": round(fitted, 4),
                    "error": round(err, 4),
                    "samples": p.samples,
                    "source": p.source,
                }
                for p, fitted, err in self.errors()
            ],
        }


Step = tuple[str, Callable[[], Awaitable[list[Point]]]]
Progress = Callable[[str, int, int], None]
"""(label of the probe starting, probes done, probes planned)."""


def _one(p: Point | None) -> list[Point]:
    return [] if p is None else [p]


def plan(prober: Prober, o: CalibrateOptions, profile: EngineProfile, max_len: int) -> list[Step]:
    """The probes for a server with ``profile``'s limits and ``max_len`` tokens per request."""
    budget = profile.max_num_batched_tokens
    kv = profile.kv_capacity_tokens
    d = o.decode_tokens
    longest = min(budget, max_len - 2)
    batches = sorted({b for b in o.batch_sizes if 1 <= b <= profile.max_num_seqs})
    wanted = {*batches, *(n for n in PREFILL_LENGTHS if n <= longest)}
    if longest > max(wanted) and longest < PREFILL_LENGTHS[-1]:
        # the longest prompt the server takes, when no probe length reaches it: the fit
        # then interpolates, rather than extrapolates, every prompt the server can run
        wanted.add(longest)
    lengths = sorted(wanted)
    steps: list[Step] = []
    for n in lengths:
        steps.append((f"prefill {n}", partial(_wrap, prober.prefill, n, o.repeats)))
    bs = profile.block_size
    for c in CACHED_NEW_TOKENS:
        p = min(CACHED_PREFIX_TOKENS, max_len - c - 2) // bs * bs
        if c <= budget and p >= bs:
            steps.append(
                (
                    f"prefill {c} after {p} cached",
                    partial(_wrap, prober.cached_prefill, c, p, o.repeats),
                )
            )
    for context in (SHORT_CONTEXT, LONG_CONTEXT):
        for b in batches:
            ctx = min(context, max_len - 2 * d - 2, int(0.8 * kv / b) - 2 * d)
            if context == LONG_CONTEXT and ctx < 4 * SHORT_CONTEXT:
                continue
            if ctx < 2:
                continue
            # the batch prefills in ceil(B·ctx / budget) iterations before all decode:
            # longer outputs keep d iterations of the whole batch decoding
            tokens = min(d + -(-b * ctx // budget), max_len - ctx - 2, int(0.9 * kv / b) - ctx)
            steps.append((f"decode B={b} ctx={ctx}", partial(prober.decode, b, ctx, tokens)))
    # Below max_num_seqs: the mixed-in prefill must be scheduled beside the decoders.
    mixers = [b for b in batches if 2 <= b <= min(32, profile.max_num_seqs - 1)]
    knots = [n for n in lengths if n <= min(budget, MIXED_TOKENS)]
    if mixers and knots and knots[-1] > mixers[-1] and kv > mixers[-1] * (SHORT_CONTEXT + 4 * d):
        b, n = mixers[-1], knots[-1]
        steps.append(
            (
                f"decode B={b} + prefill {n - b}",
                partial(prober.decode, b, SHORT_CONTEXT, 4 * d, o.repeats, n - b),
            )
        )
    return steps


async def _wrap(probe: Callable[..., Awaitable[Point | None]], *args: int) -> list[Point]:
    return _one(await probe(*args))


async def calibrate(o: CalibrateOptions, progress: Progress | None = None) -> Calibration:
    """Probe ``o.target``, fit, and return the calibration (nothing is written)."""
    base = get_profile(o.base)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + o.budget_s
    connector = aiohttp.TCPConnector(limit=0)  # a decode batch opens one connection per request
    async with aiohttp.ClientSession(connector=connector) as session:
        target = Target(session, o.target, o.timeout_s)
        cards = await target.models()
        card = next((c for c in cards if c.get("id") == o.model), None) if o.model else cards[0]
        if card is None:
            names = ", ".join(str(c.get("id")) for c in cards)
            raise ValueError(f"--model {o.model!r} is not served; the server has: {names}")
        model = str(card["id"])
        max_len = card.get("max_model_len")
        max_len = int(max_len) if isinstance(max_len, int) else base.max_model_len
        profile, kv_source = await _limits(target, o, base, model, max_len)
        prober = Prober(target, model, o.time_scale, o.seed)
        await target.complete(model, prober.prompt(16), 2)  # warm-up: first-request costs
        steps = plan(prober, o, profile, max_len) * o.passes
        points: list[Point] = []
        for i, (label, run) in enumerate(steps):
            if loop.time() > deadline:
                prober.notes.append(f"time budget spent: {len(steps) - i} probe(s) not run")
                break
            if progress is not None:
                progress(label, i, len(steps))
            points.extend(replace(p, probe=label) for p in await run())
        if progress is not None:
            progress("fitting", len(steps), len(steps))
    outside = statistics.median(prober.outside_ms) if prober.outside_ms else 0.0
    if prober.outside_ms:
        prober.notes.append(
            f"request_overhead_ms {outside:.3f}: the server's TTFT exceeds its prefill time "
            f"by this median on an idle server ({len(prober.outside_ms)} prefills; API "
            "server, scheduling, transfer)"
        )
    else:
        prober.notes.append(
            "request_overhead_ms 0: the server exports no TTFT and prefill-time histograms"
        )
    merged = merge_passes(points)
    fit = fit_profile(merged, profile, max(0.0, outside))
    if fit.o_ms > 0:
        prober.notes.append(
            f"first-token latency o {fit.o_ms:.3f} ms (prefill times beyond their iterations, "
            f"fitted): request_overhead_ms {fit.profile.request_overhead_ms:.3f} in all"
        )
    return Calibration(fit, merged, prober.notes, o.target, kv_source)


def merge_passes(points: list[Point]) -> list[Point]:
    """One point per probe and kind: the median of its passes' values (contexts, which
    differ by a token or two between passes, averaged)."""
    groups: dict[tuple[object, ...], list[Point]] = {}
    for p in points:
        key = (p.probe, p.kind, p.batched_tokens, p.chunks)
        groups.setdefault(key, []).append(p)
    return [
        replace(
            g[0],
            measured_ms=statistics.median(p.measured_ms for p in g),
            decode_context=round(statistics.mean(p.decode_context for p in g)),
            samples=sum(p.samples for p in g),
        )
        for g in groups.values()
    ]


async def _limits(
    target: Target, o: CalibrateOptions, base: EngineProfile, model: str, max_len: int
) -> tuple[EngineProfile, str]:
    """``base`` with the server's KV cache and length limit and the stated scheduler limits."""
    scrape = await target.scrape()
    info = scrape.cache_config if scrape is not None else {}
    blocks, block_size = info.get("num_gpu_blocks", ""), info.get("block_size", "")
    if blocks.isdigit() and block_size.isdigit():
        kv = (int(blocks), int(block_size))
        source = f"vllm:cache_config_info: {blocks} blocks × {block_size} tokens"
    else:
        kv = (base.num_gpu_blocks, base.block_size)
        source = f"not exported by the server: {o.base}'s {kv[0]} blocks × {kv[1]} tokens"
    slug = re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    profile = replace(
        base,
        name=o.name or f"calibrated-{slug}",
        description=f"{model} calibrated against {o.target} ({stamp})",
        model_name=model,
        num_gpu_blocks=kv[0],
        block_size=kv[1],
        max_model_len=max_len,
        max_num_seqs=o.max_num_seqs or base.max_num_seqs,
        max_num_batched_tokens=o.max_num_batched_tokens or base.max_num_batched_tokens,
        # the server's hardware is not the base's, and it does not say what it is: a
        # user names it (and its price) in the written file
        accelerator=None,
        cost_per_hour=None,
    )
    return profile, source
