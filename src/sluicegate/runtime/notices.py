"""The runtime's warnings to the operator about requests nothing can serve: one line per
pool without endpoints (what is missing and how to fix it), and a refusal's operator
detail once per distinct message. Both are bounded and logged as ``sluicegate.runtime``.
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


__all__ = ["MAX_LOGGED", "Notices"]
