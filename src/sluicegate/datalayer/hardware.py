"""An endpoint's :class:`~sluicegate.datalayer.endpoint.Hardware` from what discovery knows.

Precedence, for the class and the cost separately: the endpoint's own word (its
configuration entry, or its pod's labels), then the pool's ``spec.hardware`` defaults
(:class:`~sluicegate.api.hardware.PoolHardware`). Pod labels, in order of precedence:

- class: ``sluicegate.dev/accelerator`` (a class name, e.g. ``h100-80gb``), else the
  standard ``nvidia.com/gpu.product`` (normalized: ``NVIDIA-H100-80GB-HBM3`` →
  ``h100-80gb``, see :mod:`sluicegate.api.hardware`);
- cost: ``sluicegate.dev/cost-per-hour`` (a decimal number, currency per hour).

A label value that gives no class or no cost is reported and left out (the pool default
applies), never fatal: one mislabelled pod must not take a pool down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sluicegate.api.hardware import PoolHardware, normalize_accelerator
from sluicegate.datalayer.endpoint import Hardware

ACCELERATOR_LABEL = "sluicegate.dev/accelerator"
"""Pod label naming the endpoint's hardware class (wins over the GPU-product label)."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The GPU product as NVIDIA's GPU feature discovery names it (on nodes; copied onto pods)."""
COST_LABEL = "sluicegate.dev/cost-per-hour"
"""Pod label with the endpoint's cost, currency per hour."""


def resolve_hardware(
    accelerator: str | None, cost_per_hour: float | None, defaults: PoolHardware
) -> Hardware:
    """The endpoint's own class and cost where given, else the pool's defaults."""
    cls = accelerator if accelerator is not None else defaults.accelerator
    cost = cost_per_hour if cost_per_hour is not None else defaults.cost_for(cls)
    return Hardware(cls, cost)


def hardware_from_labels(
    labels: Mapping[str, str], defaults: PoolHardware, problems: list[str], where: str
) -> Hardware:
    """The hardware a pod's ``labels`` declare (see the module docstring); a label that
    cannot be read is described in ``problems`` (prefixed with ``where``) and ignored."""
    accelerator: str | None = None
    for key in (ACCELERATOR_LABEL, GPU_PRODUCT_LABEL):
        value = labels.get(key)
        if not value:
            continue
        try:
            accelerator = normalize_accelerator(value)
            break
        except ValueError as exc:
            problems.append(f"{where}: label {key}: {exc}")
    cost: float | None = None
    raw = labels.get(COST_LABEL)
    if raw:
        try:
            cost = float(raw)
        except ValueError:
            cost = None
        if cost is None or not math.isfinite(cost) or cost < 0:
            problems.append(f"{where}: label {COST_LABEL}: {raw!r} is not a cost (a number >= 0)")
            cost = None
    return resolve_hardware(accelerator, cost, defaults)


__all__ = [
    "ACCELERATOR_LABEL",
    "COST_LABEL",
    "GPU_PRODUCT_LABEL",
    "hardware_from_labels",
    "resolve_hardware",
]
