"""Fault injection for one simulated replica, settable at start and through ``/admin/faults``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(slots=True)
class Faults:
    """Misbehaviour to inject. All default to a healthy server.

    - ``error_rate``: share of generate requests (0..1) answered with ``error_status``;
    - ``latency_ms``: delay added before each generate request is processed;
    - ``hang``: accept generate requests and never answer them;
    - ``reset_after_tokens``: cut the connection after this many generated tokens
      (mid-stream for streaming requests, before the answer otherwise);
    - ``freeze_metrics``: keep serving the ``/metrics`` text captured when set;
    - ``kv_events_drop_rate``: share of KV-event batches (0..1) lost on the PUB socket (still
      buffered for replay), ``kv_events_reorder_rate``: share held back and sent after the
      next batch (:mod:`sluicegate.sim.kvevents`).
    """

    error_rate: float = 0.0
    error_status: int = 503
    latency_ms: float = 0.0
    hang: bool = False
    reset_after_tokens: int | None = None
    freeze_metrics: bool = False
    kv_events_drop_rate: float = 0.0
    kv_events_reorder_rate: float = 0.0

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``changes`` (a partial mapping); raises ``ValueError`` naming a bad field."""
        known = {f.name for f in fields(self)}
        for key in changes:
            if key not in known:
                raise ValueError(f"unknown fault {key!r}; known: {', '.join(sorted(known))}")
        merged = {**asdict(self), **changes}
        checked = Faults.validated(merged)
        for f in fields(self):
            setattr(self, f.name, getattr(checked, f.name))

    @staticmethod
    def validated(values: dict[str, Any]) -> Faults:
        rate, drop, reorder = (
            _share(values, name)
            for name in ("error_rate", "kv_events_drop_rate", "kv_events_reorder_rate")
        )
        status = values["error_status"]
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError("error_status must be an HTTP error status (400-599)")
        latency = values["latency_ms"]
        if isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0:
            raise ValueError("latency_ms must be a non-negative number")
        reset = values["reset_after_tokens"]
        if reset is not None and (
            isinstance(reset, bool) or not isinstance(reset, int) or reset < 0
        ):
            raise ValueError("reset_after_tokens must be null or a non-negative integer")
        for name in ("hang", "freeze_metrics"):
            if not isinstance(values[name], bool):
                raise ValueError(f"{name} must be true or false")
        return Faults(
            error_rate=rate,
            error_status=status,
            latency_ms=float(latency),
            hang=values["hang"],
            reset_after_tokens=reset,
            freeze_metrics=values["freeze_metrics"],
            kv_events_drop_rate=drop,
            kv_events_reorder_rate=reorder,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _share(values: dict[str, Any], name: str) -> float:
    value = values[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number between 0 and 1")
    return float(value)


def parse_fault_spec(spec: str) -> tuple[int | None, dict[str, Any]]:
    """Parse a command-line fault ``[REPLICA:]key=value[,key=value...]``.

    ``REPLICA`` is a replica index (all replicas when omitted); values are JSON-like:
    numbers, ``true``/``false``/``null``.
    """
    replica: int | None = None
    head, sep, rest = spec.partition(":")
    if sep and head.strip().isdigit():
        replica = int(head)
        spec = rest
    changes: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ValueError(f"fault {item!r} must look like key=value")
        changes[key.strip()] = _parse_value(raw.strip())
    return replica, changes


def _parse_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"fault value {raw!r} is not a number or boolean") from None
