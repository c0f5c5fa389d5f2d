"""The configuration loader: multi-document YAML → validated, cross-checked :class:`Config`.

Every error must name the document (its number in the file), the object (kind and name),
the field and the reason, and every problem of a file is reported at once.
"""

from __future__ import annotations

import textwrap
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluicegate.api.loader import Config, ConfigError, build_config, load_config, parse_config
from sluicegate.api.resources import EndpointPickerConfig, LabelSelector
from sluicegate.api.settings import GatewaySettings
from sluicegate.scheduling.config import load_preset, preset_names

V1 = "inference.networking.k8s.io/v1"
ALPHA2 = "inference.networking.x-k8s.io/v1alpha2"
EPC_GIE = "inference.networking.x-k8s.io/v1alpha1"
EPC_LLMD = "llm-d.ai/v1alpha1"
GW = "sluicegate.dev/v1alpha1"


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def only_problem(text: str) -> str:
    problems = problems_of(text)
    assert len(problems) == 1, problems
    return problems[0]


def pool(name: str = "llama3-8b", **spec: Any) -> dict[str, Any]:
    spec.setdefault("targetPorts", [{"number": 8000}])
    return {"apiVersion": V1, "kind": "InferencePool", "metadata": {"name": name}, "spec": spec}


def model(name: str, pool_name: str = "llama3-8b", **spec: Any) -> dict[str, Any]:
    spec.setdefault("modelName", name)
    spec["poolRef"] = {"name": pool_name}
    return {
        "apiVersion": ALPHA2,
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": spec,
    }


def objective(name: str, priority: int | None, pool_name: str = "llama3-8b") -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool_name}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": ALPHA2,
        "kind": "InferenceObjective",
        "metadata": {"name": name},
        "spec": spec,
    }


def picker(plugins: list[Any], profiles: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": EPC_GIE,
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": profiles,
        **extra,
    }


def gateway(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": GW, "kind": "GatewayConfig", "spec": spec}


def as_yaml(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


# --------------------------------------------------------------------------- valid configs

# Condensed example manifests in the shapes of GIE's types (https://github.com/kubernetes-sigs/gateway-api-inference-extension):
# InferencePool from api/v1/inferencepool_types.go and InferenceObjective from
# apix/v1alpha2/inferenceobjective_types.go at 1748e829; InferenceModel after
# config/manifests/inferencemodel.yaml at v0.5.1, with a two-way split.
EXAMPLE_POOL_V1 = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: llama3-8b}
spec:
  selector: {matchLabels: {app: vllm-llama3-8b}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: llama3-8b-epp, port: {number: 9002}, failureMode: FailClose}
"""

EXAMPLE_MODEL = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModel
metadata: {name: food-review}
spec:
  modelName: food-review
  criticality: Standard
  poolRef: {name: llama3-8b}
  targetModels: [{name: food-review-v1, weight: 90}, {name: food-review-v2, weight: 10}]
"""

EXAMPLE_OBJECTIVE = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -10, poolRef: {name: llama3-8b}}
"""

# A summary of EndpointPickerConfig's top-level fields (GIE 1748e829,
# apix/config/v1alpha1/endpointpickerconfig_types.go), with llm-d-router's apiVersion, which
# is required.
EXAMPLE_PICKER_SUMMARY = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]        # also enableLegacyMetrics
plugins:                            # {name (defaults to type), type, parameters}
- {type: queue-scorer}
schedulingProfiles:                 # {name, plugins: [{pluginRef, weight}]}
- {name: default, plugins: [{pluginRef: queue-scorer, weight: 2}]}
saturationDetector: {pluginRef: utilization-detector}
dataLayer: {sources: [{pluginRef: metrics-data-source,
                       extractors: [{pluginRef: core-metrics-extractor}]}]}
flowControl: {maxBytes: 1000000, maxRequests: 100, defaultRequestTTL: 30s}
parser: {pluginRef: openai-parser}
"""

# Condensed from GIE's config/charts/epplib/templates/_config.yaml (1748e829) as Helm renders
# it with latencyPredictor.enabled.
EXAMPLE_PICKER_HELM = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters: {scheme: http, path: /metrics, insecureSkipVerify: true}
- type: core-metrics-extractor
- type: predicted-latency-producer
- {name: strict-affinity-filter, type: prefix-cache-affinity-filter,
   parameters: {affinityThreshold: 0.99}}
- {name: loose-affinity-filter,  type: prefix-cache-affinity-filter,
   parameters: {affinityThreshold: 0.80}}
- type: slo-headroom-tier-filter
- type: latency-scorer
- type: weighted-random-picker
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""


def test_example_manifests_load_together() -> None:
    text = "---".join([EXAMPLE_POOL_V1, EXAMPLE_MODEL, EXAMPLE_OBJECTIVE, EXAMPLE_PICKER_HELM])
    config = parse_config(text)

    p = config.pools["llama3-8b"]
    assert p.api_version == V1
    assert p.spec.match_labels == {"app": "vllm-llama3-8b"}
    assert p.spec.ports == [8000]
    assert p.spec.failure_mode == "FailClose"
    assert p.spec.endpoint_picker_ref is not None
    assert p.spec.endpoint_picker_ref.port is not None
    assert p.spec.endpoint_picker_ref.port.number == 9002
    assert p.spec.endpoint_picker_ref.kind == "Service"  # default
    assert p.metadata.namespace == "default"

    m = config.models["food-review"]
    assert m.spec.criticality == "Standard"
    assert [(t.name, t.weight) for t in m.spec.target_models] == [
        ("food-review-v1", 90),
        ("food-review-v2", 10),
    ]

    assert config.objectives["batch"].spec.priority == -10
    assert config.picker is not None
    assert [pl.ref for pl in config.picker.plugins][-7:] == [
        "predicted-latency-producer",
        "strict-affinity-filter",
        "loose-affinity-filter",
        "slo-headroom-tier-filter",
        "latency-scorer",
        "weighted-random-picker",
        "latency-slo-admitter",
    ]
    assert config.skipped == []
    assert config.gateway == GatewaySettings()


def test_example_picker_summary_with_extension_sections() -> None:
    config = parse_config(EXAMPLE_PICKER_SUMMARY)
    assert config.picker is not None
    assert config.picker.api_version == EPC_LLMD
    assert config.picker.feature_gates == ["flowControl"]
    assert config.picker.saturation_detector is not None
    assert config.picker.saturation_detector.plugin_ref == "utilization-detector"
    assert config.picker.flow_control is not None
    assert config.picker.flow_control.max_requests == 100
    weights = [r.weight for r in config.picker.scheduling_profiles[0].plugins]
    assert weights == [2.0]
    assert config.pools == {}


def test_inference_pool_v1alpha2() -> None:
    text = dedent(
        """
        apiVersion: inference.networking.x-k8s.io/v1alpha2
        kind: InferencePool
        metadata: {name: old-pool, namespace: serving}
        spec:
          selector: {app: vllm}
          targetPortNumber: 8000
          extensionRef: {name: old-epp, portNumber: 9002, failureMode: FailOpen}
        """
    )
    p = parse_config(text).pools["old-pool"]
    assert isinstance(p.spec.selector, dict)
    assert p.spec.match_labels == {"app": "vllm"}
    assert p.spec.ports == [8000]
    assert p.spec.failure_mode == "FailOpen"
    assert p.spec.extension_ref is not None
    assert p.spec.extension_ref.port_number == 9002
    assert p.metadata.namespace == "serving"


def test_inference_pool_v1_selector_and_several_ports() -> None:
    doc = pool(
        selector={"matchLabels": {"app": "x", "tier": "gpu"}},
        targetPorts=[{"number": 8000}, {"number": 8001}],
        appProtocol="kubernetes.io/h2c",
    )
    p = build_config([doc]).pools["llama3-8b"]
    assert isinstance(p.spec.selector, LabelSelector)
    assert p.spec.match_labels == {"app": "x", "tier": "gpu"}
    assert p.spec.ports == [8000, 8001]
    assert p.spec.app_protocol == "kubernetes.io/h2c"
    assert p.spec.failure_mode == "FailClose"  # no picker ref at all


def test_pool_with_standalone_endpoints() -> None:
    text = dedent(
        """
        apiVersion: inference.networking.k8s.io/v1
        kind: InferencePool
        metadata: {name: llama3-8b}
        spec:
          endpoints:
          - {address: "10.0.0.11:8000"}
          - {address: "http://10.0.0.12:8001/", name: second, labels: {zone: a}}
          - {address: "[fd00::1]:8000", engineType: sglang}
        """
    )
    p = parse_config(text).pools["llama3-8b"]
    assert p.spec.ports == []  # endpoints alone are enough
    eps = p.spec.endpoints
    assert [e.address for e in eps] == [
        "10.0.0.11:8000",
        "http://10.0.0.12:8001/",
        "[fd00::1]:8000",
    ]
    assert eps[0].name is None
    assert eps[0].engine_type == "vllm"
    assert eps[1].name == "second"
    assert eps[1].labels == {"zone": "a"}
    assert eps[2].engine_type == "sglang"


def test_full_config_of_every_kind() -> None:
    docs = [
        pool("a", endpoints=[{"address": "127.0.0.1:9000"}]),
        pool("b"),
        model("chat", "a", criticality="Critical"),
        model("batch", "b", criticality="Sheddable", targetModels=[{"name": "x"}, {"name": "y"}]),
        objective("interactive", 50, "a"),
        objective("unset", None, "b"),
        picker(
            [{"type": "queue-scorer"}], [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}]
        ),
        gateway(
            apiKeys=["k1-0123456789abcdef"], maxRetries=0, ejectAfterFailures=5, scrapeIntervalMs=25
        ),
    ]
    config = build_config(docs)
    assert isinstance(config, Config)
    assert set(config.pools) == {"a", "b"}
    assert set(config.models) == {"chat", "batch"}
    assert [t.weight for t in config.models["batch"].spec.target_models] == [None, None]
    assert config.objectives["unset"].spec.priority is None
    assert config.gateway.api_keys == ["k1-0123456789abcdef"]
    assert config.gateway.max_retries == 0
    assert config.gateway.eject_after_failures == 5
    assert config.gateway.scrape_interval_ms == 25.0
    assert config.gateway.scrape_timeout_ms == 1000.0  # default kept


def test_models_are_indexed_by_public_model_name() -> None:
    config = build_config([pool(), model("object-name", modelName="public-name")])
    assert list(config.models) == ["public-name"]
    assert config.models["public-name"].metadata.name == "object-name"


def test_empty_text_is_an_empty_config() -> None:
    config = parse_config("")
    assert config.pools == {}
    assert config.models == {}
    assert config.picker is None
    assert parse_config("---\n---\n# only comments\n").pools == {}


def test_load_config_reads_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(as_yaml(pool(), model("m", "missing")))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems[0].startswith(f"{path} document 2 (InferenceModel m): ")
    path.write_text(EXAMPLE_POOL_V1)
    assert "llama3-8b" in load_config(path).pools
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "absent.yaml")


# --------------------------------------------------------------------------- error messages


def test_error_names_document_kind_object_and_field() -> None:
    text = as_yaml(
        pool(),
        model(
            "food-review", targetModels=[{"name": "v1", "weight": 90}, {"name": "v2", "weight": 0}]
        ),
    )
    assert only_problem(text) == (
        "<config> document 2 (InferenceModel food-review): spec.targetModels.1.weight: "
        "Input should be greater than or equal to 1"
    )


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (pool(bogus=1), "spec.bogus"),
        (
            pool(endpointPickerRef={"name": "e", "failurMode": "FailOpen"}),
            "spec.endpointPickerRef.failurMode",
        ),
        (pool(endpoints=[{"address": "h:1", "engine": "vllm"}]), "spec.endpoints.0.engine"),
        ({**pool(), "status": {}}, "status"),
        (model("m", targetModels=[{"name": "a", "wieght": 1}]), "spec.targetModels.0.wieght"),
        (
            {
                **objective("o", 1),
                "spec": {"priority": 1, "poolRef": {"name": "llama3-8b", "x": 1}},
            },
            "spec.poolRef.x",
        ),
        (gateway(scrapeIntervalMS=10), "spec.scrapeIntervalMS"),
        (
            picker([{"type": "a", "params": {}}], [{"name": "p", "plugins": [{"pluginRef": "a"}]}]),
            "plugins.0.params",
        ),
        (
            picker([{"type": "a"}], [{"name": "p", "plugins": [{"pluginRef": "a", "wt": 1}]}]),
            "schedulingProfiles.0.plugins.0.wt",
        ),
    ],
)
def test_unknown_fields_are_rejected_with_their_path(doc: dict[str, Any], path: str) -> None:
    docs = [pool("llama3-8b")] if doc["kind"] != "InferencePool" else []
    problem = only_problem(as_yaml(*docs, doc))
    assert f": {path}: Extra inputs are not permitted" in problem
    assert f"document {len(docs) + 1} ({doc['kind']}" in problem


def test_metadata_extra_fields_are_ignored() -> None:
    doc = pool()
    doc["metadata"].update(uid="123", resourceVersion="7", labels={"a": "b"})
    p = build_config([doc]).pools["llama3-8b"]
    assert p.metadata.labels == {"a": "b"}


@pytest.mark.parametrize(
    ("doc", "path", "reason"),
    [
        (pool(targetPorts=[]), "spec", "a pool needs targetPorts"),
        (
            pool(targetPorts=[{"number": 8000}, {"number": 8000}]),
            "spec",
            "targetPorts must be unique",
        ),
        (
            pool(targetPorts=[{"number": p} for p in range(8000, 8009)]),
            "spec.targetPorts",
            "at most 8",
        ),
        (
            pool(targetPorts=[{"number": 0}]),
            "spec.targetPorts.0.number",
            "greater than or equal to 1",
        ),
        (
            pool(targetPortNumber=70000, targetPorts=[]),
            "spec.targetPortNumber",
            "less than or equal",
        ),
        (pool(appProtocol="grpc"), "spec.appProtocol", "'http' or 'kubernetes.io/h2c'"),
        (
            pool(endpointPickerRef={"name": "e", "failureMode": "Maybe"}),
            "spec.endpointPickerRef.failureMode",
            "FailOpen",
        ),
        (pool(endpoints=[{"address": "no-port"}]), "spec.endpoints.0.address", "host:port"),
        (pool(endpoints=[{"address": "h:99999"}]), "spec.endpoints.0.address", "host:port"),
        ({**pool(), "metadata": {"name": ""}}, "metadata.name", "at least 1 character"),
        ({**pool(), "metadata": {}}, "metadata.name", "Field required"),
        ({k: v for k, v in pool().items() if k != "spec"}, "spec", "Field required"),
    ],
)
def test_invalid_pools(doc: dict[str, Any], path: str, reason: str) -> None:
    problem = only_problem(as_yaml(doc))
    assert problem.startswith("<config> document 1 (InferencePool")
    assert f": {path}: " in problem
    assert reason in problem


@pytest.mark.parametrize(
    ("spec", "path", "reason"),
    [
        ({"criticality": "Important"}, "spec.criticality", "'Critical', 'Standard' or 'Sheddable'"),
        ({"modelName": ""}, "spec.modelName", "at least 1 character"),
        ({"modelName": "x" * 257}, "spec.modelName", "at most 256 characters"),
        (
            {"targetModels": [{"name": f"t{i}"} for i in range(11)]},
            "spec.targetModels",
            "at most 10",
        ),
        (
            {"targetModels": [{"name": "a", "weight": 1_000_001}]},
            "spec.targetModels.0.weight",
            "less than or equal",
        ),
        (
            {"targetModels": [{"name": "a", "weight": 1}, {"name": "b"}]},
            "spec",
            "weights must be set on all targets or on none",
        ),
        (
            {"targetModels": [{"name": "a"}, {"name": "a"}]},
            "spec",
            "targetModels names must be unique",
        ),
    ],
)
def test_invalid_models(spec: dict[str, Any], path: str, reason: str) -> None:
    problem = only_problem(as_yaml(pool(), model("m", **spec)))
    assert problem.startswith("<config> document 2 (InferenceModel m): ")
    assert f": {path}: " in problem
    assert reason in problem


def test_model_weight_and_name_problems_reported_together() -> None:
    problem = only_problem(
        as_yaml(pool(), model("m", targetModels=[{"name": "a", "weight": 1}, {"name": "a"}]))
    )
    assert "weights must be set on all targets or on none" in problem
    assert "names must be unique" in problem


def test_weights_on_all_or_none_are_both_valid() -> None:
    config = build_config(
        [
            pool(),
            model("all", targetModels=[{"name": "a", "weight": 3}, {"name": "b", "weight": 1}]),
            model("none", targetModels=[{"name": "a"}, {"name": "b"}]),
        ]
    )
    assert set(config.models) == {"all", "none"}


def test_duplicate_names_are_errors() -> None:
    problems = problems_of(
        as_yaml(
            pool("p"),
            pool("p"),
            objective("o", 1, "p"),
            objective("o", 2, "p"),
            picker([], []),
            picker([], []),
            gateway(),
            gateway(maxRetries=1),
        )
    )
    assert problems == [
        "<config> document 2 (InferencePool p): duplicate InferencePool 'p'",
        "<config> document 4 (InferenceObjective o): duplicate InferenceObjective 'o'",
        "<config> document 6 (EndpointPickerConfig): only one EndpointPickerConfig is allowed",
        "<config> document 8 (GatewayConfig): only one GatewayConfig is allowed",
    ]


def test_duplicate_model_name_across_objects() -> None:
    problem = only_problem(
        as_yaml(pool(), model("a", modelName="shared"), model("b", modelName="shared"))
    )
    assert problem == (
        "<config> document 3 (InferenceModel b): another InferenceModel already serves "
        "modelName 'shared'"
    )


def test_pool_ref_to_unknown_pool() -> None:
    problems = problems_of(as_yaml(pool("real"), model("m", "ghost"), objective("o", 1, "phantom")))
    assert problems == [
        "<config> document 2 (InferenceModel m): spec.poolRef.name: unknown InferencePool 'ghost'",
        "<config> document 3 (InferenceObjective o): spec.poolRef.name: unknown InferencePool "
        "'phantom'",
    ]


def test_pool_ref_may_precede_the_pool() -> None:
    config = build_config([model("m", "later"), pool("later")])
    assert config.models["m"].spec.pool_ref.name == "later"


def test_invalid_yaml() -> None:
    problem = only_problem("apiVersion: v1\nkind: [unclosed\n")
    assert problem.startswith("<config>: not valid YAML: ")
    assert "line" in problem


@pytest.mark.parametrize("doc", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_documents(doc: str) -> None:
    problems = problems_of(EXAMPLE_POOL_V1 + "---\n" + doc)
    assert problems == ["<config> document 2: expected a mapping with apiVersion and kind"]


def test_document_numbers_count_empty_documents() -> None:
    # An empty document in the middle still counts, so "document 3" is the third in the file.
    text = EXAMPLE_POOL_V1 + "---\n---\n" + as_yaml(model("m", "nope"))
    assert only_problem(text).startswith("<config> document 3 (InferenceModel m): ")


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        (ALPHA2, "InferencePoolImport"),
        (V1, "InferencePoolImport"),
        (EPC_LLMD, "Frobnicator"),
        (GW, "Gateway"),
        ("v1", None),
        ("", ""),
    ],
)
def test_unknown_kinds_in_our_groups_are_errors(api_version: str, kind: str | None) -> None:
    doc: dict[str, Any] = {"apiVersion": api_version, "metadata": {"name": "x"}}
    if kind is not None:
        doc["kind"] = kind
    problem = only_problem(as_yaml(doc))
    assert problem.startswith("<config> document 1 (")
    assert f"unknown kind {kind!r}; expected one of InferencePool, InferenceModel" in problem


def test_other_kubernetes_kinds_are_skipped_and_listed() -> None:
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm-route"},
        "spec": {"rules": [{"backendRefs": [{"kind": "InferencePool", "name": "llama3-8b"}]}]},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama3-8b-epp"}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment"}
    config = build_config([route, pool(), service, deployment])
    assert config.skipped == [
        "<config> document 1 (HTTPRoute llm-route)",
        "<config> document 3 (Service llama3-8b-epp)",
        "<config> document 4 (Deployment)",
    ]
    assert list(config.pools) == ["llama3-8b"]


# --------------------------------------------------------------------------- GatewayConfig


def test_gateway_defaults() -> None:
    config = build_config([{"apiVersion": GW, "kind": "GatewayConfig"}])
    s = config.gateway
    assert s == GatewaySettings() == build_config([]).gateway
    assert s.api_keys == []
    assert s.max_body_bytes == 16 * 1024 * 1024
    assert (s.scrape_interval_ms, s.scrape_timeout_ms, s.metrics_staleness_ms) == (
        50.0,
        1000.0,
        1000.0,
    )
    assert s.models_refresh_interval_ms == 10_000.0
    assert (s.eject_after_failures, s.max_retries) == (3, 2)
    assert (s.connect_timeout_ms, s.request_timeout_ms) == (2000.0, 600_000.0)


def test_gateway_with_metadata_and_snake_case_names() -> None:
    doc = gateway(max_body_bytes=2048)
    doc["metadata"] = {"name": "gw"}
    assert build_config([doc]).gateway.max_body_bytes == 2048


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("maxBodyBytes", 1024, True),
        ("maxBodyBytes", 1023, False),
        ("scrapeIntervalMs", 0.5, True),
        ("scrapeIntervalMs", 0, False),
        ("scrapeTimeoutMs", -1, False),
        ("metricsStalenessMs", 0, False),
        ("modelsRefreshIntervalMs", 0, False),
        ("ejectAfterFailures", 1, True),
        ("ejectAfterFailures", 0, False),
        ("maxRetries", 0, True),
        ("maxRetries", -1, False),
        ("connectTimeoutMs", 0, False),
        ("requestTimeoutMs", 0, False),
        ("apiKeys", "not-a-list", False),
    ],
)
def test_gateway_bounds(field: str, value: Any, ok: bool) -> None:
    text = as_yaml(gateway(**{field: value}))
    if ok:
        assert parse_config(text).gateway.model_dump(by_alias=True)[field] == value
    else:
        problem = only_problem(text)
        assert problem.startswith(f"<config> document 1 (GatewayConfig): spec.{field}: ")


# --------------------------------------------------------------------------- EndpointPickerConfig


def test_picker_unknown_plugin_ref() -> None:
    doc = picker(
        [{"type": "queue-scorer"}],
        [
            {
                "name": "default",
                "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "kv-scorer"}],
            }
        ],
    )
    problem = only_problem(as_yaml(doc))
    assert problem.startswith("<config> document 1 (EndpointPickerConfig): ")
    assert (
        "schedulingProfiles.0.plugins.1.pluginRef: profile 'default' references unknown "
        "plugin 'kv-scorer'"
    ) in problem


def test_picker_plugin_name_defaults_to_type() -> None:
    doc = picker(
        [{"type": "queue-scorer", "name": "q"}, {"type": "queue-scorer"}],
        [{"name": "p", "plugins": [{"pluginRef": "q"}, {"pluginRef": "queue-scorer"}]}],
    )
    config = build_config([doc])
    assert config.picker is not None
    assert [p.ref for p in config.picker.plugins] == ["q", "queue-scorer"]
    # The type alone is not a name when the plugin has one.
    assert "unknown plugin 'queue-scorer'" in only_problem(
        as_yaml(
            picker(
                [{"type": "queue-scorer", "name": "q"}],
                [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}],
            )
        )
    )


def test_picker_duplicate_plugin_names() -> None:
    doc = picker(
        [
            {"type": "queue-scorer"},
            {"type": "queue-scorer"},
            {"type": "x", "name": "y"},
            {"type": "y"},
        ],
        [],
    )
    assert "plugins: plugin names must be unique: queue-scorer, y" in only_problem(as_yaml(doc))


def test_picker_duplicate_profile_names() -> None:
    doc = picker([{"type": "a"}], [{"name": "p"}, {"name": "p"}, {"name": "q"}])
    assert "schedulingProfiles names must be unique: p" in only_problem(as_yaml(doc))


def test_picker_reference_problems_are_all_reported() -> None:
    doc = picker(
        [{"type": "a"}, {"type": "a"}],
        [
            {"name": "p", "plugins": [{"pluginRef": "zz"}]},
            {"name": "p", "plugins": [{"pluginRef": "a"}, {"pluginRef": "yy"}]},
        ],
    )
    problem = only_problem(as_yaml(doc))
    for part in (
        "plugins: plugin names must be unique: a",
        "schedulingProfiles.0.plugins.0.pluginRef: profile 'p' references unknown plugin 'zz'",
        "schedulingProfiles.1.plugins.1.pluginRef: profile 'p' references unknown plugin 'yy'",
        "schedulingProfiles names must be unique: p",
    ):
        assert part in problem


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (picker([{"name": "x"}], []), "plugins.0.type"),
        (picker([{"type": ""}], []), "plugins.0.type"),
        (
            picker([{"type": "a"}], [{"name": "p", "plugins": [{"pluginRef": "a", "weight": -1}]}]),
            "schedulingProfiles.0.plugins.0.weight",
        ),
        (picker([], [{"plugins": []}]), "schedulingProfiles.0.name"),
        ({**picker([], []), "kind": "EndpointPickerConfig", "apiVersion": None}, "apiVersion"),
    ],
)
def test_picker_field_errors(doc: dict[str, Any], path: str) -> None:
    problem = only_problem(as_yaml(doc))
    assert problem.startswith("<config> document 1 (EndpointPickerConfig): ")
    assert f": {path}: " in problem


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_validates(name: str) -> None:
    folder = resources.files("sluicegate.scheduling").joinpath("presets")
    text = folder.joinpath(f"{name}.yaml").read_text()
    config = parse_config(text, source=f"{name}.yaml")
    assert isinstance(config.picker, EndpointPickerConfig)
    assert config.picker.scheduling_profiles, name
    assert config.picker == load_preset(name)
    known = {p.ref for p in config.picker.plugins}
    for profile in config.picker.scheduling_profiles:
        assert {r.plugin_ref for r in profile.plugins} <= known


def test_presets_exist() -> None:
    assert {"default", "round-robin", "random", "least-request"} <= set(preset_names())


# --------------------------------------------------------------------------- all at once


def test_every_problem_is_reported_at_once() -> None:
    text = "---\n".join(
        [
            as_yaml(pool("p", bogus=True)),
            as_yaml(model("m", "p", criticality="Meh")),
            "- not a mapping\n",
            as_yaml({"apiVersion": ALPHA2, "kind": "InferenceThing", "metadata": {"name": "t"}}),
            as_yaml(objective("o", 1, "nowhere")),
            as_yaml(gateway(maxRetries=-1, ejectAfterFailures=0)),
            as_yaml(picker([{"type": "a"}], [{"name": "p", "plugins": [{"pluginRef": "b"}]}])),
            as_yaml({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}),
        ]
    )
    problems = problems_of(text)
    prefixes = [p.split(": ", 1)[0] for p in problems]
    assert prefixes == [
        "<config> document 1 (InferencePool p)",
        "<config> document 2 (InferenceModel m)",
        "<config> document 3",
        "<config> document 4 (InferenceThing t)",
        "<config> document 6 (GatewayConfig)",
        "<config> document 6 (GatewayConfig)",
        "<config> document 7 (EndpointPickerConfig)",
        # cross-document checks come last
        "<config> document 5 (InferenceObjective o)",
    ]
    assert "spec.bogus" in problems[0]
    assert "spec.criticality" in problems[1]
    assert "spec.ejectAfterFailures" in problems[4]
    assert "spec.maxRetries" in problems[5]
    assert "unknown plugin 'b'" in problems[6]
    assert "spec.poolRef.name: unknown InferencePool 'nowhere'" in problems[7]


def test_endpoint_picker_config_typo_is_an_error() -> None:
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}]
schedulingProfile: [{name: default, plugins: [{pluginRef: queue-scorer}]}]
"""
    with pytest.raises(ConfigError, match="schedulingProfile"):
        parse_config(text)


def test_reference_picker_sections_are_accepted() -> None:
    text = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}, {type: metrics-data-source}]
dataLayer: {sources: [{pluginRef: metrics-data-source}]}
parser: {pluginRef: openai-parser}
schedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer}]}]
"""
    assert parse_config(text).picker is not None


def test_pool_endpoint_names_must_be_distinct() -> None:
    text = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p}
spec:
  targetPorts: [{number: 8000}]
  endpoints: [{address: "10.0.0.1:8000", name: a}, {address: "10.0.0.2:8000", name: a}]
"""
    with pytest.raises(ConfigError, match="distinct names: a"):
        parse_config(text)


# ---------------------------------------------------------------------------- InferenceModelRewrite

EXAMPLE_REWRITE = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: canary
  creationTimestamp: 2026-03-01T10:00:00Z
spec:
  poolRef: {group: inference.networking.k8s.io, kind: InferencePool, name: llama3-8b}
  rules:
  - matches:
    - model: {type: Exact, value: llama}
    - model: {value: llama-chat}
    targets:
    - {modelRewrite: llama-lora-v1, weight: 90}
    - {modelRewrite: llama-lora-v2, weight: 10}
  - targets: [{modelRewrite: base}]
"""


def test_inference_model_rewrite_loads() -> None:
    config = parse_config(EXAMPLE_POOL_V1 + "---" + EXAMPLE_REWRITE)
    rewrite = config.rewrites["canary"]
    # An unquoted YAML timestamp is read as a datetime and kept as RFC 3339 text.
    assert rewrite.metadata.creation_timestamp == "2026-03-01T10:00:00Z"
    exact, generic = rewrite.spec.rules
    assert exact.exact_models == ["llama", "llama-chat"]
    assert [m.model.type for m in exact.matches] == ["Exact", "Exact"]  # the default
    assert [(t.model_rewrite, t.weight) for t in exact.targets] == [
        ("llama-lora-v1", 90),
        ("llama-lora-v2", 10),
    ]
    assert generic.matches == []
    assert generic.exact_models == []


def test_inference_model_rewrite_cross_checks() -> None:
    orphan = EXAMPLE_REWRITE.replace("name: llama3-8b}", "name: nowhere}")
    problem = only_problem(EXAMPLE_POOL_V1 + "---" + orphan)
    assert problem == (
        "<config> document 2 (InferenceModelRewrite canary): spec.poolRef.name: "
        "unknown InferencePool 'nowhere'"
    )
    twice = EXAMPLE_POOL_V1 + "---" + EXAMPLE_REWRITE + "---" + EXAMPLE_REWRITE
    assert "duplicate InferenceModelRewrite 'canary'" in only_problem(twice)
    no_rules = EXAMPLE_REWRITE.split("  rules:")[0] + "  rules: []\n"
    assert "spec.rules" in only_problem(EXAMPLE_POOL_V1 + "---" + no_rules)
