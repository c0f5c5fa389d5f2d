"""Benchmark policies by name: what the lab runs for ``--policies NAME,...``.

Policies are scheduling configurations by name: the shipped presets (``round-robin``,
``random``, ``least-request``, ``default``, ``gie-v0.3``...) plus those added by later layers
(``predicted-latency``, ``predicted-latency-oracle``) and the lab-only baselines that are
not a gateway at all: ``kube-service``, a Kubernetes Service in front of the pool, which
balances the client's *connections* (:mod:`~sluicegate.bench.connections`; discrete-event
runs only). A name may carry parameter overrides (:func:`policy_config`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.bench.connections import ClientConnections
from sluicegate.builtins import default_registry
from sluicegate.scheduling.config import load_preset, preset_names


class UnknownPolicyError(ValueError):
    """A policy name (or one of its overrides) this build cannot run."""


PredictorKind = Literal["none", "model", "oracle"]

# Policies beyond the presets: a preset run with a latency predictor service.
_PREDICTOR_POLICIES: dict[str, tuple[str, PredictorKind]] = {
    "predicted-latency-oracle": ("predicted-latency", "oracle"),
    "predicted-latency-precise": ("predicted-latency-precise", "model"),
}


# Lab-only baselines: no gateway decides; each request goes to the backend its client
# connection was given (through a one-address subset hint, so any picker does: ``random``).
# Their parameters, as overrides of the pseudo-plugin ``client``: ``maxConnections`` (0: no
# limit), ``idleTimeoutS``, ``keepAlive`` — e.g.
# ``kube-service:client.keepAlive=true&client.maxConnections=1000``. The same overrides on a
# gateway policy put that client in front of the gateway (its connections end there and the
# gateway routes each request), so that both arms of a comparison have one client.
_CONNECTION_BASELINES: dict[str, tuple[str, ClientConnections]] = {
    "kube-service": ("random", ClientConnections()),
}
_CLIENT = "client"
_CLIENT_PARAMETERS = {
    "maxConnections": "max_connections",
    "idleTimeoutS": "idle_timeout_s",
    "keepAlive": "keep_alive",
}


def client_connections(name: str) -> ClientConnections | None:
    """The client connections policy ``name`` runs with: a lab-only per-connection
    baseline's (pinned to backends), those its ``client.*`` overrides set on a gateway
    policy (to the gateway, which routes each request: the same client in front of both
    arms), or None (one connection per request to the gateway, never waiting)."""
    base, _, overrides = name.partition(":")
    items = _client_overrides(overrides, name)
    if base in _CONNECTION_BASELINES:
        settings = _CONNECTION_BASELINES[base][1]
    elif items:
        settings = ClientConnections(pinned=False)
    else:
        return None
    values: dict[str, Any] = {}  # YAML values, type-checked by ClientConnections
    for item in items:
        target, _, raw = item.partition("=")
        param = target.partition(".")[2]
        if param not in _CLIENT_PARAMETERS:
            raise UnknownPolicyError(
                f"policy {name!r}: {_CLIENT} has no parameter {param!r}; "
                f"parameters: {', '.join(_CLIENT_PARAMETERS)}"
            )
        values[_CLIENT_PARAMETERS[param]] = yaml.safe_load(raw)
    try:
        return replace(settings, **values)
    except (TypeError, ValueError) as exc:
        raise UnknownPolicyError(f"policy {name!r}: {exc}") from None


def _client_overrides(overrides: str, name: str) -> list[str]:
    items = [item for item in overrides.split("&") if item] if overrides else []
    return [item for item in items if item.partition(".")[0] == _CLIENT]


def is_lab_only(name: str) -> bool:
    """Whether the discrete-event lab alone runs ``name``: a baseline that is no gateway,
    or a policy with a modelled client (``client.*`` overrides)."""
    base, _, overrides = name.partition(":")
    return base in _CONNECTION_BASELINES or bool(_client_overrides(overrides, name))


def policy_config(name: str) -> tuple[EndpointPickerConfig, PredictorKind]:
    """The scheduling configuration a policy name stands for, and the latency predictor
    it runs with (``model``: trained online on the run's own traffic).

    A name may carry parameter overrides after the policy, ``POLICY:PLUGIN.PARAM=VALUE``
    (several joined by ``&``), where ``PLUGIN`` is a plugin's name or type (a type sets
    every plugin of it) and ``VALUE`` is YAML — e.g.
    ``predicted-latency:latency-scorer.headroomSelectionStrategy=least`` — so that two arms
    of a measurement differ in one setting and nothing else."""
    base, _, overrides = name.partition(":")
    if base in _CONNECTION_BASELINES:
        preset = _CONNECTION_BASELINES[base][0]
        config = load_preset(preset)
        predictor: PredictorKind = "none"
    elif base in _PREDICTOR_POLICIES:
        preset, predictor = _PREDICTOR_POLICIES[base]
        config = load_preset(preset)
    elif base in preset_names():
        config = load_preset(base)
        # Any preset that asks for predictions runs with the online-trained models.
        predictor = (
            "model"
            if any(p.type == "predicted-latency-producer" for p in config.plugins)
            else "none"
        )
    else:
        raise UnknownPolicyError(
            f"policy {base!r} is not available; available: {', '.join(available_policies())}"
        )
    client_connections(name)  # any client.* overrides, checked now
    rest = [i for i in overrides.split("&") if i and i.partition(".")[0] != _CLIENT]
    if rest:
        config = _with_overrides(config, "&".join(rest), name)
    return config, predictor


def _with_overrides(
    config: EndpointPickerConfig, overrides: str, name: str
) -> EndpointPickerConfig:
    """``config`` with the ``PLUGIN.PARAM=VALUE&...`` overrides of policy ``name``."""
    plugins = [spec.model_copy(deep=True) for spec in config.plugins]
    for item in overrides.split("&"):
        target, eq, raw = item.partition("=")
        plugin, dot, param = target.partition(".")
        if not eq or not dot or not plugin or not param:
            raise UnknownPolicyError(
                f"policy {name!r}: override {item!r} is not PLUGIN.PARAM=VALUE"
            )
        matched = [p for p in plugins if plugin in (p.name, p.type)]
        if not matched:
            known = ", ".join(sorted({p.ref for p in plugins}))
            raise UnknownPolicyError(
                f"policy {name!r}: no plugin named or typed {plugin!r}; plugins: {known}"
            )
        value = yaml.safe_load(raw)
        for spec in matched:
            spec.parameters[param] = value
            _check_parameters(spec.type, spec.ref, spec.parameters, name)
    return config.model_copy(update={"plugins": plugins})


def _check_parameters(type_name: str, ref: str, parameters: dict[str, Any], name: str) -> None:
    """Refuse an override the plugin's parameter model rejects (an unknown parameter, a
    value of the wrong type) now, not when the run reaches this policy."""
    registry = default_registry()
    try:
        registry.resolve(type_name).Parameters.model_validate(parameters)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'parameters'}: {err['msg']}"
            for err in exc.errors()
        )
        raise UnknownPolicyError(f"policy {name!r}: plugin {ref!r}: {problems}") from None


def check_policies(names: Sequence[str], extra: Collection[str] = ()) -> tuple[str, ...]:
    """``names`` unchanged if every one is a policy this build runs (with well-formed
    overrides) or one of ``extra`` (host-specific names, e.g. HTTP mode's peer routers);
    otherwise :class:`UnknownPolicyError` naming the bad one and the known ones. An empty
    or repeated name is refused too: a comparison must run what was asked, all of it."""
    if not names:
        raise UnknownPolicyError("no policy given")
    seen: set[str] = set()
    known = sorted({*available_policies(), *extra})
    for name in names:
        if not name:
            raise UnknownPolicyError("an empty policy name (a stray comma in --policies?)")
        if name in seen:
            raise UnknownPolicyError(f"policy {name!r} is given twice")
        seen.add(name)
        if name in extra:
            continue
        if not is_available(name):
            raise UnknownPolicyError(
                f"unknown policy {name.partition(':')[0]!r}; known: {', '.join(known)}"
            )
        policy_config(name)  # a malformed override fails now, before any run
    return tuple(names)


def is_available(name: str) -> bool:
    """Whether ``name`` (with any overrides) is a policy this build can run."""
    return name.partition(":")[0] in available_policies()


def available_policies() -> list[str]:
    """Every policy name this build runs, sorted (overrides aside)."""
    return sorted({*preset_names(), *_PREDICTOR_POLICIES, *_CONNECTION_BASELINES})


__all__ = [
    "PredictorKind",
    "UnknownPolicyError",
    "available_policies",
    "check_policies",
    "client_connections",
    "is_available",
    "is_lab_only",
    "policy_config",
]
