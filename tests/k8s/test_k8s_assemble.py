"""Projection of API objects and assembly of Config + endpoints (no server involved)."""

from __future__ import annotations

import pytest
from k8s_fake_apiserver import model, objective, pod, pool_v1, pool_v1alpha2

from sluicegate.k8s.assemble import assemble, engine_type
from sluicegate.k8s.kinds import MODELS_V1ALPHA2, OBJECTIVES_V1ALPHA2, POOLS_V1, POOLS_V1ALPHA2
from sluicegate.k8s.objects import ProjectionError, project_custom, project_pod

VLLM = {"app": "vllm"}


def test_project_pod_reads_readiness_ip_and_deletion() -> None:
    p = project_pod(pod("a", VLLM, ip="fd00::1", ready=True))
    assert (p.name, p.ip, p.ready, p.deleting, p.serving) == ("a", "fd00::1", True, False, True)
    assert dict(p.labels) == VLLM
    assert not project_pod(pod("a", VLLM, ready=False)).serving
    assert not project_pod(pod("a", VLLM, deleting=True)).serving
    assert not project_pod(pod("a", VLLM, ip=None)).serving
    bare = project_pod({"metadata": {"name": "b"}})  # pending: no status yet
    assert (bare.ip, bare.ready, bare.labels) == (None, False, {})
    with pytest.raises(ProjectionError):
        project_pod({"metadata": {}})


def test_project_custom_keeps_spec_and_identity_only() -> None:
    raw = pool_v1("p", VLLM, [8000])
    raw["metadata"].update(
        resourceVersion="7",
        uid="u",
        creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "kubectl"}],
        annotations={"a": "b"},
    )
    raw["status"] = {"parents": []}
    obj = project_custom(raw, POOLS_V1)
    assert obj.created == "2026-01-01T00:00:00Z"
    assert obj.document == {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {
            "name": "p",
            "namespace": "default",
            "annotations": {"a": "b"},
            # Kept: the older InferenceModelRewrite wins a name two of them match.
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": raw["spec"],
    }
    del raw["apiVersion"], raw["kind"]  # list items may omit them
    assert project_custom(raw, POOLS_V1).document["apiVersion"] == POOLS_V1.api_version


def test_engine_type_label_precedence() -> None:
    assert engine_type({}) == "vllm"
    assert engine_type({"llm-d.ai/engine-type": "sglang"}) == "sglang"
    both = {"llm-d.ai/engine-type": "sglang", "inference.networking.k8s.io/engine-type": "vllm"}
    assert engine_type(both) == "vllm"


def test_empty_selector_selects_nothing() -> None:
    pools = [project_custom(pool_v1alpha2("p", {}, 8000), POOLS_V1ALPHA2)]
    pods = [project_pod(pod("a", VLLM))]
    result = assemble("ns", pools, [], [], pods)
    assert result.endpoints == {"p": []}
    assert result.problems == ["InferencePool ns/p: empty selector; no pod is selected"]


def test_older_model_wins_a_duplicate_model_name() -> None:
    pools = [project_custom(pool_v1("p", VLLM, [8000]), POOLS_V1)]
    newer = model("a-newer", "shared", "p")
    newer["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    older = model("z-older", "shared", "p")
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    models = [project_custom(m, MODELS_V1ALPHA2) for m in (newer, older)]
    result = assemble("ns", pools, models, [], [])
    assert result.config.models["shared"].metadata.name == "z-older"
    (problem,) = result.problems
    assert "a-newer" in problem


def test_objective_referring_to_unknown_pool_is_reported() -> None:
    objectives = [project_custom(objective("o", 1, "nope"), OBJECTIVES_V1ALPHA2)]
    result = assemble("ns", [], [], objectives, [])
    assert result.config.objectives == {}
    assert result.problems == [
        "InferenceObjective ns/o (inference.networking.x-k8s.io/v1alpha2): "
        "spec.poolRef.name: unknown InferencePool 'nope'"
    ]


def test_pods_carry_the_hardware_their_labels_and_the_pool_declare() -> None:
    raw = pool_v1("p", VLLM, [8000, 8001])
    raw["spec"]["hardware"] = {"costPerHourByAccelerator": {"h100-80gb": 2.99, "a100-80gb": 1.79}}
    pools = [project_custom(raw, POOLS_V1)]
    pods = [
        project_pod(pod("h", {**VLLM, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})),
        project_pod(pod("a", {**VLLM, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})),
        project_pod(
            pod(
                "s",
                {
                    **VLLM,
                    "sluicegate.dev/accelerator": "a100-80gb",
                    "sluicegate.dev/cost-per-hour": "0.9",
                },
            )
        ),
        project_pod(pod("x", {**VLLM, "sluicegate.dev/cost-per-hour": "free"})),
    ]
    result = assemble("ns", pools, [], [], pods)
    got = {
        (e.name, e.hardware.accelerator, e.hardware.cost_per_hour) for e in result.endpoints["p"]
    }
    assert got == {
        ("a-rank-0", "a100-80gb", 1.79),
        ("a-rank-1", "a100-80gb", 1.79),
        ("h-rank-0", "h100-80gb", 2.99),
        ("h-rank-1", "h100-80gb", 2.99),
        ("s-rank-0", "a100-80gb", 0.9),
        ("s-rank-1", "a100-80gb", 0.9),
        ("x-rank-0", None, None),
        ("x-rank-1", None, None),
    }
    assert result.problems == [
        "Pod ns/x: label sluicegate.dev/cost-per-hour: 'free' is not a cost (a number >= 0)"
    ]
