"""The sections of the gateway benchmark's Markdown report, one function each.

:func:`render_latency` (the latency runs: every target's TTFT and end-to-end time, what
the gateway adds over the ``direct, scraped`` baseline, whether the load generator kept
up), :func:`render_throughput` (requests/s of every router, and the ratios to
vllm-router), :func:`render_profiles` (where the gateway's core goes) and
:func:`render_goals` (the issue's goals, met or not). Each section states how its numbers
were produced, from the same constants the measurements use.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.bench.gateway.latency import LatencyRun
from sluicegate.bench.gateway.profile import OTHER
from sluicegate.bench.gateway.settings import (
    BODY_VARIANTS,
    DIRECT_SCRAPED,
    LATENCY_TARGETS,
    MAX_TOKENS,
    PREFIX_BYTES,
    PREFIXES,
    PROMPT_BYTES,
    SIM_PROCESSES,
    SIM_PROFILE,
    SIM_REPLICAS,
    SIM_TIME_SCALE,
    Settings,
)
from sluicegate.bench.gateway.summary import (
    LatencyRow,
    added_latency,
    find_run,
    per_core,
    rps_ratio,
    throughput_rows,
)
from sluicegate.bench.gateway.throughput import ThroughputResults


def _ms(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1000:.2f}"


def _signed_ms(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1000:+.2f}".replace("-", "−")


def _us(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds * 1e6:.0f}"


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{share:.0%}"


def _goal(met: bool | None) -> str:
    return "not measured" if met is None else ("**met**" if met else "**not met**")


def _row_order(row: LatencyRow) -> tuple[int, int]:
    order = LATENCY_TARGETS.index(row.target) if row.target in LATENCY_TARGETS else 99
    return row.rate, order


def render_latency(
    settings: Settings, rows: Sequence[LatencyRow], runs: Sequence[LatencyRun]
) -> list[str]:
    """The latency section: every target's TTFT and e2e, what the gateway adds, and
    whether the load generator kept up."""
    lines = [
        "## Added latency, streaming, against a simulated pool",
        "",
        f"`sluicegate sim --replicas {SIM_REPLICAS // SIM_PROCESSES} --profile {SIM_PROFILE} "
        f"--time-scale {SIM_TIME_SCALE:g} --no-prefix-caching` "
        + (
            "(one process for all four replicas, "
            if SIM_PROCESSES == 1
            else f"({SIM_PROCESSES} processes, "
        )
        + "core 0; prefix caching off so that a replica's speed does not depend on which "
        "requests it gets). An open-loop "
        "load generator in the benchmark's process (uvloop + aiohttp, core 0) sends "
        f"streaming completions at Poisson arrivals: ~{PROMPT_BYTES} B prompts, each unique "
        f"from its first byte, `max_tokens` {MAX_TOKENS}, `ignore_eos`. Direct: round-robin "
        "over the replicas. Through the gateway: `sluicegate serve --config pool.yaml "
        "--policy PRESET` (core 1), default settings (metrics scraped every 50 ms). Each run: "
        f"{settings.latency_warmup_s:g} s warm-up, then {settings.latency_s:g} s measured; "
        "every target gets the same arrival times and prompts. TTFT = first SSE `data:` "
        "chunk, e2e = end of stream, both from the moment the request is sent; ms.",
        "",
        "| target | offered req/s | sent req/s | TTFT p50 | p90 | p99 | e2e p50 | p90 | p99 "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=_row_order):
        lines.append(
            f"| {r.target} | {r.rate} | {r.achieved_rate:.0f} | "
            + " | ".join(_ms(v) for v in (*r.ttft, *r.e2e))
            + f" | {r.errors} |"
        )
    lines += [
        "",
        "**Added by the gateway**: through-gateway minus the `direct, scraped` baseline "
        "(straight to the replicas while an idle gateway scrapes them every 50 ms, as the "
        "gateways under test do: a scrape of the simulator, ~40 KB of exposition rendered in "
        "Python, holds up the simulator's event loop for a couple of ms — the replicas' "
        "cost of being scraped, not time spent in the gateway); paired run by "
        "run, median of the runs with the lowest and highest in brackets; ms. The "
        "`scraping alone` rows are that scrape cost (`direct, scraped` minus `direct`). Then "
        "the gateway's own `sluicegate_gateway_overhead_seconds` histogram (handler entry to "
        "calling the upstream, estimated from its buckets), µs, and its CPU:",
        "",
        "| added by | req/s | TTFT p50 | TTFT p99 | e2e p50 | e2e p99 | in-gateway mean µs "
        "| p50 µs | p99 µs | gateway CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(added: dict[str, tuple[float, float, float]], key: str) -> str:
        if key not in added:
            return "–"
        mid, low, high = added[key]
        spread = (
            f" ({_signed_ms(low)} … {_signed_ms(high)})" if settings.latency_repeats > 1 else ""
        )
        return _signed_ms(mid) + spread

    keys = ("ttft p50", "ttft p99", "e2e p50", "e2e p99")
    for r in sorted(rows, key=_row_order):
        if r.target == "direct":
            continue
        if r.target == DIRECT_SCRAPED:
            added = added_latency(runs, DIRECT_SCRAPED, r.rate, "direct")
            label = "scraping alone"
        else:
            added = added_latency(runs, r.target, r.rate)
            label = f"gateway, {r.target}"
        overhead = r.overhead or (float("nan"),) * 3
        lines.append(
            f"| {label} | {r.rate} | "
            + " | ".join(cell(added, k) for k in keys)
            + " | "
            + " | ".join(_us(v) for v in overhead)
            + f" | {_pct(r.gateway_cpu)} |"
        )
    lines += [
        "",
        "Is the load generator keeping up? p99 lateness of a request's send versus its "
        "schedule, the generator's and the simulator's CPU (core 0 holds both); and "
        "connections the machine dropped on full listen queues during these runs (all "
        "processes', summed over the runs: each drop costs a client a 1 s SYN retransmit):",
        "",
        "| target | req/s | send lateness p99 ms | generator CPU | simulator CPU "
        "| listen-queue drops |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=_row_order):
        lines.append(
            f"| {r.target} | {r.rate} | {_ms(r.lag_p99)} | {_pct(r.generator_cpu)} | "
            f"{_pct(r.sim_cpu)} | {r.listen_overflows} |"
        )
    lines.append("")
    return lines


def render_throughput(settings: Settings, results: ThroughputResults) -> list[str]:
    """The requests/s section: every router's best run and the ratios to vllm-router."""
    lines = [
        "## Maximum requests/s on one core",
        "",
        f"The router pinned to core 1; `wrk -t1 -c{settings.connections}` and nginx on core 0. "
        f"nginx mocks {SIM_REPLICAS} vLLM replicas (one process, `return 200` of a fixed "
        "body): `json` replicas answer a completion JSON (~400 B), `sse` replicas a stream of "
        f"{MAX_TOKENS} SSE events + `[DONE]` (~3.5 KB, one write); all serve a static "
        "`/metrics` (the load, KV and cache-config lines of a vLLM 0.32 scrape), "
        "`/v1/models` and `/health`. wrk rotates "
        f"{BODY_VARIANTS} bodies: ~{PROMPT_BYTES} B prompts over {PREFIXES} shared "
        f"{PREFIX_BYTES} B prefixes, so cache-aware policies match real prefixes. "
        f"{settings.throughput_warmup_s} s warm-up, {settings.throughput_s} s measured, the "
        "router restarted for every run. `direct` = wrk straight to one mock replica: the "
        "ceiling of the load generator and mock. vllm-router runs with `--log-level "
        "warning` and its defaults otherwise (its Prometheus exporter on, like ours).",
        "",
    ]
    for note in results.notes:
        lines += [f"> {note}", ""]
    rows = throughput_rows(results.runs)
    if not rows:
        return [*lines, "Nothing was measured.", ""]
    lines += [
        "`router CPU` is the share of its core the router process used (all threads); "
        "`req per CPU-s` = req/s ÷ that share, the rate one whole core would give when other "
        "work on the machine took part of it.",
        "",
        "| router | answers | req/s | latency p50 ms | p90 | p99 | router CPU | req per CPU-s "
        "| non-2xx | socket errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        w = r.result
        pc = per_core(r)
        lines.append(
            f"| {r.router} | {r.mode} | {w.rps:,.0f} | {_ms(w.p50)} | {_ms(w.p90)} | "
            f"{_ms(w.p99)} | {_pct(r.router_cpu)} | {'–' if pc is None else f'{pc:,.0f}'} | "
            f"{w.non_2xx} | {w.socket_errors} |"
        )
    if settings.repeats > 1:
        lines += ["", "Every run's req/s, in order:", ""]
        for key in {(r.router, r.mode): None for r in results.runs}:
            values = [f"{r.result.rps:,.0f}" for r in results.runs if (r.router, r.mode) == key]
            lines.append(f"- {key[0]} ({key[1]}): {', '.join(values)}")
    lines += [
        "",
        "Ratios (sluicegate ÷ vllm-router, best runs), of req/s and of req per CPU-s:",
        "",
        "| comparison | answers | req/s ratio | per CPU-s ratio | goal |",
        "|---|---|---|---|---|",
    ]
    for mode in dict.fromkeys(r.mode for r in rows):
        for ours, theirs, goal in (
            ("sluicegate default", "vllm-router cache_aware", 1.0),
            ("sluicegate round-robin", "vllm-router round_robin", 0.5),
            ("sluicegate default", "vllm-router round_robin", None),
        ):
            a, b = find_run(rows, ours, mode), find_run(rows, theirs, mode)
            ratio, norm = rps_ratio(a, b), rps_ratio(a, b, normalized=True)
            if ratio is None:
                continue
            verdict = "–" if goal is None else f"≥ {goal:g}: {_goal(ratio >= goal)}"
            if goal is not None and norm is not None:
                verdict += f" (per CPU-s: {_goal(norm >= goal)})"
            lines.append(
                f"| {ours} ÷ {theirs} | {mode} | {ratio:.2f} | "
                f"{'–' if norm is None else f'{norm:.2f}'} | {verdict} |"
            )
    lines.append("")
    return lines


def render_profiles(results: ThroughputResults) -> list[str]:
    """Where the gateway's core goes (nothing without profiles)."""
    if not results.profiles:
        return []
    lines = [
        "## Where the gateway's core goes",
        "",
        "py-spy (`record --rate 100 --format raw`, on core 0) sampling the saturated gateway "
        "(wrk as above). A sample counts for the innermost frame that belongs to one of "
        "these groups; frames of the standard library, multidict, yarl and aiohttp's shared "
        "HTTP helpers pass it to their caller. Python frames only: time inside C code "
        "(uvloop, the HTTP parser, orjson) is charged to the Python frame that called it, "
        "and samples outside any handler (the event loop itself, transport writes) to "
        f"'{OTHER}'.",
        "",
    ]
    names = list(results.profiles)
    header = "| share of samples | " + " | ".join(names) + " |"
    lines += [header, "|---|" + "---|" * len(names)]
    categories = dict.fromkeys(c for p in results.profiles.values() for c, _ in p.categories)
    for cat in categories:
        cells = []
        for p in results.profiles.values():
            share = dict(p.categories).get(cat, 0.0)
            cells.append(f"{share:.0%}")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    lines.append(
        "| *(samples; gateway CPU; req/s while sampled)* | "
        + " | ".join(
            f"{p.samples} ({p.errors} errors); {p.cpu:.0%}; {p.rps:,.0f}"
            for p in results.profiles.values()
        )
        + " |"
    )
    for name, p in results.profiles.items():
        lines += [
            "",
            f"Hottest functions, `{name}` — own time, then sluicegate functions by time on "
            "the stack:",
            "",
            "| own time | function | | on stack | sluicegate function |",
            "|---|---|---|---|---|",
        ]
        for i in range(max(len(p.top_self), len(p.top_ours))):
            a = p.top_self[i] if i < len(p.top_self) else ("", 0.0)
            b = p.top_ours[i] if i < len(p.top_ours) else ("", 0.0)
            lines.append(
                f"| {a[1]:.1%} | `{a[0]}` | | {b[1]:.1%} | `{b[0]}` |"
                if a[0] and b[0]
                else f"| {a[1]:.1%} | `{a[0]}` | | | |"
                if a[0]
                else f"| | | | {b[1]:.1%} | `{b[0]}` |"
            )
    lines.append("")
    return lines


def render_goals(
    rows: Sequence[LatencyRow], runs: Sequence[LatencyRun], results: ThroughputResults
) -> list[str]:
    """Every goal of the issue, met or not."""
    lines = ["## Goals", ""]
    for r in sorted(rows, key=lambda r: (r.target, r.rate)):
        if r.target in ("direct", DIRECT_SCRAPED):
            continue
        added = added_latency(runs, r.target, r.rate)
        p50 = added.get("e2e p50", (float("nan"),))[0]
        p99 = added.get("e2e p99", (float("nan"),))[0]
        t50 = added.get("ttft p50", (float("nan"),))[0]
        t99 = added.get("ttft p99", (float("nan"),))[0]
        ok50 = max(p50, t50) <= 0.001 if p50 == p50 else None
        ok99 = max(p99, t99) <= 0.005 if p99 == p99 else None
        lines.append(
            f"- Added latency (vs `direct, scraped`), `{r.target}` at {r.rate} req/s: "
            f"p50 {_signed_ms(t50)} ms TTFT / "
            f"{_signed_ms(p50)} ms e2e (≤ 1 ms: {_goal(ok50)}); p99 {_signed_ms(t99)} ms TTFT / "
            f"{_signed_ms(p99)} ms e2e (≤ 5 ms: {_goal(ok99)})."
        )
    tr = throughput_rows(results.runs)
    for mode in dict.fromkeys(r.mode for r in tr):
        parts = []
        for ours, theirs, goal in (
            ("sluicegate default", "vllm-router cache_aware", 1.0),
            ("sluicegate round-robin", "vllm-router round_robin", 0.5),
        ):
            a, b = find_run(tr, ours, mode), find_run(tr, theirs, mode)
            ratio, norm = rps_ratio(a, b), rps_ratio(a, b, normalized=True)
            text = f"{ours} ÷ {theirs} = " + ("–" if ratio is None else f"{ratio:.2f}")
            text += f" (≥ {goal:g}: {_goal(None if ratio is None else ratio >= goal)}"
            if norm is not None:
                text += f"; per CPU-s {norm:.2f}, {_goal(norm >= goal)}"
            parts.append(text + ")")
        lines.append(f"- Requests/s on one core ({mode} answers): " + "; ".join(parts) + ".")
    lines.append("")
    return lines
