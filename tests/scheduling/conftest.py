"""Helpers shared by the scheduling tests: endpoints, requests, plugins and contexts.

- ``make_endpoint(i, waiting=3, ...)``: endpoint ``ep-i`` at ``10.0.0.1:800i`` whose
  :class:`EngineMetrics` fields (scraped at t = 0 s) are the keyword arguments;
  ``metrics=None`` gives one that was never scraped.
- ``make_request(prompt, headers, **fields)``: an :class:`LLMRequest` for model ``base``.
- ``make_plugin(type, **parameters)``: a plugin built through the registry with ``ctx``.
- ``ctx``: a :class:`PluginContext` with a manual clock and seed 0.
- :func:`scored`: endpoints paired with scores, as pickers take them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pytest
from sched_support import REGISTRY, SCRAPED, new_endpoint, new_request

from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.framework import LLMRequest, Plugin, PluginContext, ScoredEndpoint


class EndpointFactory(Protocol):
    def __call__(
        self,
        i: int,
        name: str | None = None,
        metrics: EngineMetrics | None = SCRAPED,
        **fields: Any,
    ) -> Endpoint: ...


class RequestFactory(Protocol):
    def __call__(
        self, prompt: str | bytes = "", headers: Mapping[str, str] | None = None, **fields: Any
    ) -> LLMRequest: ...


class PluginFactory(Protocol):
    def __call__(self, type_name: str, **parameters: Any) -> Any: ...


def scored(
    endpoints: Sequence[Endpoint], scores: Sequence[float] | None = None
) -> list[ScoredEndpoint]:
    """``endpoints`` paired with ``scores`` (all 0 when None)."""
    values = [0.0] * len(endpoints) if scores is None else scores
    return [ScoredEndpoint(e, s) for e, s in zip(endpoints, values, strict=True)]


@pytest.fixture
def make_endpoint() -> EndpointFactory:
    return new_endpoint


@pytest.fixture
def make_request() -> RequestFactory:
    return new_request


@pytest.fixture
def ctx() -> PluginContext:
    return PluginContext(clock=ManualClock(), seed=0)


@pytest.fixture
def make_plugin(ctx: PluginContext) -> PluginFactory:
    def make(type_name: str, **parameters: Any) -> Plugin:
        return REGISTRY.create(type_name, type_name, parameters, ctx)

    return make


@pytest.fixture
def make_scored() -> Any:
    return scored
