"""Gateway replicas in the discrete-event lab (``--gateway-replicas``): the options are
checked, runs record them, shared state changes routing (and a channel that loses
everything routes exactly as independent replicas), and the feeds stay bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate import cli
from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_sharing import (
    Delivery,
    InflightFeed,
    ReplicaSettings,
    ShareChannel,
    Spreader,
)
from sluicegate.bench.des_spec import ClusterSpec, RunResult
from sluicegate.bench.goals_replicas import replica_verdicts
from sluicegate.bench.policies import policy_config
from sluicegate.bench.replica_seeds import summary
from sluicegate.bench.runner import run_level
from sluicegate.bench.scenario_spec import Scenario
from sluicegate.bench.scenarios import get_scenario
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.runtime.shared_wire import encode_load


def chat() -> Scenario:
    return get_scenario("multi-turn-chat").quick_variant()


def run(policy: str = "default", seed: int = 0, **settings: object) -> RunResult:
    gateways = ReplicaSettings(**settings)  # type: ignore[arg-type]
    return run_level(chat(), policy, 2.0, 4.0, seed, gateways=gateways)


def hit_rate(result: RunResult) -> float:
    queries = sum(e.counters.prefix_cache_queries for e in result.engines)
    return sum(e.counters.prefix_cache_hits for e in result.engines) / queries


def routes(result: RunResult) -> list[tuple[float, int, float, float]]:
    return [(r.arrival, r.endpoint, r.first_token, r.finish) for r in result.records]


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"gateways": 0}, "gateway replicas must be 1"),
        ({"gateways": 65}, "gateway replicas must be 1"),
        ({"state": "gossip"}, "not one of independent, shared"),
        ({"spread": "random"}, "not one of round-robin, session"),
        ({"delay_s": -0.001}, "share delay must be 0"),
        ({"delay_s": float("nan")}, "share delay must be 0"),
        ({"delay_s": 1.5}, "share delay must be 0 … 1000 ms"),
        ({"delay_s": 0.5, "lease_s": 0.5}, "must be below the lease"),
        ({"loss": 1.5}, "share loss must be 0 … 1"),
        ({"inflight_sync_s": 0.0}, "inflight_sync_s must be a positive number"),
    ],
)
def test_settings_refuse_bad_values(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicaSettings(**settings)  # type: ignore[arg-type]


def test_sharing_needs_shared_state_and_several_replicas() -> None:
    assert ReplicaSettings(2, "shared").sharing
    assert not ReplicaSettings(2, "independent").sharing
    assert not ReplicaSettings(1, "shared").sharing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replica-state", "gossip"], "known: independent, shared, both"),
        (["--replica-spread", "random"], "known: round-robin, session"),
        (["--gateway-replicas", "two"], "--gateway-replicas must be comma-separated counts"),
        (["--gateway-replicas", "2,2"], "names a count twice"),
        (["--gateway-replicas", "0"], "--gateway-replicas: gateway replicas must be 1"),
        (
            ["--gateway-replicas", "2", "--replica-state", "shared", "--replica-share-loss", "2"],
            "--replica-share-loss: share loss must be 0 … 1",
        ),
        (
            ["--gateway-replicas", "2", "--replica-share-delay-ms", "3"],
            "--replica-share-delay-ms: apply to --replica-state shared",
        ),
        (
            [
                "--gateway-replicas",
                "2",
                "--replica-state",
                "shared",
                "--replica-model-sync-ms",
                "0",
            ],
            "--replica-model-sync-ms: model_sync_s must be a positive number",
        ),
        (["--gateway-replicas", "2", "--mode", "http"], "simulated in --mode des only"),
    ],
)
def test_cli_refuses_bad_replica_options(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "run", "multi-turn-chat", "--quick", *args, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_runs_record_their_replicas(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(
            [
                "bench",
                "run",
                "multi-turn-chat",
                "--quick",
                "--duration",
                "3",
                "--policies",
                "default",
                "--gateway-replicas",
                "1,2",
                "--replica-state",
                "both",
                "--replica-spread",
                "session",
                "--replica-share-delay-ms",
                "4",
                "--replica-share-loss",
                "0.25",
                "--replica-model-sync-ms",
                "250",
                "--out",
                str(out),
            ]
        )
    assert exited.value.code == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    got = [(r["gateway_replicas"], r["replica_state"]) for r in runs]
    assert got == [(1, "independent"), (2, "independent"), (2, "shared")]
    for r in runs:
        assert r["replica_spread"] == "session"
        assert r["replica_share_delay_ms"] == pytest.approx(4.0)
        assert r["replica_share_loss"] == pytest.approx(0.25)
    # `default` has no online-trained models: none are recorded, nor a sync period (the
    # training service serves shared replicas' online-trained models only).
    assert [r["replica_models"] for r in runs] == ["none", "none", "none"]
    assert [r["replica_model_sync_ms"] for r in runs] == [None, None, None]
    assert "replica_sharing" not in runs[1]
    sharing = runs[2]["replica_sharing"]
    assert sharing["messages_sent"] > 0
    assert sharing["copies_lost"] > 0
    assert sharing["copies_delivered"] > 0
    report = (out / "report.md").read_text()
    assert "default × 2 gw shared by session" in report
    assert "shared gateway replicas (default @ 2): prefix hit rate" in report
    assert "4 ms, each copy lost with probability 0.25" in report


# ---------------------------------------------------------------------- behaviour


def test_one_replica_is_the_single_gateway_run() -> None:
    assert routes(run()) == routes(run_level(chat(), "default", 2.0, 4.0, 0))
    assert routes(run(gateways=1, state="shared")) == routes(run())


def test_replica_runs_are_deterministic() -> None:
    assert routes(run(gateways=2, state="shared")) == routes(run(gateways=2, state="shared"))


def test_shared_prefix_decisions_win_back_the_hits_independent_replicas_lose() -> None:
    one, independent = hit_rate(run()), hit_rate(run(gateways=3))
    shared_run = run(gateways=3, state="shared")
    shared = hit_rate(shared_run)
    assert independent < 0.9 * one  # round-robin strangers split each conversation
    assert shared > independent + 0.1
    assert shared_run.sharing is not None
    assert shared_run.sharing["prefix_records_applied"] > 0


def test_a_channel_losing_everything_routes_as_independent_replicas() -> None:
    lost = run(gateways=3, state="shared", loss=1.0)
    assert routes(lost) == routes(run(gateways=3))
    assert lost.sharing is not None
    assert lost.sharing["copies_delivered"] == 0
    assert lost.sharing["copies_lost"] > 0


def test_shared_in_flight_counts_reach_the_peers() -> None:
    """During a run, each replica's endpoints carry the others' in-flight requests."""
    scenario = chat()
    picker, predictor = policy_config("least-request")
    spec = ClusterSpec(
        scenario.profile,
        scenario.replicas,
        picker,
        predictor=predictor,
        model=scenario.model,
        gateways=ReplicaSettings(2, "shared", delay_s=0.0),
    )
    sim = ClusterSimulation(spec)
    seen: list[int] = []
    sim.on_complete.append(
        lambda record, dispatch: seen.append(
            sum(e.peers.requests for e in sim.gateways[1].endpoints)
        )
    )
    sim.run(scenario.workload(2.0, 3.0, 0), horizon_s=60.0)
    assert max(seen) > 0
    for gateway in sim.gateways:  # nothing in flight at the end: nothing leaks
        assert all(e.inflight.requests == 0 for e in gateway.endpoints)
        # every replica published once more after the last finish: no peer count is left
        assert all(e.peers.requests == e.peers.prompt_tokens == 0 for e in gateway.endpoints)


# ---------------------------------------------------------------------- pieces


def test_spreader_round_robin_and_by_session() -> None:
    rr = Spreader(3, "round-robin")
    assert [rr.pick(7) for _ in range(4)] == [0, 1, 2, 0]
    by_session = Spreader(3, "session")
    assert len({by_session.pick(7) for _ in range(5)}) == 1
    assert len({by_session.pick(s) for s in range(30)}) == 3
    assert [by_session.pick(-1) for _ in range(3)] == [0, 1, 2]  # no session: round-robin


def test_channel_delays_and_loses_copies() -> None:
    got: list[tuple[float, Delivery]] = []
    channel = ShareChannel(3, 0.01, 0.0, 0, lambda t, d: got.append((t, d)))
    channel.send(0, 1, b"x", 2.0)
    assert [(t, d.receiver) for t, d in got] == [(2.01, 0), (2.01, 2)]
    half = ShareChannel(2, 0.0, 0.5, 0, lambda t, d: None)
    for _ in range(1000):
        half.send(0, 0, b"x", 0.0)
    assert 400 < half.lost < 600


def test_in_flight_snapshots_expire_with_their_lease() -> None:
    stores = []
    for _ in range(2):
        store = Datastore()
        store.set_endpoints("p", [EndpointSpec("a", "10.0.0.1", 8000)])
        stores.append(store)
    feed = InflightFeed(stores, interval_s=0.025, lease_s=1.0)
    feed.receive(1, 0, encode_load([("a", 3, 100, 20)]), sent_at=0.0, now=0.001)
    peers = stores[1].all_endpoints()[0].peers
    assert (peers.requests, peers.prompt_tokens, peers.decode_tokens) == (3, 100, 20)
    feed.publish(1, now=0.5)  # still within the lease
    assert peers.requests == 3
    feed.publish(1, now=1.01)  # the sender went silent: its counts are gone
    assert peers.requests == 0
    assert feed._latest[1] == {}


def test_seed_summary_pairs_each_seed_with_its_own_single_replica() -> None:
    def doc(one: float, shared: float) -> dict[str, object]:
        def entry(n: int, state: str, rate: float) -> dict[str, object]:
            return {
                "policy": "default",
                "load": 2,
                "gateway_replicas": n,
                "replica_state": state,
                "metrics": {"engine_prefix_hit_rate": rate, "by_class": {}},
            }

        return {
            "scenario": "multi-turn-chat",
            "runs": [entry(1, "independent", one), entry(2, "shared", shared)],
        }

    table = summary([doc(0.80, 0.79), doc(0.60, 0.50), doc(0.70, 0.70)])
    row = next(line for line in table.splitlines() if "| shared |" in line)
    # per seed: -1.25 %, -16.7 %, 0 % → median -1.2; two of three seeds within 3 %
    assert "-1.2 [-16.7–+0.0]" in row
    assert row.endswith("| 2/3 |")
    with pytest.raises(ValueError, match="different scenarios"):
        summary([doc(0.8, 0.8), {"scenario": "slo-mixed", "runs": []}])


# ---------------------------------------------------------------------- regressions


@pytest.mark.parametrize(
    ("policy", "hits", "endpoints", "finish_sum"),
    [
        ("default", 17840, "023113011320001012320301230230002", 313.455981),
        # Moved on purpose once since: chat requests keyed as the simulator renders them
        # (before, precise routing found none of a chat's blocks: 8112 hits).
        ("predicted-latency-precise", 18976, "231022122312213222312223232122221", 315.149821),
    ],
)
def test_one_replica_routes_as_the_code_before_replicas(
    policy: str, hits: int, endpoints: str, finish_sum: float
) -> None:
    """Fixed expectations computed with the simulation as it was before gateway replicas
    (commit 138710f's parent): the approximate path and the precise path (KV events, the
    online-trained predictor). Change them only with a change meant to move one-gateway
    runs, and say which."""
    result = run(policy)
    assert len(result.records) == 33
    assert sum(e.counters.prefix_cache_hits for e in result.engines) == hits
    assert sum(e.counters.prefix_cache_queries for e in result.engines) == 21670
    assert "".join(str(r.endpoint) for r in result.records) == endpoints
    assert sum(r.finish for r in result.records) == pytest.approx(finish_sum, abs=1e-6)
    assert result.end_time == pytest.approx(20.0)


def test_a_shared_run_that_cannot_be_judged_does_not_hide_one_that_failed() -> None:
    def entry(n: int, state: str, rate: float | None) -> dict[str, object]:
        return {
            "policy": "default",
            "load": 2,
            "gateway_replicas": n,
            "replica_state": state,
            "metrics": {"engine_prefix_hit_rate": rate, "by_class": {}},
        }

    def verdict(*runs: dict[str, object]) -> bool | None:
        doc = {"scenario": "slo-mixed", "runs": list(runs)}
        for r in runs:
            r["metrics"]["slo_attainment"] = r["metrics"]["engine_prefix_hit_rate"]  # type: ignore[index]
        (v,) = replica_verdicts(doc)
        return v.met

    one = entry(1, "independent", 0.9)
    assert verdict(one, entry(2, "shared", 0.5), entry(4, "shared", None)) is False
    assert verdict(one, entry(2, "shared", None), entry(4, "shared", 0.9)) is None
    assert verdict(one, entry(2, "shared", 0.89), entry(4, "shared", 0.9)) is True


@pytest.mark.parametrize(
    "flag", ["--replica-share-delay-ms", "--replica-share-loss", "--replica-model-sync-ms"]
)
def test_cli_refuses_a_zero_share_option_without_shared_state(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "run", "multi-turn-chat", "--quick", "--gateway-replicas", "2", flag, "0"]
    with pytest.raises(SystemExit) as exited:
        cli.main([*args, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert f"{flag}: apply to --replica-state shared" in capsys.readouterr().err
