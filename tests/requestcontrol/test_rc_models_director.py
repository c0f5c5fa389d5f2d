"""ModelTable (weighted targets, priorities, default pool) and the Director with Dispatch
accounting, on a hand-built datastore and the ``default`` scheduling preset."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
import pytest

from sluicegate.api.loader import build_config
from sluicegate.builtins import default_registry
from sluicegate.datalayer.datastore import EndpointSpec
from sluicegate.errors import GatewayError
from sluicegate.framework import Filter, PluginContext
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import CRITICALITY_PRIORITY, ModelRoute, ModelTable
from sluicegate.scheduling.config import BuiltScheduler
from sluicegate.scheduling.plugins.prefix_cache import ApproxPrefixCacheProducer
from sluicegate.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

REGISTRY = default_registry()

OBJECTIVE = "x-gateway-inference-objective"
REWRITE = "x-gateway-model-name-rewrite"


def table(*docs: dict[str, Any]) -> ModelTable:
    return ModelTable(build_config(list(docs)))


def picks(route: ModelRoute | None, n: int) -> list[str]:
    assert route is not None
    return [route.next_target() for _ in range(n)]


def expect_error(env: Any, status: int, body: dict[str, Any], headers: Any = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        env.route(body, headers)
    assert info.value.status == status, info.value.message
    return info.value


# =========================================================================== ModelTable


def test_swrr_90_10_exact(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("food-review", {"v1": 90, "v2": 10}))
    seq = picks(t.route("food-review"), 1000)
    assert Counter(seq) == {"v1": 900, "v2": 100}
    # Smooth: every run of ten has exactly one v2.
    for start in range(0, 1000, 10):
        assert seq[start : start + 10].count("v2") == 1


def test_swrr_3_2_1_pattern(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("m", {"a": 3, "b": 2, "c": 1}))
    seq = picks(t.route("m"), 60)
    assert seq[:6] == ["a", "b", "a", "c", "b", "a"]  # nginx's interleaving
    assert seq == seq[:6] * 10  # and it repeats exactly
    assert Counter(seq) == {"a": 30, "b": 20, "c": 10}


def test_swrr_5_1_1_interleaves(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("m", {"a": 5, "b": 1, "c": 1}))
    assert picks(t.route("m"), 7) == ["a", "a", "b", "a", "c", "a", "a"]


@pytest.mark.parametrize("seed", range(5))
def test_swrr_prefix_share_within_one_request(pool_doc: Any, model_doc: Any, seed: int) -> None:
    rng = random.Random(seed)
    weights = {f"t{i}": rng.randint(1, 50) for i in range(rng.randint(2, 6))}
    t = table(pool_doc(), model_doc("m", weights))
    total = sum(weights.values())
    counts: Counter[str] = Counter()
    for n, target in enumerate(picks(t.route("m"), 500), start=1):
        counts[target] += 1
        for name, w in weights.items():
            assert abs(counts[name] - n * w / total) < 1.0


def test_unweighted_targets_alternate(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("m", ["x", "y", "z"]))
    assert picks(t.route("m"), 6) == ["x", "y", "z", "x", "y", "z"]


def test_single_target_and_no_targets(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("one", {"only": 7}), model_doc("self"))
    assert picks(t.route("one"), 3) == ["only"] * 3
    assert picks(t.route("self"), 2) == ["self", "self"]  # no targetModels: the name itself


def test_routes_are_independent(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("a", {"a1": 1, "a2": 1}), model_doc("b", {"b1": 1, "b2": 1}))
    ra, rb = t.route("a"), t.route("b")
    assert picks(ra, 1) == ["a1"]
    assert picks(rb, 1) == ["b1"]
    assert picks(ra, 1) == ["a2"]


def test_criticality_priorities(pool_doc: Any, model_doc: Any) -> None:
    assert CRITICALITY_PRIORITY == {"Critical": 100, "Standard": 0, "Sheddable": -10}
    t = table(
        pool_doc(),
        model_doc("crit", criticality="Critical"),
        model_doc("std", criticality="Standard"),
        model_doc("shed", criticality="Sheddable"),
        model_doc("unset"),
    )
    assert [t.priority(t.route(m), None) for m in ("crit", "std", "shed", "unset")] == [
        100,
        0,
        -10,
        0,
    ]
    assert t.priority(None, None) == 0  # no InferenceModel


def test_objective_header_wins(pool_doc: Any, model_doc: Any, objective_doc: Any) -> None:
    t = table(
        pool_doc(),
        model_doc("shed", criticality="Sheddable"),
        objective_doc("interactive", 50),
        objective_doc("batch", -5),
        objective_doc("plain", None),
    )
    route = t.route("shed")
    assert t.priority(route, "interactive") == 50
    assert t.priority(route, "batch") == -5
    assert t.priority(None, "batch") == -5
    assert t.priority(route, "plain") == 0  # objective without priority = 0
    assert t.priority(route, "unknown-objective") == -10  # falls back to criticality
    assert t.priority(None, "unknown-objective") == 0


def test_default_pool_only_with_exactly_one_pool(pool_doc: Any, model_doc: Any) -> None:
    assert table(pool_doc("only")).default_pool == "only"
    assert table(pool_doc("a"), pool_doc("b")).default_pool is None
    assert table().default_pool is None


def test_route_lookup_and_public_names(pool_doc: Any, model_doc: Any) -> None:
    t = table(pool_doc(), model_doc("zeta", {"z": 1}), model_doc("alpha", {"a": 1}))
    assert t.public_names() == ["alpha", "zeta"]
    route = t.route("alpha")
    assert route is not None
    assert (route.public_name, route.pool, route.targets) == ("alpha", "pool", ["a"])
    assert t.route("z") is None  # targets are not public names


# =========================================================================== Director: models


def test_unknown_model_404_without_default_pool(
    route_env: Any, pool_doc: Any, model_doc: Any
) -> None:
    env = route_env([pool_doc("pool"), pool_doc("other"), model_doc("known", ["base"])])
    env.scrape_all()
    err = expect_error(env, 404, {"model": "mystery", "prompt": "x"})
    assert err.param == "model"
    assert err.code == "model_not_found"
    assert "mystery" in err.message
    assert env.route({"model": "known", "prompt": "x"}).pool.name == "pool"


def test_unknown_model_404_when_no_endpoint_lists_it(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"])
    expect_error(env, 404, {"model": "mystery", "prompt": "x"})
    # Served models pass as they are, to the only pool.
    d = env.route({"model": "base", "prompt": "x"})
    assert d.request.target_model == "base"
    assert d.body is None


def test_unlisted_endpoints_take_any_model(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    d = env.route({"model": "whatever", "prompt": "x"})
    assert d.request.target_model == "whatever"


def test_target_not_served_is_503(route_env: Any, pool_doc: Any, model_doc: Any) -> None:
    env = route_env([pool_doc(), model_doc("food-review", {"food-review-v1": 1})])
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"], adapters=["other-lora"])
    err = expect_error(env, 503, {"model": "food-review", "prompt": "x"})
    assert err.code == "no_endpoint"
    # The client's model is named, not the internal target it was split to.
    assert "'food-review'" in err.message
    assert "food-review-v1" not in err.message
    assert err.headers()["Retry-After"] == "1"


def test_rewrite_header_to_unserved_model_is_503(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"])
    expect_error(env, 503, {"model": "base", "prompt": "x"}, {REWRITE: "missing"})


def test_adapter_requests_only_to_endpoints_listing_it(route_env: Any) -> None:
    env = route_env(endpoints=4)
    env.scrape(0, waiting=50, kv_usage=0.9)  # lists the adapter but is busy
    env.scrape(1)  # idle, base only
    env.scrape(2, waiting=30, kv_usage=0.8)  # has not listed models yet
    env.scrape(3)  # idle, base only
    env.serve(0, base=["base"], adapters=["sql-lora"])
    env.serve(1, base=["base"])
    env.serve(3, base=["base"])
    seen = Counter()
    for _ in range(30):
        d = env.route({"model": "sql-lora", "prompt": "x", "max_tokens": 1})
        assert d.request.is_adapter
        assert d.request.target_model == "sql-lora"
        assert {e.name for e in [d.endpoint, *d.fallbacks]} <= {"ep-0", "ep-2"}
        seen[d.endpoint.name] += 1
        d.finish(0.0)
    assert set(seen) <= {"ep-0", "ep-2"}
    # Base-model requests may go anywhere; not adapters.
    d = env.route({"model": "base", "prompt": "x"})
    assert not d.request.is_adapter


# =========================================================================== Director: candidates


def test_ejected_endpoints_are_excluded(route_env: Any) -> None:
    env = route_env()
    env.scrape(0)  # the best one
    env.scrape(1, waiting=5, kv_usage=0.5)
    env.scrape(2, waiting=9, kv_usage=0.9)
    env.ep(0).health.ejected = True
    for _ in range(10):
        d = env.route({"model": "base", "prompt": "x"})
        assert d.endpoint.name != "ep-0"
        assert all(e.name != "ep-0" for e in d.fallbacks)
        d.finish(0.0)


def test_all_ejected_is_503(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    for i in range(3):
        env.ep(i).health.ejected = True
    err = expect_error(env, 503, {"model": "base", "prompt": "x"})
    assert err.reason == "no-endpoint"


def test_stale_endpoints_dropped_while_fresh_exist(route_env: Any) -> None:
    env = route_env()
    env.scrape(0, age=5.0)  # stale and looking idle: its last scrape says nothing is running
    env.scrape(1, waiting=20, kv_usage=0.9)
    env.scrape(2, waiting=20, kv_usage=0.9)
    for _ in range(10):
        d = env.route({"model": "base", "prompt": "x"})
        assert d.endpoint.name in {"ep-1", "ep-2"}
        assert "ep-0" not in {e.name for e in d.fallbacks}


def test_never_scraped_endpoints_dropped_while_fresh_exist(route_env: Any) -> None:
    env = route_env()
    env.scrape(2, waiting=50, kv_usage=0.99)
    for _ in range(5):
        assert env.route({"model": "base", "prompt": "x"}).endpoint.name == "ep-2"


def test_all_stale_are_kept(route_env: Any) -> None:
    env = route_env()
    env.scrape(0, age=10.0, waiting=9)
    env.scrape(1, age=10.0)
    env.scrape(2, age=10.0, waiting=9)
    d = env.route({"model": "base", "prompt": "x"})
    assert d.endpoint.name == "ep-1"
    assert {e.name for e in d.fallbacks} == {"ep-0", "ep-2"}


def test_none_scraped_still_routes(route_env: Any) -> None:
    env = route_env()
    d = env.route({"model": "base", "prompt": "x"})
    assert len([d.endpoint, *d.fallbacks]) == 3


def test_sheddable_without_candidates_is_429(
    route_env: Any, pool_doc: Any, model_doc: Any, objective_doc: Any
) -> None:
    env = route_env(
        [
            pool_doc(),
            model_doc("batch", ["base"], criticality="Sheddable"),
            model_doc("chat", ["base"], criticality="Standard"),
            objective_doc("low", -1),
            objective_doc("high", 10),
        ]
    )
    env.scrape_all()
    for i in range(3):
        env.ep(i).health.ejected = True
    err = expect_error(env, 429, {"model": "batch", "prompt": "x"})
    assert err.code == "shed"
    assert err.headers()["Retry-After"] == "1"
    expect_error(env, 429, {"model": "chat", "prompt": "x"}, {OBJECTIVE: "low"})
    expect_error(env, 503, {"model": "chat", "prompt": "x"})
    expect_error(env, 503, {"model": "batch", "prompt": "x"}, {OBJECTIVE: "high"})


def test_priority_reaches_the_request(
    route_env: Any, pool_doc: Any, model_doc: Any, objective_doc: Any
) -> None:
    env = route_env(
        [pool_doc(), model_doc("crit", ["base"], criticality="Critical"), objective_doc("o", -3)]
    )
    env.scrape_all()
    d = env.route({"model": "crit", "prompt": "x"})
    assert d.request.priority == 100
    assert not d.request.sheddable
    d = env.route({"model": "crit", "prompt": "x"}, {OBJECTIVE: "o"})
    assert d.request.priority == -3
    assert d.request.sheddable
    assert d.request.objective == "o"


# =========================================================================== Director: bodies


def test_body_untouched_when_target_is_the_model(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    d = env.route({"model": "base", "prompt": "x"})
    assert d.body is None
    assert not d.rewrites_model


def test_body_rewritten_for_weighted_target(route_env: Any, pool_doc: Any, model_doc: Any) -> None:
    env = route_env(
        [pool_doc(), model_doc("food-review", {"food-review-v1": 90, "food-review-v2": 10})]
    )
    env.scrape_all()
    body = {
        "model": "food-review",
        "prompt": "Rate this dish",
        "max_tokens": "16",
        "temperature": 0.7,
        "stream": True,
        "logit_bias": {"1": -100},
        "stop": ["\n"],
        "user": "ü",
    }
    targets = Counter()
    for _ in range(20):
        d = env.route(body)
        assert d.rewrites_model
        assert d.body is not None
        rewritten = orjson.loads(d.body)
        assert rewritten == {**body, "model": d.request.target_model}
        assert list(rewritten) == list(body)  # field order kept too
        assert d.request.model == "food-review"
        targets[d.request.target_model] += 1
        d.finish(0.0)
    assert targets == {"food-review-v1": 18, "food-review-v2": 2}


def test_body_rewritten_for_rewrite_header(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    d = env.route({"model": "base", "prompt": "x", "n": 1}, {REWRITE: "base-v2"})
    assert d.request.target_model == "base-v2"
    assert d.body is not None
    assert orjson.loads(d.body) == {"model": "base-v2", "prompt": "x", "n": 1}
    # Rewriting to the same name is no rewrite.
    assert env.route({"model": "base", "prompt": "x"}, {REWRITE: "base"}).body is None


def test_chat_body_rewrite(route_env: Any, pool_doc: Any, model_doc: Any) -> None:
    env = route_env([pool_doc(), model_doc("assistant", {"llama-chat": 1})])
    env.scrape_all()
    body = {"model": "assistant", "messages": [{"role": "user", "content": "hi"}], "seed": 3}
    d = env.route(body, kind="chat")
    assert d.body is not None
    assert orjson.loads(d.body) == {**body, "model": "llama-chat"}


# =========================================================================== Dispatch accounting


def test_dispatch_charges_inflight(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    d = env.route({"model": "base", "prompt": "x" * 1000, "max_tokens": 64})
    assert d.request.prompt_tokens == 250
    assert env.inflight()[d.endpoint.name] == (1, 250, 64)
    assert d.endpoint.inflight.requests_since_scrape == 1
    assert d.endpoint.inflight.prompt_tokens_since_scrape == 250
    assert d.dispatched_at == env.clock.now()
    assert d.attempts == 1


@pytest.mark.parametrize(
    ("prompt_bytes", "max_tokens", "decode"),
    [
        (1000, None, 375),  # 250 tokens × 1.5
        (4, None, 2),  # 1 token × 1.5, rounded
        (4 * 2731, None, 4096),  # 2731 × 1.5 = 4096.5 → capped
        (4 * 10_000, None, 4096),
        (1000, 10_000, 10_000),  # an explicit max_tokens is taken as is
    ],
)
def test_decode_estimate(
    route_env: Any, prompt_bytes: int, max_tokens: int | None, decode: int
) -> None:
    env = route_env()
    env.scrape_all()
    body: dict[str, Any] = {"model": "base", "prompt": "y" * prompt_bytes}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    d = env.route(body)
    assert env.inflight()[d.endpoint.name][2] == decode


def test_prompt_charge_discounted_by_prefix_match(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    shared = "".join(chr(65 + i % 26) for i in range(1024))  # 256 tokens = 4 blocks of 64
    first = env.route({"model": "base", "prompt": shared, "max_tokens": 1})
    assert env.inflight()[first.endpoint.name][1] == 256  # nothing cached yet
    first.finish(1.0)

    # 6 blocks, the first 4 of which the same endpoint has: it wins and is charged 2/6.
    second = env.route({"model": "base", "prompt": shared + "z" * 512, "max_tokens": 1})
    assert second.endpoint is first.endpoint
    assert second.request.prompt_tokens == 384
    assert env.inflight()[second.endpoint.name] == (1, 128, 1)
    second.finish(2.0)

    third = env.route({"model": "base", "prompt": shared, "max_tokens": 1})
    assert third.endpoint is first.endpoint
    assert env.inflight()[third.endpoint.name] == (1, 0, 1)  # fully cached


def test_mark_first_byte_releases_prompt_once(route_env: Any) -> None:
    env = route_env(endpoints=1)  # both requests on one endpoint
    env.scrape_all()
    a = env.route({"model": "base", "prompt": "a" * 400, "max_tokens": 5})
    b = env.route({"model": "base", "prompt": "b" * 800, "max_tokens": 7})
    assert env.inflight()["ep-0"] == (2, 300, 12)
    a.mark_first_byte(1.5)
    assert a.first_byte_at == 1.5
    assert env.inflight()["ep-0"] == (2, 200, 12)
    a.mark_first_byte(1.7)  # repeated: no effect, and never b's tokens
    assert a.first_byte_at == 1.5
    assert env.inflight()["ep-0"] == (2, 200, 12)
    a.finish(2.0)
    assert env.inflight()["ep-0"] == (1, 200, 7)
    b.finish(3.0)
    assert env.inflight()["ep-0"] == (0, 0, 0)


def test_unanswered_prompts_split_at_the_endpoints_last_token(route_env: Any) -> None:
    env = route_env(endpoints=1)
    env.scrape_all()
    inflight = env.ep(0).inflight

    def split() -> tuple[int, int]:
        return inflight.prompt_tokens_before_last_token, inflight.prompt_tokens_after_last_token

    a = env.route({"model": "base", "prompt": "a" * 400, "max_tokens": 5})  # 100 tokens
    assert split() == (0, 100)
    a.mark_first_byte(1.0)  # the endpoint's first token: a is answered
    assert split() == (0, 0)
    b = env.route({"model": "base", "prompt": "b" * 800, "max_tokens": 5})  # 200
    a.mark_token(1.1)  # a's next token: an iteration began with b in the queue
    c = env.route({"model": "base", "prompt": "c" * 40, "max_tokens": 5})  # 10
    assert split() == (200, 10)
    c.finish(1.2, ok=False)  # gone before its first byte: leaves the next iteration
    assert split() == (200, 0)
    b.retry_next()  # only endpoint: no fallback, but its charge is released
    b.finish(1.3, ok=False)
    assert split() == (0, 0)
    a.finish(1.4)
    assert split() == (0, 0)


def test_first_byte_after_finish_releases_nothing(route_env: Any) -> None:
    env = route_env(endpoints=1)
    env.scrape_all()
    a = env.route({"model": "base", "prompt": "a" * 400, "max_tokens": 5})
    b = env.route({"model": "base", "prompt": "b" * 800, "max_tokens": 7})
    a.finish(1.0)  # e.g. the client went away before the upstream answered
    a.mark_first_byte(1.5)  # the upstream's first byte arrives late
    assert env.inflight()["ep-0"] == (1, 200, 7)  # b's prompt tokens are untouched
    inflight = env.ep(0).inflight
    split = (inflight.prompt_tokens_before_last_token, inflight.prompt_tokens_after_last_token)
    assert split == (200, 0)  # b was queued before that token
    b.finish(2.0)
    assert env.inflight()["ep-0"] == (0, 0, 0)
    assert inflight.prompt_tokens_before_last_token == 0


def test_finish_is_idempotent(route_env: Any) -> None:
    env = route_env(endpoints=1)
    env.scrape_all()
    keep = env.route({"model": "base", "prompt": "k" * 40, "max_tokens": 3})
    d = env.route({"model": "base", "prompt": "x" * 400, "max_tokens": 9})
    d.finish(5.0)
    d.finish(6.0)
    d.finish(7.0)
    assert d.finished_at == 5.0
    assert env.inflight()["ep-0"] == (1, 10, 3)
    keep.finish(8.0)
    assert env.inflight()["ep-0"] == (0, 0, 0)


def _ranked_env(route_env: Any) -> Any:
    env = route_env(endpoints=4)
    for i, waiting in enumerate([0, 2, 4, 8]):
        env.scrape(i, waiting=waiting)
    return env


def test_fallbacks_ordered_by_score(route_env: Any) -> None:
    env = _ranked_env(route_env)
    d = env.route({"model": "base", "prompt": "x"})
    assert d.endpoint.name == "ep-0"
    assert [e.name for e in d.fallbacks] == ["ep-1", "ep-2", "ep-3"]


def test_retry_next_moves_charges(route_env: Any) -> None:
    env = _ranked_env(route_env)
    d = env.route({"model": "base", "prompt": "x" * 40, "max_tokens": 4})
    assert env.inflight()["ep-0"] == (1, 10, 4)
    nxt = d.retry_next()
    assert nxt is not None
    assert nxt.name == "ep-1"
    assert d.endpoint is nxt
    assert d.attempts == 2
    assert env.inflight()["ep-0"] == (0, 0, 0)
    assert env.inflight()["ep-1"] == (1, 10, 4)
    # The unanswered prompt moves with it, raw (the 10 tokens are all uncached here).
    assert env.ep(0).inflight.prompt_tokens_after_last_token == 0
    assert env.ep(1).inflight.prompt_tokens_after_last_token == 10

    env.ep(2).health.ejected = True  # ejected meanwhile: skipped
    nxt = d.retry_next()
    assert nxt is not None
    assert nxt.name == "ep-3"
    assert d.attempts == 3
    assert env.inflight()["ep-1"] == (0, 0, 0)
    assert env.inflight()["ep-3"] == (1, 10, 4)

    assert d.retry_next() is None  # nothing left: the charges are already released
    assert all(v == (0, 0, 0) for v in env.inflight().values())
    assert all(env.ep(i).inflight.prompt_tokens_after_last_token == 0 for i in range(4))
    d.finish(9.0)  # the caller still finishes: nothing more is released
    assert d.finished_at == 9.0
    d.mark_first_byte(9.5)
    assert all(v == (0, 0, 0) for v in env.inflight().values())


def test_no_retry_after_first_byte_or_finish(route_env: Any) -> None:
    env = _ranked_env(route_env)
    d = env.route({"model": "base", "prompt": "x" * 40, "max_tokens": 4})
    d.mark_first_byte(1.0)
    assert d.retry_next() is None
    assert d.endpoint.name == "ep-0"
    assert env.inflight()["ep-0"] == (1, 0, 4)  # still running there
    d.finish(2.0)
    e = env.route({"model": "base", "prompt": "x" * 40, "max_tokens": 4})
    e.finish(3.0)
    assert e.retry_next() is None
    assert all(v == (0, 0, 0) for v in env.inflight().values())


def test_retry_recomputes_prefix_discount(route_env: Any) -> None:
    env = _ranked_env(route_env)
    prompt = "".join(chr(97 + i % 26) for i in range(512))  # 2 blocks
    warm = env.route({"model": "base", "prompt": prompt, "max_tokens": 1})
    assert warm.endpoint.name == "ep-0"
    warm.finish(0.0)
    d = env.route({"model": "base", "prompt": prompt, "max_tokens": 1})
    assert d.endpoint.name == "ep-0"
    assert env.inflight()["ep-0"] == (1, 0, 1)  # cached on ep-0
    nxt = d.retry_next()
    assert nxt is not None
    assert env.inflight()[nxt.name] == (1, 128, 1)  # not cached on the fallback
    d.finish(1.0)
    assert all(v == (0, 0, 0) for v in env.inflight().values())


@pytest.mark.parametrize("seed", range(6))
def test_any_sequence_returns_inflight_to_zero(route_env: Any, seed: int) -> None:
    """Random interleavings of dispatch, first byte, retry, finish and ejection: after every
    step each endpoint's counters equal what the live requests should hold; at the end, 0."""
    rng = random.Random(seed)
    env = route_env(endpoints=4, seed=seed)
    env.scrape_all()
    live: list[tuple[Dispatch, int, int]] = []  # dispatch, prompt tokens, decode tokens
    prompt_held: dict[int, bool] = {}
    done: set[int] = set()

    def expected() -> dict[str, tuple[int, int, int]]:
        out = {e.name: (0, 0, 0) for e in env.datastore.all_endpoints()}
        for d, prompt, decode in live:
            if id(d) in done:
                continue
            r, p, c = out[d.endpoint.name]
            out[d.endpoint.name] = (r + 1, p + (prompt if prompt_held[id(d)] else 0), c + decode)
        return out

    for step in range(300):
        op = rng.random()
        if op < 0.3 or not live:
            # A unique first block: no prefix match anywhere, so prompt charges are whole.
            prompt = f"{step:08d}" * rng.randint(1, 40)
            decode = rng.randint(1, 50)
            body = {"model": "base", "prompt": prompt, "max_tokens": decode}
            if all(e.health.ejected for e in env.datastore.all_endpoints()):
                with pytest.raises(GatewayError) as info:
                    env.route(body)
                assert info.value.status == 503
            else:
                d = env.route(body)
                live.append((d, d.request.prompt_tokens, decode))
                prompt_held[id(d)] = True
        else:
            d, _, _ = rng.choice(live)
            if op < 0.5:
                if d.first_byte_at is None and id(d) not in done:
                    prompt_held[id(d)] = False
                d.mark_first_byte(env.clock.now())
            elif op < 0.65:
                eligible = id(d) not in done and d.first_byte_at is None
                ahead = [e for e in d.fallbacks if not e.health.ejected]
                result = d.retry_next()
                if not eligible:
                    assert result is None
                elif ahead:
                    assert result is ahead[0]
                    assert d.endpoint is result
                else:
                    assert result is None
                    done.add(id(d))
            elif op < 0.9:
                d.finish(env.clock.now())
                done.add(id(d))
            else:
                ep = env.ep(rng.randrange(4))
                ep.health.ejected = not ep.health.ejected
        env.clock.advance(0.01)
        assert env.inflight() == expected(), f"step {step}"
        for e in env.datastore.all_endpoints():
            assert min(e.inflight.requests, e.inflight.prompt_tokens, e.inflight.decode_tokens) >= 0

    for d, _, _ in live:
        d.finish(env.clock.now())
    assert all(v == (0, 0, 0) for v in env.inflight().values())


# =========================================================================== Director: misc


def test_removed_endpoints_are_forgotten_by_plugins(route_env: Any) -> None:
    env = route_env(endpoints=2)
    env.scrape_all()
    d = env.route({"model": "base", "prompt": "p" * 1024})
    producer = env.built.plugins["approx-prefix-cache-producer"]
    assert isinstance(producer, ApproxPrefixCacheProducer)
    assert producer.index.endpoint_size(d.endpoint.name) > 0
    keep = [e for e in env.datastore.pools["pool"].endpoints if e is not d.endpoint]
    env.datastore.set_endpoints("pool", [EndpointSpec(e.name, e.host, e.port) for e in keep])
    assert producer.index.endpoint_size(d.endpoint.name) == 0


def test_request_fields_from_parse(route_env: Any) -> None:
    env = route_env()
    env.scrape_all()
    headers = {
        "x-gateway-inference-fairness-id": "tenant-1",
        "x-slo-ttft-ms": "200",
        "x-llm-d-slo-tpot-ms": "20",
    }
    body = {
        "model": "base",
        "prompt": "hello",
        "stream": "true",
        "max_tokens": 8,
        "cache_salt": "s",
    }
    d = env.route(body, headers)
    r = d.request
    assert r.request_id.startswith("req-")
    assert (r.model, r.target_model, r.prompt, r.prompt_tokens) == ("base", "base", b"hello", 2)
    assert (r.stream, r.max_tokens, r.cache_salt) == (True, 8, "s")
    assert (r.fairness_id, r.slo_ttft_ms, r.slo_tpot_ms) == ("tenant-1", 200.0, 20.0)
    assert r.headers == headers
    assert r.arrival == env.clock.now()
    assert r.body_bytes == len(orjson.dumps(body))
    assert d.response_headers == {}


class _DropEvenEndpoints(Filter):
    """A filter keeping only odd-numbered endpoints."""

    def filter(self, request: Any, state: Any, endpoints: Any) -> list[Any]:
        return [e for e in endpoints if int(e.name.removeprefix("ep-")) % 2 == 1]


def test_fallbacks_respect_the_profiles_filters(route_env: Any) -> None:
    env = route_env(endpoints=5)
    env.scrape_all()
    context = PluginContext(env.clock, 0)
    profile = SchedulerProfile(
        "p",
        picker=REGISTRY.create("max-score-picker", "picker", None, context),
        filters=[_DropEvenEndpoints("odd", context)],
        scorers=[WeightedScorer(REGISTRY.create("queue-scorer", "q", None, context), 1.0)],
    )
    handler = REGISTRY.create("single-profile-handler", "h", None, context)
    env.director.built = BuiltScheduler(Scheduler(handler, {"p": profile}), {}, REGISTRY)
    d = env.route({"model": "base", "prompt": "x" * 100})
    tried = [d.endpoint.name]
    while (nxt := d.retry_next()) is not None:
        tried.append(nxt.name)
    assert sorted(tried) == ["ep-1", "ep-3"]
    d.finish(env.clock.now())
    assert all(v == (0, 0, 0) for v in env.inflight().values())


@pytest.mark.parametrize(
    ("default", "header", "expected"),
    [
        (True, None, True),
        (False, None, False),
        (False, "true", True),
        (True, "false", False),
    ],
)
def test_prediction_based_scheduling_header_overrides_the_default(
    route_env: Any, default: bool, header: str | None, expected: bool
) -> None:
    env = route_env()
    env.scrape_all()
    env.director.prediction_default = default
    headers = {} if header is None else {"x-prediction-based-scheduling": header}
    d = env.route({"model": "base", "prompt": "hi"}, headers)
    assert d.request.prediction_based is expected


def test_requests_are_prediction_based_unless_they_opt_out(route_env: Any) -> None:
    # The reference's default since GIE v1.3.0 (and llm-d-router's, which has no opt-out):
    # no header → predictions; the -off header → the heuristics.
    from sluicegate.api.settings import LatencyPredictorSettings

    assert LatencyPredictorSettings().prediction_based_scheduling_default is True
    env = route_env()
    env.scrape_all()
    body = {"model": "base", "prompt": "hi"}
    assert env.route(body, {}).request.prediction_based is True
    off = env.route(body, {"x-prediction-based-scheduling-off": "true"})
    assert off.request.prediction_based is False
