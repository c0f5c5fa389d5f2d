"""What an endpoint runs on, as configuration and Kubernetes labels name it.

A **hardware class** (``accelerator``) is a short lower-case name such as ``h100-80gb``,
``a100-80gb`` or ``l40s-48gb``: endpoints of one class are assumed to serve alike, so
hardware-aware routing learns and compares per class. Any name may be configured; names
that come from the GPU-product label NVIDIA's GPU feature discovery sets on nodes (and that
operators copy onto pods), ``nvidia.com/gpu.product`` (e.g. ``NVIDIA-H100-80GB-HBM3``),
are normalized by :func:`normalize_accelerator` so that the same card gets the same class
whatever form factor the label spells out:

1. lower-case; spaces and underscores become ``-``; a leading ``nvidia-`` or ``tesla-``
   (and ``geforce-``) is dropped;
2. form-factor and memory-type words are dropped: ``sxm``, ``sxm2``, ``sxm4``, ``sxm5``,
   ``pcie``, ``hbm2``, ``hbm2e``, ``hbm3``, ``hbm3e``;
3. the first word is the product (``h100``, ``a100``, ``l40s``…); a word ``<n>gb`` is its
   memory; a MIG slice (``mig-1g.10gb``) is kept as a suffix;
4. the class is ``<product>-<memory>gb``; without a memory word, the memory of the one
   size the product ships in is supplied (``h200`` 141, ``l40s``/``l40``/``a40`` 48,
   ``l4``/``a10g``/``a10`` 24, ``t4`` 16 GB; ``h100`` 80 GB, its PCIe and SXM size);
   otherwise the remaining words are kept (``NVIDIA-H100-NVL`` → ``h100-nvl``).

So ``NVIDIA-H100-80GB-HBM3`` → ``h100-80gb``, ``NVIDIA-A100-SXM4-80GB`` → ``a100-80gb``,
``NVIDIA-A100-SXM4-40GB`` → ``a100-40gb``, ``NVIDIA-L40S`` → ``l40s-48gb``,
``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` → ``a100-40gb-mig-1g.5gb``. A name already in class
form is left as it is (``h100-80gb`` → ``h100-80gb``).

Costs are per hour in the operator's one currency (what on-demand and reserved prices are
quoted in); a cost per token is derived from it and the throughput an endpoint shows, so a
server that idles still costs what it costs. :class:`PoolHardware` holds a pool's defaults.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from sluicegate.api.base import Model

_CLASS = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_DROPPED_PREFIXES = ("nvidia-", "tesla-", "geforce-")
_FORM_FACTORS = frozenset({"sxm", "sxm2", "sxm4", "sxm5", "pcie", "hbm2", "hbm2e", "hbm3", "hbm3e"})
_MEMORY = re.compile(r"^\d+gb$")
ONE_SIZE_GB = {
    "h100": 80,
    "h200": 141,
    "l40s": 48,
    "l40": 48,
    "a40": 48,
    "l4": 24,
    "a10g": 24,
    "a10": 24,
    "t4": 16,
}
"""Memory (GB) of products a GPU-product label may name without it (NVIDIA data sheets:
https://www.nvidia.com/en-us/data-center/h200/ , /l40s/ , /l4/ , /a10-tensor-core-gpu/ ,
/tesla-t4/ ; H100 ships as 80 GB in SXM and PCIe, the NVL's 94 GB is spelled ``nvl``)."""


def normalize_accelerator(value: str) -> str:
    """The hardware class for a GPU-product name or a class name (see the module
    docstring); raises ``ValueError`` for a value that gives no valid class name."""
    text = re.sub(r"[\s_]+", "-", value.strip().lower())
    for prefix in _DROPPED_PREFIXES:
        text = text.removeprefix(prefix)
    mig = ""
    head, sep, tail = text.partition("-mig-")
    if sep:
        text, mig = head, f"-mig-{tail}"
    words = [w for w in text.split("-") if w and w not in _FORM_FACTORS]
    if not words:
        raise ValueError(f"no hardware class in {value!r}")
    product, rest = words[0], words[1:]
    memory = [w for w in rest if _MEMORY.match(w)]
    if memory:
        out = f"{product}-{memory[0]}"
    elif not rest and product in ONE_SIZE_GB:
        out = f"{product}-{ONE_SIZE_GB[product]}gb"
    else:
        out = "-".join(words)
    out += mig
    if not _CLASS.match(out):
        raise ValueError(
            f"hardware class {out!r} (from {value!r}) must be lower-case letters, digits, "
            "'.', '_' or '-', at most 63 characters"
        )
    return out


AcceleratorClass = Annotated[str, AfterValidator(normalize_accelerator)]
"""A hardware class as configured; normalized (``NVIDIA-H100-80GB-HBM3`` → ``h100-80gb``)."""


def distinct_classes(value: object) -> object:
    """Reject a mapping two of whose keys name the same hardware class once normalized
    (``{H100: 3, h100-80gb: 2}``), which a dict would otherwise merge silently; keys that
    give no class are left for the key validator to report."""
    if isinstance(value, dict):
        seen: dict[str, object] = {}
        for key in value:
            try:
                name = normalize_accelerator(key) if isinstance(key, str) else None
            except ValueError:
                continue
            if name is not None and name in seen:
                raise ValueError(f"{seen[name]!r} and {key!r} both name hardware class {name!r}")
            if name is not None:
                seen[name] = key
    return value


ClassKeyed = BeforeValidator(distinct_classes)
"""Put on a ``dict[AcceleratorClass, ...]`` field: one entry per class after normalizing."""
CostPerHour = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
"""Currency per hour (any one currency; the gateway only compares)."""


class PoolHardware(Model):
    """A pool's hardware defaults (``spec.hardware``), for endpoints that do not say.

    An endpoint's class comes from its own ``accelerator`` (configuration) or its pod's
    labels, else ``accelerator`` here; its cost from its own ``costPerHour`` (or pod label),
    else ``costPerHourByAccelerator[class]``, else ``costPerHour`` here.
    """

    accelerator: AcceleratorClass | None = None
    """The class of endpoints that name none."""
    cost_per_hour: CostPerHour | None = None
    """The cost of endpoints whose class has no entry in ``costPerHourByAccelerator``."""
    cost_per_hour_by_accelerator: Annotated[dict[AcceleratorClass, CostPerHour], ClassKeyed] = (
        Field(default_factory=dict, max_length=64)
    )
    """Cost per hour by hardware class, e.g. ``{h100-80gb: 4.0, a100-80gb: 1.8}``."""

    def cost_for(self, accelerator: str | None) -> float | None:
        """The default cost per hour of an endpoint of class ``accelerator``."""
        if accelerator is not None and accelerator in self.cost_per_hour_by_accelerator:
            return self.cost_per_hour_by_accelerator[accelerator]
        return self.cost_per_hour


__all__ = [
    "ONE_SIZE_GB",
    "AcceleratorClass",
    "ClassKeyed",
    "CostPerHour",
    "PoolHardware",
    "distinct_classes",
    "normalize_accelerator",
]
