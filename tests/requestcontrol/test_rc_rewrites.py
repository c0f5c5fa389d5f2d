"""InferenceModelRewrite in the model table and the director: precedence, weighted splits,
the rewrite header, the body sent upstream."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from sluicegate.api.loader import build_config
from sluicegate.errors import GatewayError
from sluicegate.metrics import ANY_MODEL_LABEL, NO_MODEL_LABEL
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import parse_other

REWRITE_HEADER = "x-gateway-model-name-rewrite"


def rewrite_doc(
    name: str,
    rules: list[tuple[list[str], dict[str, int | None]]],
    created: str | None = None,
    pool: str = "pool",
) -> dict[str, Any]:
    """``rules``: (matched names, {target: weight or None}) each."""
    metadata: dict[str, Any] = {"name": name}
    if created is not None:
        metadata["creationTimestamp"] = created
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": metadata,
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "name": pool},
            "rules": [
                {
                    "matches": [{"model": {"type": "Exact", "value": m}} for m in matches],
                    "targets": [
                        {"modelRewrite": t} if w is None else {"modelRewrite": t, "weight": w}
                        for t, w in targets.items()
                    ],
                }
                for matches, targets in rules
            ],
        },
    }


def table(*docs: dict[str, Any]) -> ModelTable:
    return ModelTable(build_config(list(docs)))


def test_weighted_split_is_exact_over_each_window(pool_doc: Any) -> None:
    t = table(pool_doc(), rewrite_doc("canary", [(["llama"], {"llama-v1": 90, "llama-v2": 10})]))
    route = t.route("llama")
    assert route is not None
    assert (route.pool, route.rewrite, route.public_name) == ("pool", "canary", "llama")
    for _ in range(3):
        window = Counter(route.next_target() for _ in range(100))
        assert window == {"llama-v1": 90, "llama-v2": 10}
    assert t.public_names() == ["llama"]  # /v1/models lists the matched name


def test_unweighted_targets_split_evenly(pool_doc: Any) -> None:
    route = table(pool_doc(), rewrite_doc("r", [(["m"], {"a": None, "b": None})])).route("m")
    assert route is not None
    assert [route.next_target() for _ in range(4)] == ["a", "b", "a", "b"]


def test_one_rule_matches_several_names_each_with_its_own_route(pool_doc: Any) -> None:
    t = table(pool_doc(), rewrite_doc("r", [(["m1", "m2"], {"t": None})]))
    first, second = t.route("m1"), t.route("m2")
    assert first is not None
    assert second is not None
    assert (first.public_name, second.public_name) == ("m1", "m2")
    assert first.targets == second.targets == ["t"]


def test_exact_beats_generic_and_oldest_wins_then_first_rule(pool_doc: Any) -> None:
    older = rewrite_doc(
        "older",
        [(["m"], {"older-first": None}), (["m"], {"older-second": None}), ([], {"catch": None})],
        created="2026-01-01T00:00:00Z",
    )
    newer = rewrite_doc(
        "newer", [(["m"], {"newer": None}), ([], {"newer-catch": None})], "2026-02-01T00:00:00Z"
    )
    t = table(pool_doc(), newer, older)  # file order does not matter when timestamps exist
    assert t.route("m") is not None
    assert t.route("m").targets == ["older-first"]  # type: ignore[union-attr]
    generic = t.route("anything-else")
    assert generic is not None
    assert (generic.targets, generic.public_name, generic.rewrite) == (["catch"], "", "older")
    assert t.public_names() == ["m"]  # a catch-all names no model


def test_without_timestamps_the_first_read_wins(pool_doc: Any) -> None:
    t = table(
        pool_doc(),
        rewrite_doc("a", [(["m"], {"from-a": None})]),
        rewrite_doc("b", [(["m"], {"from-b": None})]),
    )
    assert t.route("m").targets == ["from-a"]  # type: ignore[union-attr]
    timed = rewrite_doc("c", [(["m"], {"from-c": None})], created="2030-01-01T00:00:00Z")
    t = table(pool_doc(), rewrite_doc("a", [(["m"], {"from-a": None})]), timed)
    assert t.route("m").targets == ["from-c"]  # type: ignore[union-attr]


def test_exact_rewrite_beats_inference_model_which_beats_generic(
    pool_doc: Any, model_doc: Any
) -> None:
    t = table(
        pool_doc(),
        model_doc("m", {"im-target": None}, "Critical"),
        model_doc("other", {"other-target": None}, "Sheddable"),
        rewrite_doc("r", [(["m"], {"rw-target": None}), ([], {"catch": None})]),
    )
    m = t.route("m")
    assert m is not None
    assert (m.targets, m.rewrite, m.priority) == (["rw-target"], "r", 100)  # criticality kept
    other = t.route("other")
    assert other is not None
    assert (other.targets, other.rewrite, other.priority) == (["other-target"], None, -10)
    assert t.route("unlisted").targets == ["catch"]  # type: ignore[union-attr]
    assert t.public_names() == ["m", "other"]


def test_rewrite_beats_the_header_and_the_header_beats_an_inference_model(
    route_env: Any, pool_doc: Any, model_doc: Any
) -> None:
    env = route_env(
        [
            pool_doc(),
            model_doc("im", {"im-target": None}),
            rewrite_doc("r", [(["rw"], {"rw-target": None})]),
        ]
    )
    env.scrape_all()
    d = env.route({"model": "rw", "prompt": "x"}, {REWRITE_HEADER: "from-header"})
    assert d.request.target_model == "rw-target"
    assert orjson.loads(d.body)["model"] == "rw-target"
    assert d.request.model == "rw"  # the name answers go back under
    d.finish(0.0)
    d = env.route({"model": "im", "prompt": "x"}, {REWRITE_HEADER: "from-header"})
    assert d.request.target_model == "from-header"
    d.finish(0.0)


def test_generic_rule_rewrites_every_other_name(route_env: Any, pool_doc: Any) -> None:
    env = route_env([pool_doc(), rewrite_doc("all", [([], {"base": None})])])
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"])
    d = env.route({"model": "whatever-the-client-says", "prompt": "x"})
    assert d.request.target_model == "base"
    assert orjson.loads(d.body)["model"] == "base"


def test_generic_rule_leaves_model_less_requests_alone(route_env: Any, pool_doc: Any) -> None:
    # A passed-through route without 'model' (POST /tokenize {"prompt": ...}) has no model
    # to rewrite: a catch-all rule must not try (it used to raise a 500).
    env = route_env([pool_doc(), rewrite_doc("all", [([], {"base": None})])])
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"])
    parsed = parse_other(b'{"prompt": "hello"}', {"content-type": "application/json"}, False)
    d = env.director.route(parsed, "model-less", {})
    assert (d.request.model, d.request.target_model, d.body) == ("", "", None)
    assert d.request.model_label == NO_MODEL_LABEL


def test_names_only_a_generic_rule_takes_are_one_metrics_label(
    route_env: Any, pool_doc: Any
) -> None:
    env = route_env(
        [pool_doc(), rewrite_doc("all", [(["named"], {"base": None}), ([], {"base": None})])]
    )
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"])
    labels = {
        env.route({"model": name, "prompt": "x"}).request.model_label
        for name in ("named", *(f"made-up-{i}" for i in range(20)))
    }
    assert labels == {"named", ANY_MODEL_LABEL}


def test_rewrite_to_a_target_no_endpoint_lists_is_a_503(route_env: Any, pool_doc: Any) -> None:
    env = route_env([pool_doc(), rewrite_doc("r", [(["m"], {"missing": None})])])
    env.scrape_all()
    for i in range(3):
        env.serve(i, base=["base"], adapters=["lora-a"])
    with pytest.raises(GatewayError) as info:
        env.route({"model": "m", "prompt": "x"})
    error = info.value
    assert (error.status, error.reason) == (503, "model-not-served")
    assert "'m'" in error.message
    assert "missing" not in error.message  # the target stays the operator's business
    assert "'missing'" in error.detail
    assert "base, lora-a" in error.detail


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"targets": []}, "targets"),
        ({"matches": [{"model": {"value": "m"}}]}, "targets"),
        ({"targets": [{"modelRewrite": "a", "weight": 1}, {"modelRewrite": "b"}]}, "weights"),
        ({"targets": [{"modelRewrite": "a"}, {"modelRewrite": "a"}]}, "unique"),
        ({"targets": [{"modelRewrite": "a", "weight": 0}]}, "weight"),
        (
            {
                "matches": [{"model": {"type": "Prefix", "value": "m"}}],
                "targets": [{"modelRewrite": "a"}],
            },
            "Exact",
        ),
        ({"matches": [{"model": {"value": ""}}], "targets": [{"modelRewrite": "a"}]}, "value"),
        ({"targets": [{"modelRewrite": "a", "typo": 1}]}, "typo"),
    ],
)
def test_invalid_rules_are_reported(pool_doc: Any, rule: dict[str, Any], problem: str) -> None:
    doc = rewrite_doc("bad", [])
    doc["spec"]["rules"] = [rule]
    with pytest.raises(ValueError, match=r"InferenceModelRewrite bad") as info:
        build_config([pool_doc(), doc])
    assert problem in str(info.value)
