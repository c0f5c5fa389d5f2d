"""The report's plots: bars for a single load level, lines against load otherwise, value
axes from zero, series at one level drawn apart; and the short-window note."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from sluicegate.bench.report import _short_window_note
from sluicegate.bench.report_plots import _metric, _panel

POLICIES = ("random", "round-robin", "default")


def run(policy: str, load: float, p50: float, p90: float, window: float = 60.0) -> dict[str, Any]:
    lat = {"mean": p50, "p50": p50, "p90": p90, "p99": p90}
    return {
        "policy": policy,
        "load": load,
        "metrics": {"ttft_s": lat, "e2e_s": lat, "throughput_rps": load - 1, "window_s": window},
    }


def series(levels: tuple[float, ...]) -> dict[str, list[dict[str, Any]]]:
    # 40 ± a little: the values that made the old plots' 38-42 axes.
    return {
        p: [run(p, level, 40.0 + i * 0.1, 41.0 + i * 0.1) for level in levels]
        for i, p in enumerate(POLICIES)
    }


@pytest.fixture
def ax() -> Iterator[Any]:
    fig, axis = plt.subplots()
    yield axis
    plt.close(fig)


QUANTILES = [("p50", _metric("ttft_s", "p50")), ("p90", _metric("ttft_s", "p90"))]


def test_a_single_level_is_drawn_as_bars_from_zero(ax: Any) -> None:
    _panel(ax, series((40.0,)), [40.0], QUANTILES, "req/s")
    assert len(ax.lines) == 0
    bars = [patch for container in ax.containers for patch in container]
    assert len(bars) == len(POLICIES) * len(QUANTILES)
    assert ax.get_ylim()[0] == 0
    assert ax.get_ylim()[1] > 41.2
    assert [t.get_text() for t in ax.get_xticklabels()] == list(POLICIES)
    assert ax.get_xlabel() == "at 40 req/s"
    heights = sorted(round(b.get_height(), 6) for b in bars)
    assert heights == [40.0, 40.1, 40.2, 41.0, 41.1, 41.2]
    # One bar per policy and quantile, side by side: no two share an x position.
    assert len({round(b.get_x(), 6) for b in bars}) == len(bars)


def test_several_levels_are_lines_apart_with_their_own_markers(ax: Any) -> None:
    levels = (20.0, 30.0, 40.0)
    _panel(ax, series(levels), list(levels), QUANTILES, "req/s")
    assert len(ax.lines) == len(POLICIES) * len(QUANTILES)
    assert ax.get_ylim()[0] == 0
    assert ax.get_xlabel() == "req/s"
    markers = {line.get_label().split()[0]: line.get_marker() for line in ax.lines}
    assert len(set(markers.values())) == len(POLICIES)
    firsts = {round(float(line.get_xdata()[0]), 6) for line in ax.lines}
    assert len(firsts) == len(POLICIES)  # each policy a little to the side at 20 req/s
    assert all(abs(x - 20.0) <= 0.15 * 10.0 / 2 + 1e-9 for x in firsts)
    styles = {line.get_label(): line.get_linestyle() for line in ax.lines}
    assert styles["default p50"] == "--"
    assert styles["default p90"] == "-"


def test_missing_values_leave_gaps(ax: Any) -> None:
    data = series((40.0,))
    data["default"][0]["metrics"]["ttft_s"] = dict.fromkeys(("mean", "p50", "p90", "p99"))
    _panel(ax, data, [40.0], QUANTILES, "req/s")
    heights = [patch.get_height() for c in ax.containers for patch in c]
    assert sum(h != h for h in heights) == 2  # NaN: no bar drawn
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("–") == 2


def test_short_window_note() -> None:
    long_window = {"runs": [run("default", 4.0, 5.0, 10.0, window=60.0)]}
    assert _short_window_note(long_window) == []
    short = {"runs": [run("default", 4.0, 5.0, 10.0, window=9.3)]}
    (_, note) = _short_window_note(short)
    assert "arrival window (9.3 s here)" in note
    assert "p90 E2E latency (10.00 s)" in note
