"""OutlierDetector on a manual clock: what ejects, for how long, and what never does."""

from __future__ import annotations

import logging

import pytest

from sluicegate.clock import ManualClock
from sluicegate.datalayer.collector import Collector, CollectorSettings
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.outlier import (
    CONSECUTIVE_5XX,
    CONSECUTIVE_GATEWAY_FAILURE,
    FAILURE_PERCENTAGE,
    PROBATION,
    SUCCESS_RATE,
    OutlierDetector,
    OutlierSettings,
    Result,
    classify_status,
)
from sluicegate.upstream import UpstreamPool

# Statistical tests off unless a test turns them on: each test sees one rule at work.
QUIET = OutlierSettings(
    interval_s=10.0,
    base_ejection_s=30.0,
    max_ejection_s=300.0,
    max_ejection_percent=100.0,
    success_rate_minimum_hosts=0,
    failure_percentage_threshold=0.0,
)


class Env:
    def __init__(self, n: int = 3, settings: OutlierSettings = QUIET) -> None:
        self.clock = ManualClock(1000.0)
        self.datastore = Datastore()
        specs = [EndpointSpec(f"ep-{i}", "127.0.0.1", 9000 + i) for i in range(n)]
        self.datastore.set_endpoints("pool", specs)
        self.detector = OutlierDetector(self.datastore, self.clock, settings)
        self.ejections: list[tuple[str, str]] = []
        self.detector.on_eject.append(lambda e, reason: self.ejections.append((e.name, reason)))

    def ep(self, i: int) -> Endpoint:
        return self.datastore.pools["pool"].endpoints[i]

    def fail(self, i: int, result: Result = Result.ERROR_STATUS, times: int = 1) -> None:
        for _ in range(times):
            self.detector.record(self.ep(i), result)

    def succeed(self, i: int, times: int = 1) -> None:
        for _ in range(times):
            self.detector.record(self.ep(i), Result.SUCCESS)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.detector.tick()


@pytest.mark.parametrize(
    ("status", "result"),
    [
        (200, Result.SUCCESS),
        (400, Result.SUCCESS),
        (404, Result.SUCCESS),
        (429, Result.NEUTRAL),
        (0, Result.NEUTRAL),
        (500, Result.ERROR_STATUS),
        (501, Result.SUCCESS),
        (502, Result.ERROR_STATUS),
        (503, Result.ERROR_STATUS),
        (504, Result.ERROR_STATUS),
    ],
)
def test_status_classification(status: int, result: Result) -> None:
    assert classify_status(status) is result


def test_consecutive_5xx_threshold() -> None:
    env = Env()
    env.fail(0, times=4)
    assert not env.ep(0).health.ejected
    env.fail(0)
    assert env.ep(0).health.ejected
    assert env.ep(0).health.ejected_until == pytest.approx(1030.0)
    assert env.ejections == [("ep-0", CONSECUTIVE_5XX)]


def test_consecutive_gateway_failures_threshold() -> None:
    env = Env()
    env.fail(1, Result.CONNECT_ERROR)
    env.fail(1, Result.RESET)
    assert not env.ep(1).health.ejected
    env.fail(1, Result.TIMEOUT)
    assert env.ep(1).health.ejected
    assert env.ejections == [("ep-1", CONSECUTIVE_GATEWAY_FAILURE)]


def test_a_success_resets_the_counts_and_429_changes_nothing() -> None:
    env = Env()
    env.fail(0, times=4)
    env.fail(0, Result.NEUTRAL, times=10)  # 429s between them: neither kind of result
    env.succeed(0)
    assert env.ep(0).health.consecutive_5xx == 0
    env.fail(0, times=2)
    env.fail(0, Result.RESET, times=2)
    assert env.ep(0).health.consecutive_gateway_failures == 2
    assert env.ep(0).health.consecutive_5xx == 4
    env.succeed(0)
    assert env.ep(0).health.consecutive_gateway_failures == 0
    env.fail(0, Result.RESET, times=2)
    assert not env.ep(0).health.ejected
    assert env.ejections == []


def test_a_5xx_between_gateway_failures_breaks_their_run() -> None:
    env = Env()
    env.fail(0, Result.RESET, times=2)
    env.fail(0, Result.ERROR_STATUS)
    env.fail(0, Result.RESET, times=1)
    assert not env.ep(0).health.ejected  # 4 server errors, not 3 gateway failures in a row
    env.fail(0, Result.RESET)  # the fifth failure of any kind: consecutive 5xx
    assert env.ejections == [("ep-0", CONSECUTIVE_5XX)]


def test_scrapes_do_not_clear_request_failure_counts() -> None:
    # A successful scrape is the collector's record_success; it leaves request counts alone.
    env = Env()
    collector = Collector(env.datastore, UpstreamPool(), env.clock, CollectorSettings())
    env.fail(0, Result.RESET, times=2)
    for _ in range(100):
        collector.record_success(env.ep(0))
    env.fail(0, Result.RESET)
    assert env.ejections == [("ep-0", CONSECUTIVE_GATEWAY_FAILURE)]


def test_ejection_ends_on_time_then_probation() -> None:
    env = Env()
    env.fail(0, Result.RESET, times=3)
    env.advance(29.0)
    assert env.ep(0).health.ejected
    env.advance(1.0)
    health = env.ep(0).health
    assert not health.ejected
    assert health.on_probation
    assert health.consecutive_gateway_failures == 0
    env.succeed(0)  # one good request ends probation
    assert not health.on_probation
    env.fail(0, Result.RESET, times=2)
    assert not health.ejected


def test_a_failure_on_probation_ejects_again_for_longer() -> None:
    env = Env()
    env.fail(0, Result.RESET, times=3)
    env.advance(30.0)
    env.fail(0, Result.ERROR_STATUS)  # one failure is enough on probation
    health = env.ep(0).health
    assert health.ejected
    assert health.times_ejected == 2
    assert health.ejected_until == pytest.approx(env.clock.now() + 60.0)  # linear back-off
    assert env.ejections[-1] == ("ep-0", PROBATION)


def test_back_off_is_capped_and_decays() -> None:
    env = Env(
        settings=OutlierSettings(
            base_ejection_s=30.0,
            max_ejection_s=100.0,
            interval_s=10.0,
            max_ejection_percent=100.0,
            success_rate_minimum_hosts=0,
            failure_percentage_threshold=0.0,
        )
    )
    health = env.ep(0).health
    durations = []
    for _ in range(5):
        env.fail(0, Result.RESET, times=3)
        assert health.ejected_until is not None
        durations.append(health.ejected_until - env.clock.now())
        env.advance(health.ejected_until - env.clock.now())
        assert not health.ejected
        env.succeed(0)
    assert durations == pytest.approx([30.0, 60.0, 90.0, 100.0, 100.0])
    assert health.times_ejected == 5
    for _ in range(3):  # healthy intervals in service
        env.succeed(0)
        env.advance(10.0)
    assert health.times_ejected == 2
    env.fail(0, Result.RESET, times=3)
    assert health.ejected_until == pytest.approx(env.clock.now() + 90.0)


def test_max_ejection_percent() -> None:
    settings = OutlierSettings(
        max_ejection_percent=40.0, success_rate_minimum_hosts=0, failure_percentage_threshold=0
    )
    env = Env(n=5, settings=settings)  # 40 % of 5: two endpoints at most
    for i in range(4):
        env.fail(i, Result.RESET, times=3)
    assert [env.ep(i).health.ejected for i in range(5)] == [True, True, False, False, False]
    # The counts stay: room is made when ep-0 returns, and ep-2 goes at its next failure.
    env.advance(30.0)
    assert not env.ep(0).health.ejected
    env.fail(2, Result.RESET)
    assert env.ep(2).health.ejected


def test_at_least_one_may_go_but_never_the_last() -> None:
    small = OutlierSettings(
        max_ejection_percent=10.0, success_rate_minimum_hosts=0, failure_percentage_threshold=0
    )
    env = Env(n=3, settings=small)  # 10 % of 3 rounds to 0: one may go all the same
    env.fail(0, Result.RESET, times=3)
    assert env.ep(0).health.ejected
    env.fail(1, Result.RESET, times=3)
    assert not env.ep(1).health.ejected

    env = Env(n=2)  # max 100 %: still, the last endpoint stays
    env.fail(0, Result.RESET, times=3)
    env.fail(1, Result.RESET, times=30)
    assert env.ep(0).health.ejected
    assert not env.ep(1).health.ejected
    env = Env(n=1)
    env.fail(0, Result.RESET, times=30)
    assert not env.ep(0).health.ejected
    assert env.ejections == []


def test_scrape_ejected_endpoints_count_against_the_cap() -> None:
    env = Env(n=2)
    env.ep(1).health.scrape_ejected = True
    env.ep(1).health.sync()
    env.fail(0, Result.RESET, times=3)
    assert not env.ep(0).health.ejected  # the only endpoint left


def test_an_endpoint_out_for_its_scrapes_can_still_be_ejected_for_its_requests() -> None:
    env = Env(n=2)
    health = env.ep(0).health
    health.scrape_ejected = True
    health.sync()
    env.fail(0, Result.RESET, times=3)
    assert health.ejected_until is not None  # so a good scrape alone will not bring it back
    health.scrape_ejected = False
    health.sync()
    assert health.ejected


def success_rate_env(n: int) -> Env:
    return Env(
        n=n,
        settings=OutlierSettings(
            consecutive_5xx=0,
            consecutive_gateway_failure=0,
            max_ejection_percent=100.0,
            success_rate_minimum_hosts=5,
            success_rate_request_volume=20,
            success_rate_stdev_factor=1.9,
            failure_percentage_threshold=0.0,
        ),
    )


def test_success_rate_outlier_is_ejected_at_the_interval() -> None:
    env = success_rate_env(6)
    for i in range(6):
        env.succeed(i, times=40)
    env.fail(5, times=20)  # ep-5: 67 % where the others have 100 %
    env.advance(9.0)
    assert not env.ep(5).health.ejected  # not before the interval ends
    env.advance(1.0)
    assert env.ep(5).health.ejected
    assert [r for _, r in env.ejections] == [SUCCESS_RATE]
    assert all(not env.ep(i).health.ejected for i in range(5))


def test_success_rate_needs_volume_and_hosts() -> None:
    env = success_rate_env(6)
    for i in range(6):
        env.succeed(i, times=40)
    env.fail(5, times=20)
    env.ep(0).health.interval_successes = 5  # below the volume: ep-0 does not count
    env.ep(1).health.interval_successes = 5  # ...nor ep-1: four hosts left, fewer than 5
    env.advance(10.0)
    assert env.ejections == []
    # The counts start again each interval.
    assert env.ep(5).health.interval_failures == 0


def test_spread_out_failures_are_not_an_outlier() -> None:
    env = success_rate_env(6)
    for i in range(6):
        env.succeed(i, times=40)
        env.fail(i, times=4 + i % 2)  # all about 90 %
    env.advance(10.0)
    assert env.ejections == []


def test_failure_percentage_in_a_small_pool() -> None:
    settings = OutlierSettings(
        consecutive_5xx=0,
        consecutive_gateway_failure=0,
        success_rate_minimum_hosts=5,
        failure_percentage_threshold=50.0,
        failure_percentage_minimum_hosts=2,
        failure_percentage_request_volume=20,
    )
    env = Env(n=3, settings=settings)
    for i in range(3):
        env.succeed(i, times=20)
    for _ in range(20):  # alternating: never many in a row
        env.fail(0)
        env.fail(0, Result.RESET)
        env.succeed(0)
    env.advance(10.0)
    assert env.ejections == [("ep-0", FAILURE_PERCENTAGE)]


def test_ejection_and_return_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    env = Env()
    with caplog.at_level(logging.INFO, logger="sluicegate.outlier"):
        env.fail(2, Result.TIMEOUT, times=3)
        env.advance(30.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1
    assert "ep-2" in warnings[0].getMessage()
    assert CONSECUTIVE_GATEWAY_FAILURE in warnings[0].getMessage()
    assert len(infos) == 1
    assert "probation" in infos[0].getMessage()


def test_failures_of_a_request_under_way_while_ejected_do_not_extend_it() -> None:
    env = Env()
    env.fail(0, Result.RESET, times=3)
    until = env.ep(0).health.ejected_until
    env.fail(0, Result.RESET, times=5)
    assert env.ep(0).health.ejected_until == until
    assert len(env.ejections) == 1


def test_removed_endpoint_is_not_ejected() -> None:
    env = Env()
    gone = env.ep(0)
    env.datastore.set_endpoints("pool", [EndpointSpec("ep-1", "127.0.0.1", 9001)])
    env.detector.record(gone, Result.RESET)
    env.detector.record(gone, Result.RESET)
    env.detector.record(gone, Result.RESET)
    assert not gone.health.ejected
