"""How the state gateway replicas share is named in Redis: the key base every key starts
with (:func:`key_base`) and this replica's id (:func:`default_replica_id`). Internal to
:mod:`sluicegate.runtime.shared` and :mod:`sluicegate.runtime.shared_backlog`."""

from __future__ import annotations

import os
import socket
import uuid


def key_base(prefix: str) -> str:
    """The start of every key of the replicas sharing ``prefix`` (``keyPrefix``): the prefix
    as a Redis Cluster hash tag, ``{sluicegate}``. Redis Cluster places a key by its tag
    alone, so every key here is in one hash slot — the scripts' declared keys and the
    peers' snapshots they read by name alike (a script may touch one slot only).

    Raises ValueError for an empty prefix or one holding a brace: Redis Cluster would then
    hash each whole key (``{}`` is no tag) or only part of the prefix, scattering the keys
    over slots."""
    if not prefix:
        raise ValueError("the shared-state key prefix must not be empty")
    if "{" in prefix or "}" in prefix:
        raise ValueError(
            f"the shared-state key prefix {prefix!r} must not contain braces: it becomes "
            "a Redis Cluster hash tag, {prefix}"
        )
    return "{" + prefix + "}"


def default_replica_id() -> str:
    """Host name, process id and a random suffix: unique for each start."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


__all__ = ["default_replica_id", "key_base"]
