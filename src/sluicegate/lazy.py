"""Package names imported on first use (a module ``__getattr__``, PEP 562).

A package whose ``__init__`` would otherwise import heavy or circular modules declares
``_EXPORTS`` (each exported name → the module that defines it) and
``__getattr__ = lazy.exports(__name__, _EXPORTS, globals())``: a name is imported when
first read, then kept in the package's namespace, so each costs one lookup afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def exports(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``names`` maps each name to its module."""

    def lookup(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return lookup


__all__ = ["exports"]
