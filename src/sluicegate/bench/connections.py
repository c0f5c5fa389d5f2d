"""The load generator's connections to a Kubernetes Service: the lab-only ``kube-service`` baseline.

A Kubernetes Service (ClusterIP or LoadBalancer) balances TCP *connections*, not requests:
kube-proxy's iptables mode installs one rule per backend with ``--mode random
--probability 1/(n-i)``, so each new connection is DNAT-ed to a backend drawn uniformly at
random, and every request sent down that connection afterwards goes to the same pod
(https://kubernetes.io/docs/reference/networking/virtual-ips/ — "iptables proxy mode ...
chooses a backend at random"; the rules: ``pkg/proxy/iptables/proxier.go``,
``writeServiceToEndpointRules``). How many requests share a connection is the client's
choice, so the baseline is the client's connection pool:

- ``keep_alive`` false: one connection per request (HTTP/1.1 ``Connection: close``, or a
  client that opens a fresh session for each request). Every request gets an independent,
  uniform backend: exactly per-request random routing.
- ``keep_alive`` true: a request takes an idle connection of the pool — the one released
  most recently (LIFO, as aiohttp's ``BaseConnector`` does) — or opens a new one while fewer
  than ``max_connections`` are open (0 = no limit); when all are busy at the limit it waits,
  first come first served, for the next connection to free up (its wait counts in its
  latency, as the client measures from before it asks for a connection). A connection idle
  for longer than ``idle_timeout_s`` is closed (the earlier of the client's and the server's
  keep-alive timeouts) and a later request opens a new one, with a new random backend.

Parameters and defaults (:class:`ClientConnections`): ``max_connections`` 0 (unbounded),
``idle_timeout_s`` 5.0 s (uvicorn's ``timeout_keep_alive`` default, which vLLM's API server
keeps: ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` in ``vllm/envs.py``, default 5, passed as uvicorn's
``timeout_keep_alive`` by ``vllm/entrypoints/openai/api_server.py``), ``keep_alive``
false — the published GIE benchmark's client (the Latency Profile Generator image of
``config/manifests/benchmark/benchmark.yaml`` at GIE v0.3.0; its ``benchmark_serving.py``
in AI-Hypercomputer/inference-benchmark, at commit 01f99115, opens ``aiohttp.ClientSession`` inside
``send_request``, so each request has a connection of its own); ``pinned`` true (false: the
connections end at the gateway, which routes each request — the same client in front of a
gateway arm). See ``docs/benchmarks/sharegpt-sweep/gie-v0.3.md``.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClientConnections:
    """The client's connection pool in front of a per-connection balancer."""

    max_connections: int = 0
    """Open connections at most (0: no limit)."""
    idle_timeout_s: float = 5.0
    """An idle connection is closed after this many seconds."""
    keep_alive: bool = False
    """Reuse a finished request's connection; false: one connection per request."""
    pinned: bool = True
    """The connections end at backends (a Service); false: at the gateway, which routes
    each request (the same client in front of a gateway arm)."""

    def __post_init__(self) -> None:
        # Checked here: the values come from YAML overrides on the command line.
        if isinstance(self.max_connections, bool) or not isinstance(self.max_connections, int):
            raise TypeError(f"max_connections must be an integer, not {self.max_connections!r}")
        if isinstance(self.idle_timeout_s, bool) or not isinstance(
            self.idle_timeout_s, int | float
        ):
            raise TypeError(f"idle_timeout_s must be a number, not {self.idle_timeout_s!r}")
        if not isinstance(self.keep_alive, bool):
            raise TypeError(f"keep_alive must be true or false, not {self.keep_alive!r}")
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be ≥ 0 (0: no limit): {self.max_connections}")
        if self.idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s must be ≥ 0 s, not {self.idle_timeout_s}")


@dataclass(slots=True, eq=False)
class Connection:
    """One TCP connection, pinned to ``backend`` (an endpoint index) for its life."""

    backend: int
    opened_at: float
    requests: int = 0
    idle_since: float = 0.0


class ConnectionPool:
    """The client's connections; backends drawn uniformly at random per new connection.

    Bounded: at most ``max_connections`` open (when set); closed connections are kept only
    as counts (``carried``, ``connections_per_backend``, ``requests_per_backend``)."""

    def __init__(self, settings: ClientConnections, backends: int, rng: random.Random) -> None:
        if backends < 1:
            raise ValueError("a Service needs at least one backend")
        self.settings = settings
        self.backends = backends
        self.rng = rng
        self._idle: deque[Connection] = deque()
        """Idle connections, oldest release first."""
        self._open: set[Connection] = set()
        """Every open connection, busy or idle (bounded by the limit, or by the requests in
        flight plus the idle ones younger than the timeout)."""
        self.connections_per_backend = [0] * backends
        """Connections ever opened to each backend."""
        self.requests_per_backend = [0] * backends
        """Requests sent to each backend (down its connections)."""
        self.carried: Counter[int] = Counter()
        """Closed connections by how many requests each carried (:meth:`close_all` closes
        the rest)."""

    def acquire(self, now: float) -> Connection | None:
        """A connection for a request sent at ``now``; None when the pool is at its limit
        with every connection busy (the request must wait for :meth:`release`)."""
        self._expire(now)
        if self._idle:
            connection = self._idle.pop()  # most recently released first
        else:
            limit = self.settings.max_connections
            if limit and len(self._open) >= limit:
                return None
            connection = Connection(self.rng.randrange(self.backends), now)
            self.connections_per_backend[connection.backend] += 1
            self._open.add(connection)
        self._carry(connection)
        return connection

    def release(self, connection: Connection, now: float) -> None:
        """The request on ``connection`` has its whole response."""
        if not self.settings.keep_alive:
            self._close(connection)
            return
        connection.idle_since = now
        self._idle.append(connection)

    def handover(self, connection: Connection) -> None:
        """``connection`` goes straight from a finished request to a waiting one."""
        self._carry(connection)

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self._open)

    def close_all(self) -> None:
        """End of the run: close (and count) every connection still open, busy or idle."""
        self._idle.clear()
        for connection in self._open:
            self.carried[connection.requests] += 1
        self._open.clear()

    @property
    def opened(self) -> int:
        """Connections opened so far."""
        return sum(self.connections_per_backend)

    def _carry(self, connection: Connection) -> None:
        connection.requests += 1
        self.requests_per_backend[connection.backend] += 1

    def _expire(self, now: float) -> None:
        timeout = self.settings.idle_timeout_s
        while self._idle and now - self._idle[0].idle_since > timeout:
            self._close(self._idle.popleft())

    def _close(self, connection: Connection) -> None:
        self._open.discard(connection)
        self.carried[connection.requests] += 1


class ClientSender(Generic[T]):
    """The client's send path over ``pool``: a request takes a connection or waits for one,
    first come first served; a finished response hands its connection to the longest-waiting
    request. ``T`` is whatever the caller sends (the DES passes its request specs).

    Bounded by the requests the workload has sent and not yet put on a connection."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self._waiting: deque[tuple[T, float]] = deque()
        """Requests (and when they were sent, in seconds) waiting for a connection."""

    def arrive(self, request: T, now: float) -> Connection | None:
        """The connection ``request``, sent at ``now``, goes down; None: every connection is
        busy at the limit and it waits (:meth:`hang_up` returns it when one frees up)."""
        connection = self.pool.acquire(now)
        if connection is None:
            self._waiting.append((request, now))
        return connection

    def hang_up(self, connection: Connection, now: float) -> tuple[T, float, Connection] | None:
        """``connection``'s response is complete at ``now``: the longest-waiting request,
        when it was sent and the connection it now goes down (the same one with keep-alive,
        a fresh one without), or None when nothing waits (the connection goes idle, or
        closes without keep-alive)."""
        if not self._waiting:
            self.pool.release(connection, now)
            return None
        request, sent = self._waiting.popleft()
        if self.pool.settings.keep_alive:
            self.pool.handover(connection)
        else:
            self.pool.release(connection, now)
            fresh = self.pool.acquire(now)
            assert fresh is not None  # one was just closed
            connection = fresh
        return request, sent, connection

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection now."""
        return len(self._waiting)


__all__ = ["ClientConnections", "ClientSender", "Connection", "ConnectionPool"]
