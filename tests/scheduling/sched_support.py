"""Endpoints and requests for scheduling tests, importable by test modules (the conftest's
fixtures wrap these; a module imports from here, never from ``conftest``, whose name
another test folder's conftest shares)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.builtins import default_registry
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.framework import LLMRequest

REGISTRY = default_registry()

SCRAPED: Any = object()
"""``new_endpoint``'s default ``metrics``: scraped at t = 0 s with the given fields."""


def new_endpoint(
    i: int, name: str | None = None, metrics: EngineMetrics | None = SCRAPED, **fields: Any
) -> Endpoint:
    if metrics is SCRAPED:
        metrics = EngineMetrics(scraped_at=0.0, **fields)
    elif fields:
        raise TypeError("give either metrics or metric fields")
    return Endpoint(
        name=name or f"ep-{i}", host="10.0.0.1", port=8000 + i, metrics=metrics, index=i
    )


def new_request(
    prompt: str | bytes = "", headers: Mapping[str, str] | None = None, **fields: Any
) -> LLMRequest:
    data = prompt.encode() if isinstance(prompt, str) else prompt
    values: dict[str, Any] = {
        "request_id": "req-1",
        "model": "base",
        "target_model": "base",
        "prompt": data,
        "prompt_tokens": -(-len(data) // 4),
        "arrival": 0.0,
        "headers": dict(headers or {}),
    }
    values.update(fields)
    return LLMRequest(**values)
