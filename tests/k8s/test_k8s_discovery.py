"""KubernetesDiscovery against the fake API server, through the real kubernetes-asyncio client.

Every test waits for a condition on the delivered state (bounded by ``WAIT_S``), never for a
fixed time, so the suite is fast and not timing-sensitive.
"""

from __future__ import annotations

import asyncio

from k8s_fake_apiserver import (
    CRDS,
    FakeApiServer,
    free_port,
    model,
    objective,
    pod,
    pool_v1,
    pool_v1alpha2,
    rewrite,
)
from k8s_support import FAST, WAIT_S, Delivery, DiscoveryFactory, Recorder

from sluicegate.api.loader import parse_config
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.pools import sync_pools
from sluicegate.k8s import (
    DiscoverySettings,
    KubernetesDiscovery,
    api_client_for,
)
from sluicegate.requestcontrol.models import ModelTable

POOL = "llama3-8b"
VLLM = {"app": "vllm-llama3-8b"}


def weights(d: Delivery, public: str) -> list[tuple[str, int | None]]:
    return [(t.name, t.weight) for t in d.config.models[public].spec.target_models]


def priority(d: Delivery, name: str) -> int | None:
    return d.config.objectives[name].spec.priority


async def until(predicate: object) -> None:
    """Wait until ``predicate()`` is true (polling the event loop)."""
    assert callable(predicate)
    async with asyncio.timeout(WAIT_S):
        # Polls state other tasks own (reflector counters, the server's watch list).
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def watching(apiserver: FakeApiServer, count: int = 6) -> None:
    """Wait until the server holds ``count`` open watches (one per collection): the
    discovery is synced once every list is done, a moment before its watches arrive."""
    await until(lambda: apiserver.active_watches == count)


# ---------------------------------------------------------------------- the initial state


async def test_initial_sync_builds_config_and_endpoints(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(model("base", "meta-llama/Llama-3.1-8B-Instruct", POOL, "Critical"))
    apiserver.apply(model("food-review", "food-review", POOL, "Standard", [("food-review-1", 100)]))
    apiserver.apply(objective("batch", -10, POOL))
    apiserver.apply(pod("vllm-a", {**VLLM, "zone": "east"}, ip="10.0.0.1"))
    sglang = {**VLLM, "inference.networking.k8s.io/engine-type": "sglang"}
    apiserver.apply(pod("vllm-b", sglang, ip="10.0.0.2"))
    apiserver.apply(pod("vllm-starting", VLLM, ip="10.0.0.3", ready=False))
    apiserver.apply(pod("vllm-no-ip", VLLM, ip=None, ready=True))
    apiserver.apply(pod("other", {"app": "other"}, ip="10.0.0.9"))

    disc, rec = await discovery()

    first = rec.deliveries[0]
    assert len(rec.deliveries) == 1, "the first delivery carries the complete state"
    assert list(first.config.pools) == [POOL]
    assert sorted(first.config.models) == ["food-review", "meta-llama/Llama-3.1-8B-Instruct"]
    assert first.config.models["meta-llama/Llama-3.1-8B-Instruct"].spec.criticality == "Critical"
    assert priority(first, "batch") == -10
    assert first.names(POOL) == ["vllm-a-rank-0", "vllm-b-rank-0"]
    a, b = first.endpoints[POOL]
    assert (a.host, a.port, a.engine_type, a.scheme) == ("10.0.0.1", 8000, "vllm", "http")
    assert a.labels == {**VLLM, "zone": "east"}
    assert (b.host, b.engine_type) == ("10.0.0.2", "sglang")
    assert disc.problems == []
    assert disc.snapshot is not None
    assert disc.snapshot.config == first.config


async def test_base_config_supplies_picker_and_gateway(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    base = parse_config(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
        "kind: EndpointPickerConfig\n"
        "plugins: [{type: queue-scorer}]\n"
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer}]}]\n"
    )
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    _, rec = await discovery(base=base)
    assert rec.last.config.picker == base.picker
    assert list(rec.last.config.pools) == [POOL]


# ---------------------------------------------------------------------- pods


async def test_pod_ready_unready_deleting_deleted(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ready=False))
    _, rec = await discovery()
    assert rec.last.names(POOL) == []

    apiserver.apply(pod("vllm-a", VLLM, ready=True))
    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-a-rank-0"])

    apiserver.apply(pod("vllm-a", VLLM, ready=False))
    await rec.wait_for(lambda d: d.names(POOL) == [])

    apiserver.apply(pod("vllm-a", VLLM, ready=True))
    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-a-rank-0"])

    # Graceful deletion: the pod still exists (and may still report Ready) but is leaving.
    apiserver.apply(pod("vllm-a", VLLM, ready=True, deleting=True))
    await rec.wait_for(lambda d: d.names(POOL) == [])

    apiserver.apply(pod("vllm-b", VLLM, ip="10.0.0.2"))
    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-b-rank-0"])
    apiserver.delete("v1", "Pod", "vllm-b")
    await rec.wait_for(lambda d: d.names(POOL) == [])


async def test_pod_ip_change_is_a_new_endpoint_address(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    _, rec = await discovery()
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.7"))
    got = await rec.wait_for(lambda d: d.endpoints[POOL][0].host == "10.0.0.7")
    assert got.names(POOL) == ["vllm-a-rank-0"]


async def test_label_changes_move_pods_between_pools(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1("blue", {"app": "vllm", "track": "blue"}, [8000]))
    apiserver.apply(pool_v1alpha2("green", {"app": "vllm", "track": "green"}, 8000))
    apiserver.apply(pod("p1", {"app": "vllm", "track": "blue"}, ip="10.0.0.1"))
    apiserver.apply(pod("p2", {"app": "vllm", "track": "blue"}, ip="10.0.0.2"))
    _, rec = await discovery()
    assert rec.last.names("blue") == ["p1-rank-0", "p2-rank-0"]
    assert rec.last.names("green") == []

    apiserver.apply(pod("p2", {"app": "vllm", "track": "green"}, ip="10.0.0.2"))
    await rec.wait_for(
        lambda d: d.names("blue") == ["p1-rank-0"] and d.names("green") == ["p2-rank-0"]
    )

    apiserver.apply(pod("p1", {"app": "vllm"}, ip="10.0.0.1"))  # matches neither selector
    await rec.wait_for(lambda d: d.names("blue") == [] and d.names("green") == ["p2-rank-0"])

    # A label change that keeps membership is still delivered (labels are endpoint data).
    apiserver.apply(pod("p2", {"app": "vllm", "track": "green", "zone": "b"}, ip="10.0.0.2"))
    got = await rec.wait_for(lambda d: d.endpoints["green"][0].labels.get("zone") == "b")
    assert got.names("green") == ["p2-rank-0"]

    # Engine type from the llm-d label.
    labels = {"app": "vllm", "track": "green", "llm-d.ai/engine-type": "trtllm-serve"}
    apiserver.apply(pod("p2", labels, ip="10.0.0.2"))
    await rec.wait_for(lambda d: d.endpoints["green"][0].engine_type == "trtllm-serve")


async def test_multiple_target_ports_make_one_endpoint_each(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1("dp", VLLM, [8000, 8001, 8002]))
    apiserver.apply(pool_v1alpha2("single", VLLM, 9000))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    apiserver.apply(pod("vllm-b", VLLM, ip="10.0.0.2"))
    _, rec = await discovery()
    dp = rec.last.endpoints["dp"]
    assert [(e.name, e.host, e.port) for e in dp] == [
        ("vllm-a-rank-0", "10.0.0.1", 8000),
        ("vllm-a-rank-1", "10.0.0.1", 8001),
        ("vllm-a-rank-2", "10.0.0.1", 8002),
        ("vllm-b-rank-0", "10.0.0.2", 8000),
        ("vllm-b-rank-1", "10.0.0.2", 8001),
        ("vllm-b-rank-2", "10.0.0.2", 8002),
    ]
    assert [(e.name, e.port) for e in rec.last.endpoints["single"]] == [
        ("vllm-a-rank-0", 9000),
        ("vllm-b-rank-0", 9000),
    ]
    # Changing the pool's ports changes the endpoints without restart.
    apiserver.apply(pool_v1("dp", VLLM, [8000]))
    await rec.wait_for(lambda d: d.names("dp") == ["vllm-a-rank-0", "vllm-b-rank-0"])


# ---------------------------------------------------------------------- models and objectives


async def test_inference_model_weight_changes_apply_without_restart(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(model("food-review", "food-review", POOL, "Standard", [("v1", 90), ("v2", 10)]))
    _, rec = await discovery()
    assert weights(rec.last, "food-review") == [("v1", 90), ("v2", 10)]

    apiserver.apply(model("food-review", "food-review", POOL, "Standard", [("v1", 50), ("v2", 50)]))
    await rec.wait_for(lambda d: weights(d, "food-review") == [("v1", 50), ("v2", 50)])

    apiserver.apply(model("food-review", "food-review", POOL, "Sheddable", [("v2", 1)]))
    got = await rec.wait_for(lambda d: weights(d, "food-review") == [("v2", 1)])
    assert got.config.models["food-review"].spec.criticality == "Sheddable"

    apiserver.delete("inference.networking.x-k8s.io/v1alpha2", "InferenceModel", "food-review")
    await rec.wait_for(lambda d: "food-review" not in d.config.models)


async def test_inference_objective_priority_changes(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(objective("standard", 0, POOL))
    _, rec = await discovery()
    assert priority(rec.last, "standard") == 0

    apiserver.apply(objective("standard", -5, POOL))
    await rec.wait_for(lambda d: priority(d, "standard") == -5)
    apiserver.apply(objective("critical", 100, POOL))
    await rec.wait_for(lambda d: d.config.objectives.keys() == {"standard", "critical"})
    apiserver.delete("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective", "standard")
    await rec.wait_for(lambda d: list(d.config.objectives) == ["critical"])


async def test_model_rewrites_are_discovered_oldest_first_and_follow_updates(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(rewrite("canary", POOL, [(["llama"], [("llama-v1", 90), ("llama-v2", 10)])]))
    apiserver.apply(rewrite("younger", POOL, [(["llama"], [("other", 1)]), ([], [("base", 1)])]))
    apiserver.apply(rewrite("orphan", "no-such-pool", [(["x"], [("y", 1)])]))
    bad = rewrite("no-targets", POOL, [(["z"], [])])
    apiserver.apply(bad)
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))

    disc, rec = await discovery()
    cfg = rec.last.config
    assert list(cfg.rewrites) == ["canary", "younger"]
    assert cfg.rewrites["canary"].metadata.creation_timestamp  # kept: it decides precedence
    table = ModelTable(cfg)
    route = table.route("llama")
    assert route is not None
    assert (route.rewrite, route.targets, route.weights) == (
        "canary",
        ["llama-v1", "llama-v2"],
        [90, 10],
    )
    generic = table.route("anything")
    assert generic is not None
    assert (generic.rewrite, generic.targets) == ("younger", ["base"])
    text = "\n".join(disc.problems)
    assert "InferenceModelRewrite default/orphan" in text
    assert "unknown InferencePool 'no-such-pool'" in text
    assert "InferenceModelRewrite default/no-targets" in text

    # A new split applies on the next delivery; a deletion hands the name to the other.
    apiserver.apply(rewrite("canary", POOL, [(["llama"], [("llama-v1", 50), ("llama-v2", 50)])]))
    await rec.wait_for(
        lambda d: [t.weight for t in d.config.rewrites["canary"].spec.rules[0].targets] == [50, 50]
    )
    apiserver.delete("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite", "canary")
    last = await rec.wait_for(lambda d: "canary" not in d.config.rewrites)
    route = ModelTable(last.config).route("llama")
    assert route is not None
    assert (route.rewrite, route.targets) == ("younger", ["other"])


async def test_invalid_objects_are_reported_and_ignored(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    broken_pool = pool_v1("broken", VLLM, [8000])
    broken_pool["spec"]["targetPorts"] = []  # a pool needs ports
    apiserver.apply(broken_pool)
    apiserver.apply(model("good", "good", POOL))
    apiserver.apply(model("zero", "zero", POOL, targets=[("a", 0)]))  # weight >= 1
    apiserver.apply(model("bad-crit", "bad-crit", POOL, criticality="Urgent"))
    apiserver.apply(model("orphan", "orphan", "no-such-pool"))
    apiserver.apply(model("on-broken", "on-broken", "broken"))
    apiserver.apply(model("dup", "good", POOL))  # same modelName as the older "good"
    apiserver.apply(objective("ok", 5, POOL))
    apiserver.apply(objective("nan", "high", POOL))
    apiserver.apply(pod("vllm-a", {**VLLM, "llm-d.ai/engine-type": "tgi"}, ip="10.0.0.1"))

    disc, rec = await discovery()
    cfg = rec.last.config
    assert list(cfg.pools) == [POOL]
    assert list(cfg.models) == ["good"]
    assert cfg.models["good"].metadata.name == "good"
    assert list(cfg.objectives) == ["ok"]
    text = "\n".join(disc.problems)
    for fragment in (
        "InferencePool default/broken (inference.networking.k8s.io/v1)",
        "InferenceModel default/zero",
        "InferenceModel default/bad-crit",
        "InferenceModel default/orphan (inference.networking.x-k8s.io/v1alpha2): "
        "spec.poolRef.name: unknown InferencePool 'no-such-pool'",
        "InferenceModel default/on-broken",
        "InferenceModel default/dup",
        "InferenceObjective default/nan",
        "unknown engine type 'tgi'",
    ):
        assert fragment in text, fragment
    assert "spec.targetModels.0.weight" in text
    # The pod is still an endpoint (engine type passed through, as with static endpoints).
    assert rec.last.endpoints[POOL][0].engine_type == "tgi"

    # Fixing the pool brings it (and the model pointing at it) in.
    apiserver.apply(pool_v1("broken", VLLM, [8000]))
    await rec.wait_for(lambda d: "broken" in d.config.pools and "on-broken" in d.config.models)
    assert not any("default/broken" in p for p in disc.problems)


async def test_pool_in_both_api_groups_resolves_to_v1(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pool_v1alpha2(POOL, {"app": "old"}, 9000))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    disc, rec = await discovery()
    assert rec.last.endpoints[POOL][0].port == 8000
    assert any("v1alpha2): ignored" in p for p in disc.problems)


async def test_pool_name_restricts_to_one_pool(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1("a", {"app": "a"}, [8000]))
    apiserver.apply(pool_v1("b", {"app": "b"}, [8000]))
    apiserver.apply(model("ma", "ma", "a"))
    apiserver.apply(model("mb", "mb", "b"))
    apiserver.apply(objective("ob", 1, "b"))
    apiserver.apply(pod("pa", {"app": "a"}))
    disc, rec = await discovery("a")
    assert disc.ready
    assert list(rec.last.config.pools) == ["a"]
    assert list(rec.last.config.models) == ["ma"]
    assert rec.last.config.objectives == {}
    assert rec.last.names("a") == ["pa-rank-0"]
    assert disc.problems == []

    apiserver.delete("inference.networking.k8s.io/v1", "InferencePool", "a")
    await rec.wait_for(lambda d: d.config.pools == {} and d.config.models == {})
    assert disc.problems[0] == "InferencePool default/a: not found or invalid"
    assert not disc.ready


# ---------------------------------------------------------------------- watch robustness


async def test_dropped_watch_resumes_from_last_version(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    disc, rec = await discovery()
    await watching(apiserver)
    watches = disc.pods.watches

    apiserver.pause_delivery()  # the next changes happen while the stream is stuck ...
    apiserver.apply(pod("vllm-b", VLLM, ip="10.0.0.2"))
    apiserver.delete("v1", "Pod", "vllm-a")
    apiserver.break_watches()  # ... and then the connection drops
    apiserver.resume_delivery()
    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-b-rank-0"])
    assert disc.pods.watches > watches
    assert disc.pods.lists == 1, "resumed from the last resourceVersion, no relist"
    # The re-watch asked for the version after the first list.
    resumed = [q for p, q in apiserver.requests if p.endswith("/pods") and q.get("watch")]
    assert len({q["resourceVersion"] for q in resumed}) == 1

    # A clean end of the stream (server-side timeout) is followed by a new watch.
    watches = disc.pods.watches
    apiserver.end_watches()
    await until(lambda: disc.pods.watches > watches and apiserver.active_watches == 6)
    apiserver.apply(pod("vllm-c", VLLM, ip="10.0.0.3"))
    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-b-rank-0", "vllm-c-rank-0"])
    assert disc.pods.lists == 1


async def test_gone_during_watch_relists_and_catches_up(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    apiserver.apply(model("m", "m", POOL, targets=[("x", 1)]))
    disc, rec = await discovery()
    await watching(apiserver)

    apiserver.pause_delivery()
    apiserver.delete("v1", "Pod", "vllm-a")  # missed, then compacted away:
    apiserver.apply(pod("vllm-b", VLLM, ip="10.0.0.2"))  # only a relist can show these
    apiserver.apply(model("m", "m", POOL, targets=[("x", 1), ("y", 3)]))
    apiserver.compact()
    apiserver.expire_watches()  # ERROR 410 on the open streams
    apiserver.resume_delivery()

    got = await rec.wait_for(
        lambda d: d.names(POOL) == ["vllm-b-rank-0"] and len(weights(d, "m")) == 2
    )
    assert weights(got, "m") == [("x", 1), ("y", 3)]
    assert disc.pods.lists == 2
    assert disc.models.lists == 2


async def test_too_old_version_at_reconnect_relists(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    disc, rec = await discovery()
    await watching(apiserver)

    apiserver.pause_delivery()
    apiserver.delete("v1", "Pod", "vllm-a")
    apiserver.apply(pod("vllm-b", VLLM, ip="10.0.0.2"))
    apiserver.compact()
    apiserver.break_watches()  # reconnect with the old version → ERROR 410 at once
    apiserver.resume_delivery()

    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-b-rank-0"])
    assert disc.pods.lists == 2


async def test_bookmarks_advance_the_version(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    disc, rec = await discovery()
    await watching(apiserver)
    # Changes to other collections advance the shared version; a bookmark tells the pod
    # watch about it, so after a compaction it can still resume without a relist.
    for i in range(3):
        apiserver.apply(objective(f"o{i}", i, POOL))
    await rec.wait_for(lambda d: len(d.config.objectives) == 3)
    apiserver.bookmark()
    await until(lambda: disc.pods.resource_version == str(apiserver.rv))
    apiserver.compact()
    apiserver.break_watches()
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    await rec.wait_for(lambda d: d.names(POOL) == ["vllm-a-rank-0"])
    assert disc.pods.lists == 1


async def test_server_errors_are_retried_with_backoff(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    apiserver.fail("pods", 500, times=3, watch=False)  # the first lists fail
    apiserver.fail("inferencemodels", 503, times=2, watch=True)  # and some watches
    disc, rec = await discovery()
    assert rec.last.names(POOL) == ["vllm-a-rank-0"]
    assert apiserver.count("pods", watch=False) == 4
    await until(lambda: apiserver.count("inferencemodels", watch=True) >= 3)
    apiserver.apply(model("m", "m", POOL))
    await rec.wait_for(lambda d: "m" in d.config.models)
    assert disc.models.lists == 1


async def test_unreachable_api_server_is_retried_until_it_is_up() -> None:
    port = free_port()
    api = api_client_for(f"http://127.0.0.1:{port}")
    disc = KubernetesDiscovery(api, "default", settings=DiscoverySettings(0.02, reflector=FAST))
    server = FakeApiServer()
    await disc.start()
    try:
        await until(lambda: disc.pods.last_error is not None)  # connection refused
        assert not disc.synced
        server.apply(pool_v1(POOL, VLLM, [8000]))
        await server.start(port)
        async with asyncio.timeout(WAIT_S):
            snapshot = await disc.wait_synced()
        assert list(snapshot.config.pools) == [POOL]
    finally:
        await disc.stop()
        await api.close()
        await server.stop()


async def test_missing_crd_counts_as_empty_until_installed(
    discovery: DiscoveryFactory, apiserver: FakeApiServer
) -> None:
    models_crd = CRDS[2]
    apiserver.uninstall(*models_crd)
    apiserver.uninstall(*CRDS[1])
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(objective("o", 1, POOL))
    disc, rec = await discovery()
    assert list(rec.last.config.objectives) == ["o"]
    assert disc.models.unavailable is not None
    assert any("inferencemodels" in p and "not found" in p for p in disc.problems)

    apiserver.install(*models_crd)
    apiserver.apply(model("m", "m", POOL))
    await rec.wait_for(lambda d: "m" in d.config.models)
    await until(lambda: disc.models.unavailable is None)


async def test_forbidden_collection_is_reported(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    apiserver.fail("inferenceobjectives", 403, times=-1)
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM))
    disc, rec = await discovery()
    assert rec.last.names(POOL) == ["vllm-a-rank-0"]
    assert any("inferenceobjectives" in p and "forbidden" in p for p in disc.problems)


async def test_list_is_paged(apiserver: FakeApiServer, discovery: DiscoveryFactory) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    for i in range(7):
        apiserver.apply(pod(f"vllm-{i}", VLLM, ip=f"10.0.0.{i + 1}"))
    _, rec = await discovery(page_size=3)
    assert len(rec.last.names(POOL)) == 7
    assert apiserver.count("pods", watch=False) == 3


async def test_store_is_bounded(apiserver: FakeApiServer, discovery: DiscoveryFactory) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    for i in range(5):
        apiserver.apply(pod(f"vllm-{i}", VLLM, ip=f"10.0.0.{i + 1}"))
    disc, _ = await discovery(max_objects=3, page_size=2)
    assert len(disc.pods.store) == 3
    assert any("more than 3 objects" in p for p in disc.problems)
    apiserver.apply(pod("vllm-9", VLLM, ip="10.0.0.99"))  # a watch event beyond the bound
    await until(lambda: disc.pods.overflow == 2)  # 1 seen while listing, 1 by watch
    assert len(disc.pods.store) == 3


# ---------------------------------------------------------------------- delivery


async def test_bursts_are_coalesced(apiserver: FakeApiServer, discovery: DiscoveryFactory) -> None:
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    disc, rec = await discovery(debounce_s=0.1)
    await watching(apiserver)
    before = len(rec.deliveries)
    apiserver.pause_delivery()
    for i in range(40):
        apiserver.apply(pod(f"vllm-{i:02d}", VLLM, ip=f"10.0.1.{i + 1}"))
    apiserver.resume_delivery()  # 40 events in one burst
    await rec.wait_for(lambda d: len(d.names(POOL)) == 40)
    assert len(rec.deliveries) - before < 10, len(rec.deliveries) - before

    # Events that change nothing the consumer sees are not delivered.
    count = len(rec.deliveries)
    apiserver.apply(pod("unrelated", {"app": "x"}))
    apiserver.apply(pod("vllm-00", VLLM, ip="10.0.1.1"))  # same state, new resourceVersion
    await until(lambda: "unrelated" in disc.pods.store)
    await asyncio.sleep(0.25)  # longer than the debounce window: nothing more may come
    assert len(rec.deliveries) == count


async def test_async_and_failing_callbacks(apiserver: FakeApiServer, api: object) -> None:
    calls: list[int] = []

    async def on_change(config: object, endpoints: dict[str, list[object]]) -> None:
        await asyncio.sleep(0)
        calls.append(len(endpoints.get(POOL, [])))
        if len(calls) == 1:
            raise RuntimeError("consumer bug")

    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    disc = KubernetesDiscovery(
        api,  # type: ignore[arg-type]
        "default",
        on_change=on_change,
        settings=DiscoverySettings(0.02, reflector=FAST),
    )
    await disc.start()
    try:
        await until(lambda: calls == [0])
        apiserver.apply(pod("vllm-a", VLLM))
        await until(lambda: calls == [0, 1])
    finally:
        await disc.stop()


async def test_sync_pools_keeps_endpoint_state(
    apiserver: FakeApiServer, discovery: DiscoveryFactory
) -> None:
    store = Datastore()
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    apiserver.apply(pod("vllm-a", VLLM, ip="10.0.0.1"))
    _, rec = await discovery()
    sync_pools(store, rec.last.config, rec.last.endpoints)
    kept = store.pools[POOL].endpoints[0]
    kept.inflight.dispatch(100, 10)
    assert store.pools[POOL].failure_mode == "FailClose"

    apiserver.apply(pod("vllm-b", VLLM, ip="10.0.0.2"))
    await rec.wait_for(lambda d: len(d.names(POOL)) == 2)
    sync_pools(store, rec.last.config, rec.last.endpoints)
    assert [e.name for e in store.pools[POOL].endpoints] == ["vllm-a-rank-0", "vllm-b-rank-0"]
    assert store.pools[POOL].endpoints[0] is kept
    assert kept.inflight.requests == 1

    apiserver.delete("inference.networking.k8s.io/v1", "InferencePool", POOL)
    await rec.wait_for(lambda d: d.config.pools == {})
    sync_pools(store, rec.last.config, rec.last.endpoints)
    assert store.pools == {}


# ---------------------------------------------------------------------- stop


async def test_stop_cancels_everything(apiserver: FakeApiServer, api: object) -> None:
    before = asyncio.all_tasks()

    def new_tasks() -> set[asyncio.Task[object]]:
        # Tasks started since the test began, except the fake server's request handlers.
        return {
            t
            for t in asyncio.all_tasks() - before
            if not t.get_coro().__qualname__.startswith("RequestHandler")  # type: ignore[union-attr]
        }

    recorder = Recorder()
    apiserver.apply(pool_v1(POOL, VLLM, [8000]))
    disc = KubernetesDiscovery(
        api,  # type: ignore[arg-type]
        "default",
        on_change=recorder,
        settings=DiscoverySettings(0.02, reflector=FAST),
    )
    await disc.start()
    async with asyncio.timeout(WAIT_S):
        await disc.wait_synced()
    await watching(apiserver)
    names = sorted(t.get_name() for t in new_tasks())
    assert len(names) == 7  # 6 reflectors + the emitter
    assert all(n.startswith("sluicegate-k8s-") for n in names)

    await disc.stop()
    assert not disc.running
    assert new_tasks() == set()
    await until(lambda: apiserver.active_watches == 0)  # the server saw the streams close
    count = len(recorder.deliveries)
    apiserver.apply(pod("vllm-a", VLLM))
    await asyncio.sleep(0.1)
    assert len(recorder.deliveries) == count
    await disc.stop()  # idempotent
