"""When nothing can serve a request: its pool has no endpoint at all, or every endpoint has
listed its models and none lists the request's target. Both are a 503 answered at once —
at admission, and for a queued request as soon as the endpoint set or a served-model list
shows it (it would only wait out its time to live).
"""

from __future__ import annotations

from sluicegate.datalayer.datastore import Pool
from sluicegate.errors import GatewayError, no_endpoint
from sluicegate.framework import LLMRequest


def never_served(pool: Pool, target: str) -> bool:
    """Every endpoint of ``pool`` (ejected ones too: they come back) has listed its models
    and none lists ``target``. False before the first listing: nothing is known yet."""
    endpoints = pool.endpoints
    return all(e.models.known for e in endpoints) and not any(
        e.models.serves(target) for e in endpoints
    )


def empty_pool(name: str, pool: Pool | None) -> GatewayError:
    """The 503 for a request whose pool has no endpoint at all."""
    hint = pool.empty_hint if pool is not None else "it has no endpoint list"
    return no_endpoint(f"pool '{name}' has no endpoints: {hint}")


_LISTED_NAMES = 8
"""Served names a ``not_served`` detail shows (the log line stays short)."""


def not_served(pool: Pool, model: str, target: str) -> GatewayError:
    """The 503 for a target model no endpoint of ``pool`` lists. The client is told its own
    model name (the target may be an adapter it was never told of); the log is told the
    target and what the endpoints do serve."""
    served = sorted({n for e in pool.endpoints for n in e.models.base_models | e.models.adapters})
    shown = ", ".join(served[:_LISTED_NAMES]) + (" ..." if len(served) > _LISTED_NAMES else "")
    error = no_endpoint(
        f"no endpoint of pool '{pool.name}' serves model '{model}': the model it is routed "
        "to is not among the models the pool's servers list; fix the target model name in "
        "the gateway's configuration or the servers' served model names"
    )
    error.reason = "model-not-served"
    error.detail = f"target model '{target}'; the endpoints list: {shown or 'nothing'}"
    return error


def unservable(name: str, pool: Pool | None, request: LLMRequest) -> GatewayError | None:
    """The 503 for a queued ``request`` of pool ``name`` (``pool`` as the datastore has it
    now, None when gone) that nothing can serve any more; None while something may."""
    if pool is None or not pool.endpoints:
        return empty_pool(name, pool)
    if request.target_model and never_served(pool, request.target_model):
        return not_served(pool, request.model, request.target_model)
    return None


__all__ = ["empty_pool", "never_served", "not_served", "unservable"]
