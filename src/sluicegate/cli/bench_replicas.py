"""``sluicegate bench run``'s gateway-replica options (``--gateway-replicas`` and the
options that shape the replicas), checked before any run starts: a bad value is an error
naming the known values (exit 2), never a replica setting quietly dropped."""

from __future__ import annotations

import argparse

from sluicegate.bench.des_sharing import (
    DEFAULT_MODEL_SYNC_S,
    DEFAULT_SHARE_DELAY_S,
    REPLICA_SPREADS,
    REPLICA_STATES,
    ReplicaSettings,
    ReplicaSpread,
    ReplicaState,
)

_REPLICA_OPTIONS = (
    "gateway_replicas",
    "replica_state",
    "replica_spread",
    "replica_share_delay_ms",
    "replica_share_loss",
    "replica_model_sync_ms",
)


def gateway_replicas(args: argparse.Namespace) -> tuple[ReplicaSettings, ...] | None:
    """The gateway replicas of every run (``--gateway-replicas`` and the options that
    shape them); None when none was given (one replica)."""
    given = [name for name in _REPLICA_OPTIONS if getattr(args, name) is not None]
    if not given:
        return None
    if args.mode != "des":
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags}: gateway replicas are simulated in --mode des only")
    counts: tuple[int, ...] = (1,)
    if args.gateway_replicas is not None:
        try:
            counts = tuple(int(x) for x in args.gateway_replicas.split(","))
        except ValueError:
            raise ValueError(
                f"--gateway-replicas must be comma-separated counts, got {args.gateway_replicas!r}"
            ) from None
        if len(set(counts)) != len(counts):
            raise ValueError(f"--gateway-replicas names a count twice: {args.gateway_replicas!r}")
    state = args.replica_state or "independent"
    states_of: dict[str, tuple[ReplicaState, ...]] = {s: (s,) for s in REPLICA_STATES}
    states_of["both"] = REPLICA_STATES
    if state not in states_of:
        raise ValueError(f"--replica-state {state!r} is not known; known: {', '.join(states_of)}")
    spreads: dict[str, ReplicaSpread] = {s: s for s in REPLICA_SPREADS}
    spread = spreads.get(args.replica_spread or "round-robin")
    if spread is None:
        raise ValueError(
            f"--replica-spread {args.replica_spread!r} is not known; known: {', '.join(spreads)}"
        )
    sharing = [
        n
        for n in ("replica_share_delay_ms", "replica_share_loss", "replica_model_sync_ms")
        if getattr(args, n) is not None
    ]
    if sharing and state == "independent":
        flags = ", ".join("--" + name.replace("_", "-") for name in sharing)
        raise ValueError(f"{flags}: apply to --replica-state shared (or both) only")
    delay_ms = args.replica_share_delay_ms
    delay_s = DEFAULT_SHARE_DELAY_S if delay_ms is None else delay_ms / 1000.0
    loss = 0.0 if args.replica_share_loss is None else args.replica_share_loss
    sync_ms = args.replica_model_sync_ms
    sync_s = DEFAULT_MODEL_SYNC_S if sync_ms is None else sync_ms / 1000.0
    states = states_of[state]
    out: list[ReplicaSettings] = []
    for n in counts:
        # One replica shares with no one: it runs once, whatever the state.
        for s in states if n > 1 else states[:1]:
            try:
                out.append(ReplicaSettings(n, s, spread, delay_s, loss, model_sync_s=sync_s))
            except ValueError as exc:  # a count, delay or loss out of range
                raise ValueError(f"{_flag_of(str(exc))}{exc}") from None
    return tuple(out)


def _flag_of(message: str) -> str:
    """The option a ReplicaSettings error is about, as a prefix for the message."""
    for word, flag in (
        ("model_sync", "--replica-model-sync-ms"),
        ("replicas", "--gateway-replicas"),
        ("delay", "--replica-share-delay-ms"),
        ("loss", "--replica-share-loss"),
    ):
        if word in message:
            return f"{flag}: "
    return ""


__all__ = ["gateway_replicas"]
