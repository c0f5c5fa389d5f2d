"""The runtime's warnings to the operator about requests nothing can serve: one line per
pool without endpoints (what is missing and how to fix it), a refusal's operator detail
once per distinct message, and one line per pool that mixes hardware classes under a
hardware-blind scheduler. All are bounded and logged as ``sluicegate.runtime``.
"""

from __future__ import annotations

import logging

from sluicegate.api.loader import Config
from sluicegate.datalayer.datastore import Datastore
from sluicegate.errors import GatewayError

log = logging.getLogger("sluicegate.runtime")

MAX_LOGGED = 256
"""Distinct refusal details logged between two reloads."""


class Notices:
    """What has been logged already, so that each notice is logged once."""

    def __init__(self) -> None:
        self._warned_empty: set[str] = set()
        """Pools whose emptiness has been logged (logged again once they had endpoints)."""
        self._logged_unserved: set[str] = set()
        """Not-served refusals already logged (bounded; emptied on every reload)."""
        self._warned_mixed: set[str] = set()
        """Pools whose mixed hardware has been logged (again once they were not mixed)."""

    def refusal(self, error: GatewayError) -> None:
        """Log a refusal's operator detail once per distinct message (bounded)."""
        key = f"{error.message} {error.detail}"
        if key in self._logged_unserved or len(self._logged_unserved) >= MAX_LOGGED:
            return
        self._logged_unserved.add(key)
        log.warning("%s (%s)", error.message, error.detail)

    def reloaded(self) -> None:
        """A new configuration: refusals are logged afresh."""
        self._logged_unserved.clear()

    def empty_pools(self, datastore: Datastore, config: Config) -> None:
        """One log line for each configured pool without endpoints, saying what is missing
        and how to fix it (again only after it had endpoints in between)."""
        for name, pool in datastore.pools.items():
            if pool.endpoints:
                self._warned_empty.discard(name)
            elif name not in self._warned_empty:
                self._warned_empty.add(name)
                resource = config.pools.get(name)
                labels = resource.spec.match_labels if resource is not None else {}
                selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                log.warning(
                    "InferencePool '%s'%s has no endpoints, so its requests are answered 503: %s",
                    name,
                    f" (selector {selector})" if selector else "",
                    pool.empty_hint,
                )

    def mixed_hardware(self, datastore: Datastore, hardware_aware: bool) -> None:
        """One log line for each pool whose endpoints are of more than one hardware class
        while the scheduler is hardware-blind (again only after it was not mixed)."""
        mixed = dict(mixed_hardware_pools(datastore)) if not hardware_aware else {}
        self._warned_mixed &= set(mixed)
        for name, classes in mixed.items():
            if name in self._warned_mixed:
                continue
            self._warned_mixed.add(name)
            log.warning(
                "InferencePool '%s' mixes hardware classes (%s) but its scheduling profile "
                "is hardware-blind: endpoints with the same load look equal whatever they "
                "run on; use a hardware-aware profile (e.g. the predicted-latency preset)",
                name,
                ", ".join(classes),
            )


def mixed_hardware_pools(datastore: Datastore) -> list[tuple[str, list[str]]]:
    """Pools whose endpoints are of more than one hardware class, with the classes
    (``unknown`` for endpoints of none), by pool name."""
    out = []
    for name in sorted(datastore.pools):
        classes = {e.hardware.accelerator for e in datastore.pools[name].endpoints}
        if len(classes) > 1:
            out.append((name, sorted(c or "unknown" for c in classes)))
    return out


__all__ = ["MAX_LOGGED", "Notices", "mixed_hardware_pools"]
