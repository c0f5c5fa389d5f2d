"""Where the gateway's core goes: py-spy sampling the gateway while wrk saturates it.

``py-spy record --rate 100 --format raw`` (core ``OTHER_CPU``) samples a
``sluicegate serve`` started as in the throughput runs, under the same wrk load.
:func:`summarize_folded` turns the folded stacks into shares of samples: by group
(``_CATEGORIES``: the innermost frame whose file matches decides; frames of the standard
library, multidict, yarl and aiohttp's shared HTTP helpers pass the sample to their
caller; the rest is ``OTHER``), the hottest functions by own time, and the hottest
sluicegate functions by time on the stack. Python frames only: time in C code is charged
to the Python frame that called it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluicegate.bench.gateway.routers import start_router
from sluicegate.bench.gateway.settings import OTHER_CPU, ROOT, Settings
from sluicegate.bench.loadgen import wrk
from sluicegate.bench.processes import Processes, cpu_seconds, pinned


def py_spy_binary() -> str | None:
    """``py-spy`` from ``.venv-bench/`` or the PATH."""
    local = ROOT / ".venv-bench" / "bin" / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


# Where a sample's time goes: the innermost frame whose file matches decides (frames of
# files matching none — the standard library, multidict, yarl, aiohttp's shared HTTP
# helpers — pass the sample on to their caller). Checked in order.
_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging", ("/logging/",)),
    (
        "metrics (ours, prometheus_client)",
        ("prometheus_client/", "sluicegate/metrics", "sluicegate/instruments"),
    ),
    ("metric scrapes (collector, parser)", ("sluicegate/datalayer/",)),
    ("request parse + model lookup", ("sluicegate/requestcontrol/parse", "sluicegate/tokens")),
    (
        "routing (runtime, director, scheduler, prefix index)",
        (
            "sluicegate/runtime",
            "sluicegate/requestcontrol/",
            "sluicegate/scheduling/",
            "sluicegate/flowcontrol/",
            "sluicegate/latency/",
        ),
    ),
    ("HTTP server (ours)", ("sluicegate/gateway/http",)),
    ("proxy relay (ours)", ("sluicegate/gateway/proxy",)),
    ("request handler (ours)", ("sluicegate/gateway/app",)),
    ("upstream client (ours: requests and scrapes)", ("sluicegate/upstream/",)),
    ("aiohttp server", ("aiohttp/web_",)),
)
OTHER = "event loop, transports, asyncio"


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    """A py-spy sampling of the gateway under wrk load. Shares are of non-idle samples."""

    samples: int
    errors: int
    cpu: float
    """Share of its core the gateway used while sampled."""
    rps: float
    categories: tuple[tuple[str, float], ...]
    top_self: tuple[tuple[str, float], ...]
    """Functions by share of samples spent in their own code (innermost frame)."""
    top_ours: tuple[tuple[str, float], ...]
    """sluicegate functions by share of samples with them on the stack."""


def _frame_file(frame: str) -> str:
    start = frame.rfind(" (")
    return frame[start + 2 : -1] if start >= 0 else frame


def _category(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        path = _frame_file(frame)
        for name, needles in _CATEGORIES:
            if any(n in path for n in needles):
                return name
    return OTHER


def _short(frame: str) -> str:
    """``Function (pkg/module.py:123)`` without the line number."""
    return re.sub(r":\d+\)$", ")", frame)


@dataclass(frozen=True, slots=True)
class FoldedSummary:
    """Shares (0..1) of the samples in py-spy's folded (``raw``) output."""

    samples: int
    categories: tuple[tuple[str, float], ...]
    top_self: tuple[tuple[str, float], ...]
    top_ours: tuple[tuple[str, float], ...]


def summarize_folded(folded: str, top: int = 12) -> FoldedSummary:
    """Categories (see ``_CATEGORIES``), hottest functions by own time, and hottest
    sluicegate functions by time on the stack, from folded stacks (``a;b;c COUNT``)."""
    categories: Counter[str] = Counter()
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        categories[_category(frames)] += count
        own[_short(frames[-1])] += count
        for name in {_short(f) for f in frames if "sluicegate/" in _frame_file(f)}:
            if "sluicegate/cli/" not in name and "sluicegate/__main__" not in name:
                ours[name] += count

    def shares(counter: Counter[str], limit: int | None) -> tuple[tuple[str, float], ...]:
        return tuple((k, v / total) for k, v in counter.most_common(limit)) if total else ()

    return FoldedSummary(total, shares(categories, None), shares(own, top), shares(ours, top))


def profile_gateway(
    procs: Processes,
    workdir: Path,
    settings: Settings,
    preset: str,
    urls: Sequence[str],
    script: str,
) -> ProfileSummary | None:
    """py-spy (core ``OTHER_CPU``) samples the gateway while wrk saturates it."""
    spy = py_spy_binary()
    if spy is None:
        return None
    name = f"sluicegate-{preset}"
    url = start_router(procs, workdir, "sluicegate", preset, urls)
    try:
        pid = procs.procs[name].pid
        wrk(url, script, settings.connections, settings.throughput_warmup_s, OTHER_CPU)
        out = workdir / f"profile-{preset}.txt"
        cmd = [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(settings.profile_s),
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            str(out),
        ]
        sampler = subprocess.Popen(
            pinned(cmd, OTHER_CPU), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            cpu0 = cpu_seconds(pid)
            result = wrk(url, script, settings.connections, settings.profile_s + 1, OTHER_CPU)
            cpu = (cpu_seconds(pid) - cpu0) / result.seconds
            log, _ = sampler.communicate(timeout=settings.profile_s + 30)
        finally:
            if sampler.poll() is None:
                sampler.kill()
                sampler.wait()
        text = log.decode(errors="replace")
        m = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        if not out.exists():
            (workdir / f"profile-{preset}-failure.txt").write_text(text)
            return None
        folded = summarize_folded(out.read_text())
        return ProfileSummary(
            folded.samples,
            int(m.group(2)) if m else 0,
            cpu,
            result.rps,
            folded.categories,
            folded.top_self,
            folded.top_ours,
        )
    finally:
        procs.stop(name)
