"""The shipped Grafana dashboard's metric names, and checks of a ``/metrics`` exposition
against them (used by the gateway and the endpoint-picker dashboard tests)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "sluicegate.json"

_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "deriv", "delta",
    "histogram_quantile", "topk", "bottomk", "by", "without", "on", "ignoring", "and", "or",
    "unless", "group_left", "group_right", "max_over_time", "min_over_time", "avg_over_time",
    "label_values", "clamp_min", "clamp_max", "abs", "vector", "scalar", "time", "offset",
}  # fmt: skip
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, label names,
    strings, ranges and Grafana variables left out)."""
    if expr.lstrip().startswith("label_values("):  # a variable's query: (metric, label)
        return set(_LABEL_VALUES.findall(expr))
    names: set[str] = set()
    text = _STRINGS.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\$\w+", " ", text)
    for match in _IDENT.finditer(text):
        word = match.group()
        following = text[match.end() :].lstrip()
        if word in _KEYWORDS or following.startswith("("):
            continue
        names.add(word)
    return names


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def panel_names() -> dict[str, set[str]]:
    """Metric name → titles of the panels (or variables) that read it."""
    out: dict[str, set[str]] = {}
    data = dashboard()
    for panel in _panels(data["panels"]):
        for target in panel.get("targets", []):
            for name in metric_names(target["expr"]):
                out.setdefault(name, set()).add(panel["title"])
    for variable in data["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            for name in metric_names(query["query"]):
                out.setdefault(name, set()).add(f"${variable['name']}")
    return out


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


_SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count"),
    "counter": ("_total",),
    "summary": ("_sum", "_count"),
}


def resolve(name: str, exposed: dict[str, Metric]) -> Metric | None:
    """The family a series name belongs to (``x_bucket`` → histogram ``x``, ...)."""
    family = exposed.get(name)
    if family is not None and family.type not in ("counter", "histogram"):
        return family
    for f in exposed.values():
        if any(name == f.name + suffix for suffix in _SUFFIXES.get(f.type, ())):
            return f
    return None


BOUNDED_LABELS = {
    # label → why its values are bounded (a new label must be argued for here)
    "model_name": "configured or served models; a name nothing serves is _unknown",
    "target_model_name": "configured or served models",
    "error_code": "HTTP status codes",
    "name": "configured pools",
    "inference_pool": "configured pools",
    "pool": "configured pools",
    "model_server_pod": "the pools' endpoints",
    "endpoint": "the pools' endpoints",
    "accelerator": "one hardware class per endpoint (configured or from its pod's labels)",
    "reason": "fixed reason names",
    "kind": "fixed failure kinds",
    "status": "success / failure; HTTP status codes (the picker's own answers)",
    "phase": "request / response",
    "outcome": "the reference's queue outcomes",
    "priority": "configured objectives' priorities",
    "fairness_id": "client header: at most 1,000 series per family (then _other), 100 "
    "flows per band in the queue gauges",
    "type": "ttft / tpot",
    "extension_point": "fixed extension points",
    "plugin_type": "configured plugins",
    "plugin_name": "configured plugins",
    "commit": "one build",
    "build_ref": "one build",
    "target": "ttft / tpot",
    "split": "train / test",
    "score": "mape / coverage",
    "le": "histogram buckets",
}


def unbounded_labels(exposed: dict[str, Metric]) -> dict[str, set[str]]:
    """Family → its labels that :data:`BOUNDED_LABELS` does not argue for."""
    out: dict[str, set[str]] = {}
    for family in exposed.values():
        for s in family.samples:
            extra = set(s.labels) - set(BOUNDED_LABELS)
            if extra:
                out.setdefault(family.name, set()).update(extra)
    return out


def without_help(exposed: dict[str, Metric]) -> list[str]:
    return [f.name for f in exposed.values() if not f.documentation.strip()]
