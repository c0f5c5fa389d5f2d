"""The stall rule on a manual clock: requests in flight and no progress eject an endpoint
and end its requests; tokens, a moving token counter or an idle spell are progress."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from sluicegate.api.settings import OutlierDetectionSettings
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.datalayer.outlier import STALLED, OutlierDetector, OutlierSettings
from sluicegate.datalayer.stall import stalled
from sluicegate.runtime import outlier_settings

STALL_S = 0.3
STEP_S = 0.03
SETTINGS = OutlierSettings(
    interval_s=60.0,
    base_ejection_s=60.0,
    max_ejection_percent=100.0,
    success_rate_minimum_hosts=0,
    failure_percentage_threshold=0.0,
    stall_timeout_s=STALL_S,
)


class Env:
    def __init__(self, n: int = 3, settings: OutlierSettings = SETTINGS) -> None:
        self.clock = ManualClock(1000.0)
        self.datastore = Datastore()
        specs = [EndpointSpec(f"ep-{i}", "127.0.0.1", 9000 + i) for i in range(n)]
        self.datastore.set_endpoints("pool", specs)
        self.counters = [0.0] * n
        for i in range(n):
            self.scrape(i)
        self.detector = OutlierDetector(self.datastore, self.clock, settings)
        self.ejections: list[tuple[str, str]] = []
        self.stalls: list[str] = []
        self.detector.on_eject.append(lambda e, reason: self.ejections.append((e.name, reason)))
        self.detector.on_stall.append(lambda e: self.stalls.append(e.name))

    def ep(self, i: int) -> Endpoint:
        return self.datastore.pools["pool"].endpoints[i]

    def busy(self, i: int, requests: int = 1) -> None:
        """Endpoint ``i`` has ``requests`` in flight from now on (a check sees it now)."""
        self.ep(i).inflight.requests = requests
        self.detector.tick()

    def scrape(self, i: int, generated: float = 0.0) -> None:
        """A scrape of endpoint ``i`` whose token counter moved by ``generated``."""
        self.counters[i] += generated
        self.ep(i).metrics = EngineMetrics(
            scraped_at=self.clock.now(), generation_tokens=self.counters[i]
        )

    def run(self, seconds: float, each_step: object = None, scrapes: bool = True) -> None:
        """Tick every STEP_S for ``seconds``; before each tick every endpoint is scraped
        (its counter unmoved; unless ``scrapes`` is False) and ``each_step()`` called."""
        for _ in range(round(seconds / STEP_S)):
            self.clock.advance(STEP_S)
            if scrapes:
                for i in range(len(self.counters)):
                    self.scrape(i)
            if callable(each_step):
                each_step()
            self.detector.tick()


def test_busy_without_progress_is_stalled_after_the_timeout() -> None:
    env = Env()
    env.busy(0, requests=2)
    env.run(STALL_S - 2 * STEP_S)
    assert env.ejections == []
    assert env.stalls == []
    env.run(3 * STEP_S)
    assert env.ejections == [("ep-0", STALLED)]
    assert env.stalls == ["ep-0"]  # told once, to end its requests
    assert env.ep(0).health.ejected
    assert env.ep(0).health.ejection_reason == STALLED
    # Its requests are still counted until the host has ended them: not told again at once.
    env.run(STALL_S - 2 * STEP_S)
    assert env.stalls == ["ep-0"]
    # Still in flight, still no progress a whole timeout later: ended again, not re-ejected.
    env.run(3 * STEP_S)
    assert env.stalls == ["ep-0", "ep-0"]
    assert env.ejections == [("ep-0", STALLED)]
    assert not env.ep(1).health.ejected
    assert not env.ep(2).health.ejected


def test_relayed_tokens_are_progress() -> None:
    env = Env()
    env.busy(0)
    env.run(3 * STALL_S, lambda: env.ep(0).inflight.token(env.clock.now()))
    assert env.ejections == []
    assert env.stalls == []
    # Tokens stop: stalled one timeout after the last of them.
    last = env.clock.now()
    env.run(STALL_S + 2 * STEP_S)
    assert env.ejections == [("ep-0", STALLED)]
    assert env.ep(0).health.progress_at is not None
    assert env.ep(0).health.progress_at >= last + STALL_S  # restarted when acted upon


def test_a_moving_token_counter_is_progress() -> None:
    env = Env()
    env.busy(0)  # e.g. one long prefill of ours, while the server decodes other requests
    env.run(3 * STALL_S, lambda: env.scrape(0, generated=8))
    assert env.ejections == []
    # Scrapes that keep coming but show no new token are no progress.
    env.run(STALL_S + 2 * STEP_S, lambda: env.scrape(0))
    assert env.ejections == [("ep-0", STALLED)]


def test_no_request_in_flight_is_never_stalled() -> None:
    env = Env()
    env.run(5 * STALL_S)  # scrapes stand still, no token is relayed: idle, not stalled
    assert env.ejections == []
    assert env.stalls == []
    assert env.ep(0).health.progress_at is None


def test_the_clock_starts_again_after_the_requests_ended() -> None:
    env = Env()
    env.busy(0)
    env.run(STALL_S - 3 * STEP_S)
    env.busy(0, requests=0)
    env.run(STEP_S)
    env.busy(0)
    env.run(STALL_S - 3 * STEP_S)  # busy for less than a timeout since it was idle
    assert env.ejections == []
    env.run(5 * STEP_S)
    assert env.ejections == [("ep-0", STALLED)]


def test_off_at_zero_and_for_engines_without_a_token_counter() -> None:
    env = Env(settings=OutlierSettings(stall_timeout_s=0.0, max_ejection_percent=100.0))
    env.busy(0)
    env.run(5 * STALL_S)
    assert env.ejections == []
    assert env.stalls == []
    env = Env()

    def no_counter() -> None:  # fresh scrapes of an engine that reports no token counter
        env.ep(0).metrics = EngineMetrics(scraped_at=env.clock.now())

    no_counter()
    env.busy(0)
    env.run(5 * STALL_S, each_step=no_counter)
    assert env.ejections == []
    assert env.stalls == []
    assert not stalled(env.ep(0), env.clock.now() + 1e6, STALL_S)


def test_the_ejection_limits_hold_and_nothing_is_aborted_when_kept() -> None:
    env = Env(n=2, settings=replace(SETTINGS, max_ejection_percent=50.0))
    env.busy(0)
    env.busy(1)
    env.run(STALL_S + 2 * STEP_S)
    # One of the two may go; the other is the pool's last and keeps its requests.
    assert len(env.ejections) == 1
    assert env.ejections[0][1] == STALLED
    assert env.stalls == [env.ejections[0][0]]
    kept = env.ep(1) if env.ejections[0][0] == "ep-0" else env.ep(0)
    assert not kept.health.ejected
    env.run(3 * STALL_S)
    assert len(env.stalls) >= 3  # the ejected one's, once per timeout; never the kept one's
    assert kept.name not in env.stalls
    assert len(env.ejections) == 1


def test_an_endpoint_ejected_for_failures_that_stalls_has_its_requests_ended() -> None:
    env = Env()
    env.ep(0).health.ejected_until = env.clock.now() + 60.0
    env.ep(0).health.sync()
    env.busy(0)
    env.run(STALL_S + 2 * STEP_S)
    assert env.stalls == ["ep-0"]
    assert env.ejections == []  # out already: no second ejection


def test_no_stall_while_the_host_waits_on_its_clients_not_on_the_server() -> None:
    env = Env()
    reading = False
    env.detector.waiting_on = lambda e: reading  # e.g. its streams' clients stopped reading
    env.busy(0)
    env.run(3 * STALL_S)
    assert env.ejections == []
    assert env.stalls == []
    # Now a read waits on the server: stalled within a timeout of the last check that said
    # no (which started the clock again).
    reading = True
    env.run(STALL_S + 2 * STEP_S)
    assert env.ejections == [("ep-0", STALLED)]
    assert env.stalls == ["ep-0"]


def test_ticks_are_frequent_enough_for_the_stall_timeout() -> None:
    assert SETTINGS.tick_s == pytest.approx(STALL_S / 10)
    assert OutlierSettings().tick_s == 0.25
    assert OutlierSettings(stall_timeout_s=0.0, base_ejection_s=1.0).tick_s == 0.1


def test_the_setting() -> None:
    assert OutlierDetectionSettings().stall_timeout_ms == 30_000
    spec = OutlierDetectionSettings.model_validate({"stallTimeoutMs": 300})
    assert outlier_settings(spec).stall_timeout_s == pytest.approx(0.3)
    assert outlier_settings(OutlierDetectionSettings.model_validate({"stallTimeoutMs": 0}))
    with pytest.raises(ValidationError):
        OutlierDetectionSettings.model_validate({"stallTimeoutMs": -1})


def test_without_new_scrapes_nothing_is_judged() -> None:
    """Scrapes failing or slower than their timeout leave the last snapshot in place: its
    counter tells nothing, so a busy endpoint is not found stalled on it."""
    env = Env()
    env.busy(0, requests=2)
    env.run(3 * STALL_S, scrapes=False)
    assert env.ejections == []
    assert env.stalls == []
    env.run(STALL_S + 2 * STEP_S)  # scrapes again, its counter still: stalled
    assert env.ejections == [("ep-0", STALLED)]
