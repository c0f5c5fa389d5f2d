"""The PNG plots of a run's results (``latency.png``, ``throughput.png``,
``replicas.png``); :mod:`sluicegate.bench.report` writes them with the report. Needs the
bench extra's matplotlib (imported when plotting)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicegate.bench.extras import PLOTS, bench_extra

if TYPE_CHECKING:  # matplotlib is an optional extra, imported when plotting
    from matplotlib.axes import Axes


def run_label(run: dict[str, Any]) -> str:
    """The policy of a run, with "+ flow control" when it was on and its gateway replicas
    when it had several (count, state, and the spread unless round-robin)."""
    label = str(run["policy"]) + (" + flow control" if run.get("flow_control") else "")
    n = run.get("gateway_replicas", 1)
    if n > 1:
        spread = run.get("replica_spread", "round-robin")
        label += f" × {n} gw {run.get('replica_state', 'independent')}"
        label += f" by {spread}" if spread != "round-robin" else ""
    return label


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


__all__ = ["Getter", "plots", "run_label"]
