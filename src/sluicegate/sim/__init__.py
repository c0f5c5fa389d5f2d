"""The model-server simulator (``sluicegate sim``): vLLM-compatible servers whose engine steps
in simulated time, for tests, the lab and the embedded pool.

- :mod:`~sluicegate.sim.engine` — ``Engine``: continuous batching over sequences
  (:mod:`~sluicegate.sim.sequence`: a request in it; :mod:`~sluicegate.sim.prefix_blocks`:
  its prefix-cache block hashes);
- :mod:`~sluicegate.sim.kvcache` — ``BlockPool``, the prefix-cached KV blocks;
- :mod:`~sluicegate.sim.profiles` — ``EngineProfile`` per model and GPU (``get_profile``);
- :mod:`~sluicegate.sim.driver` — ``EngineDriver``: the engine stepped in real time;
- :mod:`~sluicegate.sim.server` — the HTTP servers (``Replica``, ``SimCluster``);
- :mod:`~sluicegate.sim.api`, :mod:`~sluicegate.sim.text` — request bodies, prompts and
  generated text;
- :mod:`~sluicegate.sim.metrics` — the Prometheus metrics vLLM exports;
- :mod:`~sluicegate.sim.kvevents` — ``KVEventsConfig`` (vLLM's ``--kv-events-config``) and
  ``KVEventLog``; :mod:`~sluicegate.sim.kvpublisher` — its ZeroMQ sockets;
- :mod:`~sluicegate.sim.faults` — injected faults; :mod:`~sluicegate.sim.run` — the command.

The names are imported on first use (lazy): the discrete-event lab imports the engine alone
and must not load the HTTP server or Prometheus client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "ApiError": "sluicegate.sim.api",
    "parse_generate": "sluicegate.sim.api",
    "EngineDriver": "sluicegate.sim.driver",
    "Engine": "sluicegate.sim.engine",
    "SeqStatus": "sluicegate.sim.engine",
    "Sequence": "sluicegate.sim.engine",
    "StepResult": "sluicegate.sim.engine",
    "new_sequence": "sluicegate.sim.engine",
    "Faults": "sluicegate.sim.faults",
    "parse_fault_spec": "sluicegate.sim.faults",
    "BlockPool": "sluicegate.sim.kvcache",
    "KVEventLog": "sluicegate.sim.kvevents",
    "KVEventsConfig": "sluicegate.sim.kvevents",
    "EngineMetrics": "sluicegate.sim.metrics",
    "PROFILES": "sluicegate.sim.profiles",
    "EngineProfile": "sluicegate.sim.profiles",
    "LinearOpsCurve": "sluicegate.sim.profiles",
    "get_profile": "sluicegate.sim.profiles",
    "kv_blocks_for": "sluicegate.sim.profiles",
    "fault_table": "sluicegate.sim.run",
    "serve_pool": "sluicegate.sim.run",
    "Replica": "sluicegate.sim.server",
    "ReplicaOptions": "sluicegate.sim.server",
    "SimCluster": "sluicegate.sim.server",
    "PromptError": "sluicegate.sim.text",
    "render_chat": "sluicegate.sim.text",
    "render_prompt": "sluicegate.sim.text",
}

if TYPE_CHECKING:
    from sluicegate.sim.api import ApiError, parse_generate
    from sluicegate.sim.driver import EngineDriver
    from sluicegate.sim.engine import Engine, SeqStatus, Sequence, StepResult, new_sequence
    from sluicegate.sim.faults import Faults, parse_fault_spec
    from sluicegate.sim.kvcache import BlockPool
    from sluicegate.sim.kvevents import KVEventLog, KVEventsConfig
    from sluicegate.sim.metrics import EngineMetrics
    from sluicegate.sim.profiles import (
        PROFILES,
        EngineProfile,
        LinearOpsCurve,
        get_profile,
        kv_blocks_for,
    )
    from sluicegate.sim.run import fault_table, serve_pool
    from sluicegate.sim.server import Replica, ReplicaOptions, SimCluster
    from sluicegate.sim.text import PromptError, render_chat, render_prompt


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "PROFILES",
    "ApiError",
    "BlockPool",
    "Engine",
    "EngineDriver",
    "EngineMetrics",
    "EngineProfile",
    "Faults",
    "KVEventLog",
    "KVEventsConfig",
    "LinearOpsCurve",
    "PromptError",
    "Replica",
    "ReplicaOptions",
    "SeqStatus",
    "Sequence",
    "SimCluster",
    "StepResult",
    "fault_table",
    "get_profile",
    "kv_blocks_for",
    "new_sequence",
    "parse_fault_spec",
    "parse_generate",
    "render_chat",
    "render_prompt",
    "serve_pool",
]
