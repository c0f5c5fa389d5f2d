"""Real vLLM servers on CPU for tests/vllm: the tiny model and the server processes of
:mod:`sluicegate.bench.vllm_backend` (where they live, for ``sluicegate bench run --backend
vllm``), re-exported here for the tests, and a Prometheus sample reader.

``SLUICEGATE_VLLM_PYTHON`` names the vLLM environment's interpreter (set by
``scripts/test-vllm``).
"""

from __future__ import annotations

import os

import pytest

from sluicegate.bench.vllm_backend import (
    BLOCK_SIZE_CPU,
    CHAT_TEMPLATE,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_NAME,
    OFFLINE_ENV,
    PYTHON_ENV,
    VllmServer,
    build_model,
    corpus,
    ensure_model,
    free_port,
    kv_events_args,
    start_servers,
)

__all__ = [
    "BLOCK_SIZE_CPU",
    "CHAT_TEMPLATE",
    "MAX_MODEL_LEN",
    "MAX_NUM_SEQS",
    "MODEL_NAME",
    "OFFLINE_ENV",
    "PYTHON_ENV",
    "START_TIMEOUT_S",
    "VllmServer",
    "build_model",
    "corpus",
    "ensure_model",
    "free_port",
    "kv_events_args",
    "metric_value",
    "start_servers",
    "vllm_python",
]


def metric_value(text: str, metric: str, /, **labels: str) -> float:
    """Sum of the samples of ``metric`` (exact sample name) whose labels include ``labels``,
    in a Prometheus exposition; 0 when there are none."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = [line for line in text.splitlines() if line.startswith(metric)]
    total = 0.0
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == metric and labels.items() <= sample.labels.items():
                total += sample.value
    return total


START_TIMEOUT_S = float(os.environ.get("SLUICEGATE_VLLM_START_TIMEOUT", "420"))
"""Seconds a server may take to start (``SLUICEGATE_VLLM_START_TIMEOUT``): about 30 s on an
idle 2-core machine, over 180 s on a loaded one."""


def vllm_python() -> str:
    """The vLLM environment's interpreter (``SLUICEGATE_VLLM_PYTHON``); without one the
    calling test module is skipped."""
    python = os.environ.get(PYTHON_ENV, "")
    if not python:
        pytest.skip(
            f"real-vLLM tests need {PYTHON_ENV} (the python of a vLLM install); "
            "run them with scripts/test-vllm",
            allow_module_level=True,
        )
    return python
