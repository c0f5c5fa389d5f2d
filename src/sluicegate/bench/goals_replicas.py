"""The gateway-replica goals (``docs/benchmarks/replicas/``): several replicas sharing
state route about as well as one.

For every run with more than one gateway replica, its headline number is compared with the
one-replica run of the same policy, level and flow-control setting in the same results:

- ``multi-turn-chat``: the engines' prefix-cache hit rate; shared replicas reach at least
  97 % of one replica's (within 3 %, relative);
- ``slo-mixed``: SLO attainment; shared replicas lose at most 2 points;
- ``priority-overload`` (flow control on): Critical requests' mean TTFT; shared replicas
  keep the scenario's own goal (at most 30 % of Standard's), the ratio to one replica is
  reported beside it.

Independent replicas (no sharing: the state of the art) are reported beside, never judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluicegate.bench.goals import Verdict

HIT_RATE_SHORTFALL = 0.03
"""Shared replicas' prefix hit rate may be this much below one replica's (relative)."""
ATTAINMENT_POINTS = 0.02
"""Shared replicas' SLO attainment may be this much below one replica's (absolute)."""
CRITICAL_OF_STANDARD = 0.30
"""Critical mean TTFT at most this share of Standard's (the priority-overload goal)."""


@dataclass(frozen=True, slots=True)
class _Headline:
    what: str
    value: Callable[[dict[str, Any]], float | None]
    """The number, from a run's metrics (None: it has none)."""
    ok: Callable[[dict[str, Any], dict[str, Any]], bool | None]
    """Whether a shared run (second) meets the goal against one replica (first)."""
    fmt: Callable[[float], str]
    flow_control: bool = False


def _critical_ttft(m: dict[str, Any]) -> float | None:
    c = m["by_class"].get("Critical")
    return None if not c else c["ttft_s"]["mean"]


def _critical_share(m: dict[str, Any]) -> float | None:
    classes = m["by_class"]
    c, s = classes.get("Critical"), classes.get("Standard")
    if not c or not s or c["ttft_s"]["mean"] is None or not s["ttft_s"]["mean"]:
        return None
    return float(c["ttft_s"]["mean"]) / float(s["ttft_s"]["mean"])


def _hit_ok(one: dict[str, Any], shared: dict[str, Any]) -> bool | None:
    a, b = one["engine_prefix_hit_rate"], shared["engine_prefix_hit_rate"]
    return None if not a else b >= a * (1 - HIT_RATE_SHORTFALL)


def _slo_ok(one: dict[str, Any], shared: dict[str, Any]) -> bool | None:
    a, b = one["slo_attainment"], shared["slo_attainment"]
    return None if a is None or b is None else b >= a - ATTAINMENT_POINTS


def _critical_ok(one: dict[str, Any], shared: dict[str, Any]) -> bool | None:
    share = _critical_share(shared)
    return None if share is None else share <= CRITICAL_OF_STANDARD


HEADLINES: dict[str, _Headline] = {
    "multi-turn-chat": _Headline(
        "prefix hit rate ≥ 97 % of one replica's",
        lambda m: m["engine_prefix_hit_rate"],
        _hit_ok,
        lambda v: f"{v:.1%}",
    ),
    "slo-mixed": _Headline(
        "SLO attainment ≥ one replica's − 2 points",
        lambda m: m["slo_attainment"],
        _slo_ok,
        lambda v: f"{v:.1%}",
    ),
    "priority-overload": _Headline(
        "Critical mean TTFT ≤ 30 % of Standard's",
        _critical_ttft,
        _critical_ok,
        lambda v: f"{v:.2f} s",
        flow_control=True,
    ),
}


def _key(run: dict[str, Any]) -> tuple[str, float, bool]:
    return run["policy"], float(run["load"]), bool(run.get("flow_control"))


def replica_verdicts(results: dict[str, Any]) -> list[Verdict]:
    """One verdict per (policy, level) that ran with shared replicas; the independent
    runs and the ratios in its numbers. Empty when no run had several replicas."""
    headline = HEADLINES.get(results["scenario"])
    runs = results["runs"]
    if headline is None or not any(r.get("gateway_replicas", 1) > 1 for r in runs):
        return []
    one = {_key(r): r["metrics"] for r in runs if r.get("gateway_replicas", 1) == 1}
    grouped: dict[tuple[str, float, bool], list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("gateway_replicas", 1) > 1 and bool(r.get("flow_control")) == (
            headline.flow_control
        ):
            grouped.setdefault(_key(r), []).append(r)
    verdicts = []
    for key, several in grouped.items():
        policy, level, _ = key
        goal = f"shared gateway replicas ({policy} @ {level:g}): {headline.what}"
        base = one.get(key)
        if base is None:
            verdicts.append(Verdict(goal, None, "no one-replica run to compare with"))
            continue
        base_value = headline.value(base)
        rows = [f"1: {_show(headline, base_value)}"]
        judged: list[bool | None] = []
        for r in sorted(several, key=lambda r: (r["gateway_replicas"], r["replica_state"])):
            m = r["metrics"]
            value = headline.value(m)
            rows.append(
                f"{r['gateway_replicas']} {r['replica_state']}: {_show(headline, value)}"
                + _ratio(value, base_value)
            )
            if r["replica_state"] == "shared":
                judged.append(headline.ok(base, m))
        verdicts.append(Verdict(goal, _all_met(judged), "; ".join(rows)))
    return verdicts


def _all_met(judged: list[bool | None]) -> bool | None:
    """False if any shared run failed; else None if one could not be judged (or none
    ran); else True."""
    if False in judged:
        return False
    if not judged or None in judged:
        return None
    return True


def _show(headline: _Headline, value: float | None) -> str:
    return "–" if value is None else headline.fmt(value)


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return ""
    return f" ({value / base:.3f}×)"


__all__ = ["ATTAINMENT_POINTS", "HEADLINES", "HIT_RATE_SHORTFALL", "replica_verdicts"]
