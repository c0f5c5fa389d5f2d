"""Outlier detection: taking out endpoints whose requests fail, from what requests see.

Modelled on Envoy's outlier detection
(https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/outlier); the
code is sluicegate's own. Every attempt of a request is reported once (:meth:`record`)
as one :class:`Result`; scrapes play no part, so a server whose ``/metrics`` answers while
its requests fail is still ejected. Per endpoint (the counts live in its
:class:`~sluicegate.datalayer.endpoint.Health`):

- **consecutive 5xx**: ``consecutive_5xx`` server errors in a row (see
  :func:`classify_status`; gateway failures count too, as the client sees them as 502/504);
- **consecutive gateway failures**: ``consecutive_gateway_failure`` attempts in a row that
  got no usable answer (connect error, reset or drop before or after the first byte,
  first-byte timeout);
- **success rate** (every ``interval_s``, over the pool's endpoints that served at least
  ``success_rate_request_volume`` requests in the interval, when there are at least
  ``success_rate_minimum_hosts`` of them): below ``mean - stdev_factor * stdev`` of the
  pool's success rates (population stdev). With one failing host among ``n`` otherwise
  perfect ones its distance from the mean is ``sqrt(n - 1)`` stdevs, so the default factor
  1.9 needs five hosts, as Envoy's default minimum of 5 does;
- **failure percentage** (same interval, Envoy's second statistical test): failing at least
  ``failure_percentage_threshold`` % of at least ``failure_percentage_request_volume``
  requests — the rule that works in the small pools model servers come in.

A success resets both consecutive counts; a 429 (or a request the client left) changes
nothing: 429 is the server shedding load, not failing. An ejection lasts
``base_ejection_s * times_ejected`` (linear back-off, as Envoy), at most ``max_ejection_s``;
``times_ejected`` drops by one per interval the endpoint spends in service without an
ejection. When the time is up (:meth:`tick`) the endpoint returns **on probation**: until
its first successful request, a single failure ejects it again, for longer.

**Stalled** (:mod:`sluicegate.datalayer.stall`, checked at every :meth:`tick`): requests
in flight and no progress for ``stall_timeout_s``. The endpoint is ejected (reason
``stalled``), and the listeners of :attr:`OutlierDetector.on_stall` are told so that they
end its requests in flight (the gateway aborts their upstream exchanges, and the proxy
retries them elsewhere). An endpoint already ejected that stalls has its requests ended
the same way; its progress clock then starts again. A host that carries the requests says
through :attr:`OutlierDetector.waiting_on` whether it is waiting on the server at all: a
relay held up by slow clients reads nothing, so it relays nothing, and is no stall.

Never ejected: more than ``max_ejection_percent`` of a pool at once (at least one endpoint
may always go), nor the last endpoint of a pool not yet ejected (by either source). A
failure that would have ejected but may not leaves the counts as they are, so the endpoint
goes as soon as room is made.

Pure: the clock is injected, nothing here does I/O; :meth:`tick` is called by its host
(``Runtime``) every ``tick_s``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore, Pool
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.stall import idle_for, stalled

log = logging.getLogger("sluicegate.outlier")


class Result(Enum):
    """How one attempt on an endpoint ended."""

    SUCCESS = "success"
    """An answer that is not a server error (4xx included: the client's mistake)."""
    NEUTRAL = "neutral"
    """Says nothing about the server: 429 (load shedding), the client leaving."""
    ERROR_STATUS = "5xx"
    CONNECT_ERROR = "connect"
    RESET = "reset"
    """The connection closed, was reset or spoke garbage before the answer was complete."""
    TIMEOUT = "timeout"
    """No first byte within the first-byte timeout, or no byte within the read timeout."""

    @property
    def gateway_failure(self) -> bool:
        return self in _GATEWAY_FAILURES


_GATEWAY_FAILURES = frozenset({Result.CONNECT_ERROR, Result.RESET, Result.TIMEOUT})

CONSECUTIVE_5XX = "consecutive-5xx"
CONSECUTIVE_GATEWAY_FAILURE = "consecutive-gateway-failure"
SUCCESS_RATE = "success-rate"
FAILURE_PERCENTAGE = "failure-percentage"
PROBATION = "probation-failure"
STALLED = "stalled"
SCRAPE_FAILURE = "scrape-failure"
"""Ejection reasons, the ``reason`` label of ``sluicegate_endpoint_ejections_total``
(``scrape-failure`` is the collector's)."""


def classify_status(status: int) -> Result:
    """What an HTTP answer says about the server that sent it.

    500, 502, 503, 504 and every other 5xx but 501 are failures. 501 (Not Implemented)
    answers a request for something the server does not do, which another replica of the
    same server would not do either; 429 is load, not failure; 1xx-4xx are successes.
    ``0`` (no answer) is neutral: the caller reports what actually went wrong.
    """
    if status >= 500 and status != 501:
        return Result.ERROR_STATUS
    if status == 429 or status <= 0:
        return Result.NEUTRAL
    return Result.SUCCESS


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    """Thresholds (0 turns a test off), times in seconds, shares in percent."""

    consecutive_5xx: int = 5
    consecutive_gateway_failure: int = 3
    interval_s: float = 10.0
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0
    success_rate_minimum_hosts: int = 5
    success_rate_request_volume: int = 20
    success_rate_stdev_factor: float = 1.9
    failure_percentage_threshold: float = 50.0
    """0 turns the failure-percentage test off."""
    failure_percentage_minimum_hosts: int = 2
    failure_percentage_request_volume: int = 20
    stall_timeout_s: float = 30.0
    """No progress for this long with requests in flight: stalled (0: off)."""

    @property
    def tick_s(self) -> float:
        """How often the host should call :meth:`OutlierDetector.tick`: often enough that
        an ejection ends, and a stall is found, within a tenth of its time (s)."""
        bounds = [0.25, self.base_ejection_s / 10.0, self.interval_s / 10.0]
        if self.stall_timeout_s > 0:
            bounds.append(self.stall_timeout_s / 10.0)
        return max(0.01, min(bounds))


EjectionListener = Callable[[Endpoint, str], None]
"""Told of each ejection with its reason (for metrics)."""
StallListener = Callable[[Endpoint], None]
"""Told of each stalled endpoint whose requests in flight must be ended (by the host)."""


class OutlierDetector:
    """Ejects and returns the endpoints of ``datastore`` by their request results."""

    def __init__(
        self, datastore: Datastore, clock: Clock, settings: OutlierSettings | None = None
    ) -> None:
        self.datastore = datastore
        self.clock = clock
        self.settings = settings or OutlierSettings()
        self.on_eject: list[EjectionListener] = []
        self.on_stall: list[StallListener] = []
        self.waiting_on: Callable[[Endpoint], bool] | None = None
        """Set by a host that carries the requests itself: whether it is waiting for bytes
        from the endpoint now. A relay blocked on slow clients is not the server's stall
        (nothing is read from it, so nothing is relayed). None: taken as yes."""
        self._next_interval = clock.now() + self.settings.interval_s

    def record(self, endpoint: Endpoint, result: Result, detail: str = "") -> None:
        """One attempt on ``endpoint`` ended with ``result`` (``detail`` for the log)."""
        health = endpoint.health
        if result is Result.SUCCESS:
            health.consecutive_5xx = 0
            health.consecutive_gateway_failures = 0
            health.interval_successes += 1
            health.on_probation = False
            return
        if result is Result.NEUTRAL:
            return
        health.interval_failures += 1
        health.consecutive_5xx += 1
        if result.gateway_failure:
            health.consecutive_gateway_failures += 1
        else:
            health.consecutive_gateway_failures = 0
        if health.ejected_until is not None:
            return  # a request that was under way when it was ejected
        s = self.settings
        if health.on_probation:
            reason = PROBATION
        elif s.consecutive_gateway_failure and (
            health.consecutive_gateway_failures >= s.consecutive_gateway_failure
        ):
            reason = CONSECUTIVE_GATEWAY_FAILURE
        elif s.consecutive_5xx and health.consecutive_5xx >= s.consecutive_5xx:
            reason = CONSECUTIVE_5XX
        else:
            return
        self._eject(endpoint, reason, detail or result.value)

    def reachable_again(self, endpoint: Endpoint) -> None:
        """``endpoint`` answers its scrapes again after failing enough of them to be ejected
        for it: it was unreachable and is back (typically a restarted server). An ejection
        for gateway failures (connections refused, reset, timed out) ends now, on probation
        — one failed request ejects it again — instead of when its time is up; like Envoy's
        ``successful_active_health_check_uneject_host``, but only for the failures a
        working scrape disproves (a server that answers 5xx, or hangs its generations, also
        answers its scrapes)."""
        health = endpoint.health
        if health.ejected_until is not None and health.ejection_reason in (
            CONSECUTIVE_GATEWAY_FAILURE,
            PROBATION,
        ):
            self._return(endpoint)

    def tick(self) -> None:
        """Return endpoints whose ejection is over, act on stalled ones, and run the
        interval's statistical tests when it is due. O(endpoints)."""
        now = self.clock.now()
        stall_s = self.settings.stall_timeout_s
        for pool in self.datastore.pools.values():
            for endpoint in pool.endpoints:
                until = endpoint.health.ejected_until
                if until is not None and until <= now:
                    self._return(endpoint)
                if stalled(endpoint, now, stall_s):
                    self._stalled(endpoint, now)
        if now >= self._next_interval:
            self._next_interval = now + self.settings.interval_s
            for pool in self.datastore.pools.values():
                self._evaluate(pool)

    # ------------------------------------------------------------------ internals

    def _stalled(self, endpoint: Endpoint, now: float) -> None:
        health = endpoint.health
        if self.waiting_on is not None and not self.waiting_on(endpoint):
            health.progress_at = now  # the wait is on the clients: count afresh
            return
        requests = endpoint.inflight.requests
        detail = f"{requests} request(s) in flight, no progress for {idle_for(endpoint, now):.1f} s"
        if health.ejected:  # out already (either source): only its requests are left
            log.warning(
                "endpoint %s (%s), ejected, stalled: ending its requests (%s)",
                endpoint.name,
                endpoint.address,
                detail,
            )
        elif not self._eject(endpoint, STALLED, detail):
            return  # the pool cannot spare it: it goes when room is made
        health.progress_at = now  # its requests are ended (and retried): count afresh
        for listener in self.on_stall:
            listener(endpoint)

    def _evaluate(self, pool: Pool) -> None:
        s = self.settings
        rates: dict[Endpoint, tuple[float, int]] = {}
        for endpoint in pool.endpoints:
            health = endpoint.health
            total = health.interval_successes + health.interval_failures
            in_service = health.ejected_until is None and not health.on_probation
            if in_service and health.times_ejected > 0 and health.interval_failures == 0:
                health.times_ejected -= 1  # a healthy interval: the back-off decays
            if not health.ejected and total:
                rates[endpoint] = (health.interval_successes / total, total)
            health.interval_successes = health.interval_failures = 0
        found: dict[Endpoint, tuple[str, str]] = {}
        counted = [(r, e) for e, (r, n) in rates.items() if n >= s.success_rate_request_volume]
        if s.success_rate_minimum_hosts and len(counted) >= s.success_rate_minimum_hosts:
            mean = sum(r for r, _ in counted) / len(counted)
            stdev = math.sqrt(sum((r - mean) ** 2 for r, _ in counted) / len(counted))
            floor = mean - s.success_rate_stdev_factor * stdev
            for rate, e in counted:
                if rate < floor:
                    found[e] = (SUCCESS_RATE, f"success rate {rate:.0%} < {floor:.0%}")
        threshold = s.failure_percentage_threshold
        counted = [
            (r, e) for e, (r, n) in rates.items() if n >= s.failure_percentage_request_volume
        ]
        if threshold and counted and len(counted) >= s.failure_percentage_minimum_hosts:
            for rate, e in counted:
                if (1.0 - rate) * 100.0 >= threshold and e not in found:
                    found[e] = (FAILURE_PERCENTAGE, f"{1.0 - rate:.0%} of requests failed")
        # Worst first, so that the cap on ejections keeps out the worst ones.
        for e in sorted(found, key=lambda e: rates[e][0]):
            self._eject(e, *found[e])

    def _may_eject(self, endpoint: Endpoint) -> bool:
        pool = self.datastore.pools.get(endpoint.pool)
        if pool is None or endpoint not in pool.endpoints:
            return False
        size = len(pool.endpoints)
        # Out already for failed scrapes, it leaves no one else's place: count the others.
        out = sum(1 for e in pool.endpoints if e.health.ejected and e is not endpoint)
        cap = max(1, math.floor(size * self.settings.max_ejection_percent / 100.0))
        return out + 1 <= cap and out + 1 < size

    def _eject(self, endpoint: Endpoint, reason: str, detail: str) -> bool:
        """Eject ``endpoint`` unless its pool cannot spare it; returns whether it did."""
        if not self._may_eject(endpoint):
            log.debug("endpoint %s kept (%s): the pool cannot spare it", endpoint.name, reason)
            return False
        s = self.settings
        health = endpoint.health
        health.times_ejected += 1
        cap = max(s.max_ejection_s, s.base_ejection_s)
        duration = min(s.base_ejection_s * health.times_ejected, cap)
        health.ejected_until = self.clock.now() + duration
        health.ejection_reason = reason
        health.on_probation = False
        health.consecutive_5xx = health.consecutive_gateway_failures = 0
        health.sync()
        log.warning(
            "endpoint %s (%s) ejected for %.1f s (%s; ejection %d): %s",
            endpoint.name,
            endpoint.address,
            duration,
            reason,
            health.times_ejected,
            detail,
        )
        for listener in self.on_eject:
            listener(endpoint, reason)
        return True

    def _return(self, endpoint: Endpoint) -> None:
        health = endpoint.health
        health.ejected_until = None
        health.on_probation = True
        health.consecutive_5xx = health.consecutive_gateway_failures = 0
        health.interval_successes = health.interval_failures = 0
        health.sync()
        log.info(
            "endpoint %s (%s) returns on probation after its %s ejection",
            endpoint.name,
            endpoint.address,
            health.ejection_reason,
        )


__all__ = [
    "CONSECUTIVE_5XX",
    "CONSECUTIVE_GATEWAY_FAILURE",
    "FAILURE_PERCENTAGE",
    "PROBATION",
    "SCRAPE_FAILURE",
    "STALLED",
    "SUCCESS_RATE",
    "OutlierDetector",
    "OutlierSettings",
    "Result",
    "StallListener",
    "classify_status",
]
