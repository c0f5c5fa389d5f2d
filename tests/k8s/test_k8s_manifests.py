"""The manifests under ``deploy/``, validated offline.

- Every built-in kind (Deployment, Service, ConfigMap, RBAC, CRD definitions …) is validated
  with kubernetes-validate in strict mode (unknown fields are errors) against two Kubernetes
  versions: the oldest we document (1.30: gRPC probes and ``preStop.sleep`` exist) and the
  newest schema bundled.
- Kinds kubernetes-validate has no schema for are the CRD-defined ones: our inference
  objects are validated against the openAPIV3Schema of the CRDs we ship (made strict the way
  the API server prunes unknown fields) *and* loaded with sluicegate's own ``build_config``;
  the Gateway API / Envoy Gateway objects are checked for their cross-references.
- The pieces that must agree are checked against each other and against the code: the
  pool's endpointPickerRef and the Service, the Role and the collections the discovery
  watches, the pool selector and the model server pods, the ConfigMap and the scheduler.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, latest_version

from sluicegate.api.loader import build_config, parse_config
from sluicegate.builtins import default_registry
from sluicegate.clock import MonotonicClock
from sluicegate.framework import PluginContext
from sluicegate.k8s.assemble import assemble
from sluicegate.k8s.kinds import ALL_KINDS, PODS, POOLS_V1, ResourceKind
from sluicegate.k8s.objects import project_custom, project_pod
from sluicegate.scheduling.config import build_scheduler

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSIONS = ("1.30.0", latest_version())
BUILTIN_API_VERSIONS = {
    "v1",
    "apps/v1",
    "policy/v1",
    "networking.k8s.io/v1",
    "rbac.authorization.k8s.io/v1",
    "apiextensions.k8s.io/v1",
}
OUR_GROUPS = ("inference.networking.k8s.io/", "inference.networking.x-k8s.io/")
GATEWAY_GROUPS = ("gateway.networking.k8s.io/", "gateway.envoyproxy.io/")
MONITORING_GROUPS = ("monitoring.coreos.com/",)
"""The Prometheus Operator's (deploy/monitoring; checked in test_k8s_monitoring)."""
PATCH_DIRS = {DEPLOY / "overlays" / "predictor-sidecars"}
"""Folders whose YAML files are kustomize patches (partial objects), not manifests."""
SHARED_PREDICTOR = DEPLOY / "overlays" / "shared-predictor"
PATCH_FILES = {SHARED_PREDICTOR / "replicas.yaml"}
"""Patches in folders that also hold manifests."""
NOT_KUBERNETES = {DEPLOY / "envoy"}
"""Folders of other tools' configuration (Envoy's, tested in tests/extproc)."""
HELM = DEPLOY / "helm"
"""Helm chart templates, not manifests (rendered and tested in test_helm_chart.py)."""

Doc = dict[str, Any]


def _files() -> list[Path]:
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml"
        and p.parent not in PATCH_DIRS
        and p not in PATCH_FILES
        and p.parent not in NOT_KUBERNETES
        and HELM not in p.parents
    )


def _load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


MANIFESTS: list[tuple[str, Doc]] = [
    (f"{p.relative_to(DEPLOY)}#{d['kind']}/{d['metadata']['name']}", d)
    for p in _files()
    for d in _load(p)
]
BUILTIN = [(i, d) for i, d in MANIFESTS if d["apiVersion"] in BUILTIN_API_VERSIONS]


def find(kind: str, name: str | None = None, within: str = "") -> Doc:
    found = [
        d
        for i, d in MANIFESTS
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name) and within in i
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {within or 'deploy/'}"
    return found[0]


def examples() -> list[Doc]:
    return [d for i, d in MANIFESTS if i.startswith("examples/")]


# ---------------------------------------------------------------------- built-in kinds


def test_every_document_is_a_known_kind() -> None:
    assert len(MANIFESTS) >= 15
    for ident, doc in MANIFESTS:
        api_version = doc["apiVersion"]
        assert api_version in BUILTIN_API_VERSIONS or api_version.startswith(
            OUR_GROUPS + GATEWAY_GROUPS + MONITORING_GROUPS
        ), ident


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("ident", "doc"), BUILTIN, ids=[i for i, _ in BUILTIN])
def test_builtin_kinds_validate_strictly(ident: str, doc: Doc, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_validation_is_strict() -> None:
    """A misspelt field fails (so the parametrized test above can fail)."""
    deployment = copy.deepcopy(find("Deployment", "llama3-8b-epp"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["prot"] = 1
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_kinds_without_a_bundled_schema_are_exactly_the_crd_defined_ones() -> None:
    """kubernetes-validate skips these (no schema); the tests below cover each of them."""
    missing = set()
    for _, doc in MANIFESTS:
        if doc["apiVersion"] in BUILTIN_API_VERSIONS:
            continue
        with pytest.raises(SchemaNotFoundError):
            kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
        missing.add((doc["apiVersion"], doc["kind"]))
    assert missing == {
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceModel"),
        ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
        ("gateway.networking.k8s.io/v1", "GatewayClass"),
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
    }


# ---------------------------------------------------------------------- CRDs


def _crds() -> dict[tuple[str, str, str], Doc]:
    """(group, version, plural) → CRD, for every version a shipped CRD serves."""
    out = {}
    for _, doc in MANIFESTS:
        if doc["kind"] == "CustomResourceDefinition":
            for v in doc["spec"]["versions"]:
                out[(doc["spec"]["group"], v["name"], doc["spec"]["names"]["plural"])] = doc
    return out


def _version_schema(crd: Doc, version: str) -> Doc:
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: Doc = v["schema"]["openAPIV3Schema"]
    return schema


def _walk(schema: Doc, path: str = "") -> Iterator[tuple[str, Doc]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_shipped_crds_cover_what_the_discovery_watches() -> None:
    watched = {(k.group, k.version, k.plural): k for k in ALL_KINDS if k is not PODS}
    crds = _crds()
    assert set(crds) == set(watched)
    for key, crd in crds.items():
        kind: ResourceKind = watched[key]
        assert crd["metadata"]["name"] == f"{kind.plural}.{kind.group}"
        assert crd["spec"]["names"]["kind"] == kind.kind
        assert crd["spec"]["scope"] == "Namespaced"
        (version,) = crd["spec"]["versions"]
        assert version["served"]
        assert version["storage"]
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("key", sorted(_crds()), ids=lambda k: f"{k[2]}.{k[0]}/{k[1]}")
def test_crd_schemas_are_structural(key: tuple[str, str, str]) -> None:
    """The API server rejects non-structural schemas: every node needs a type (unless it
    preserves unknown fields), and metadata may only say ``type: object``."""
    schema = _version_schema(_crds()[key], key[1])
    assert schema["properties"]["metadata"] == {"type": "object"}
    for path, node in _walk(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if "properties" in node:
            assert node["type"] == "object", path
        for required in node.get("required", []):
            assert required in node.get("properties", {}), f"{path}: {required}"


def _strict(schema: Doc) -> Doc:
    """The schema with unknown fields rejected (the API server prunes them silently;
    ``kubectl apply`` with strict field validation reports them)."""
    schema = copy.deepcopy(schema)
    for _, node in _walk(schema):
        open_ended = "additionalProperties" in node or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        if "properties" in node and not open_ended:
            node["additionalProperties"] = False
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def _crd_validate(doc: Doc) -> None:
    group, _, version = doc["apiVersion"].rpartition("/")
    plural = {k.kind: k.plural for k in ALL_KINDS}[doc["kind"]]
    schema = _strict(_version_schema(_crds()[(group, version, plural)], version))
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_example_objects_validate_against_the_shipped_crds() -> None:
    ours = [d for d in examples() if d["apiVersion"].startswith(OUR_GROUPS)]
    assert len(ours) == 6
    for doc in ours:
        _crd_validate(doc)


def test_crd_schemas_reject_what_sluicegate_rejects() -> None:
    pool = copy.deepcopy(find("InferencePool", "llama3-8b"))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        _crd_validate(pool)
    pool["spec"]["targetPorts"] = [{"number": 8000}]
    pool["spec"]["selector"] = {"app": "x"}  # the v1alpha2 shape is not v1
    with pytest.raises(jsonschema.ValidationError):
        _crd_validate(pool)
    model = copy.deepcopy(find("InferenceModel", "food-review"))
    model["spec"]["criticality"] = "Urgent"
    with pytest.raises(jsonschema.ValidationError):
        _crd_validate(model)
    objective = copy.deepcopy(find("InferenceObjective", "batch"))
    objective["spec"]["priority"] = "low"
    with pytest.raises(jsonschema.ValidationError):
        _crd_validate(objective)


# ---------------------------------------------------------------------- the example pool


def test_example_objects_load_with_build_config() -> None:
    config = build_config(examples(), source="deploy/examples")
    assert list(config.pools) == ["llama3-8b"]
    pool = config.pools["llama3-8b"]
    assert pool.spec.ports == [8000]
    assert pool.spec.failure_mode == "FailClose"
    base = config.models["meta-llama/Llama-3.1-8B-Instruct"]
    assert base.spec.criticality == "Critical"
    assert base.spec.target_models == []
    lora = config.models["food-review"]
    assert lora.spec.criticality == "Standard"
    assert [(t.name, t.weight) for t in lora.spec.target_models] == [("food-review-1", 100)]
    priorities = {name: o.spec.priority for name, o in config.objectives.items()}
    assert priorities == {"critical": 100, "standard": 0, "batch": -10}
    assert len(config.skipped) == 1  # the vLLM Deployment


def test_example_model_server_pods_join_the_pool() -> None:
    """A ready pod of the vLLM Deployment, as the discovery would see it, is an endpoint."""
    template = find("Deployment", "vllm-llama3-8b-instruct")["spec"]["template"]
    ports = [p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]]
    raw_pod = {
        "metadata": {"name": "vllm-0", "labels": template["metadata"]["labels"]},
        "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    pools = [project_custom(find("InferencePool", "llama3-8b"), POOLS_V1)]
    kinds = {k.kind: k for k in ALL_KINDS}
    models = [
        project_custom(d, kinds[d["kind"]]) for d in examples() if d["kind"] == "InferenceModel"
    ]
    objectives = [
        project_custom(d, kinds[d["kind"]]) for d in examples() if d["kind"] == "InferenceObjective"
    ]
    result = assemble("default", pools, models, objectives, [project_pod(raw_pod)])
    assert result.problems == []
    (endpoint,) = result.endpoints["llama3-8b"]
    assert (endpoint.name, endpoint.host, endpoint.port) == ("vllm-0-rank-0", "10.1.2.3", 8000)
    assert endpoint.port in ports
    assert endpoint.engine_type == "vllm"


# ---------------------------------------------------------------------- the endpoint picker


def test_endpoint_picker_wiring() -> None:
    pool = find("InferencePool", "llama3-8b")
    ref = pool["spec"]["endpointPickerRef"]
    service = find("Service", ref["name"])
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {9002, 9003, 9090}
    assert ref["port"]["number"] == 9002
    assert ports[9002]["appProtocol"] == "http2"
    assert ports[9003]["appProtocol"] == "http2"

    deployment = find("Deployment", ref["name"])
    pod_spec = deployment["spec"]["template"]["spec"]
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (epp,) = pod_spec["containers"]
    named = {p["name"]: p["containerPort"] for p in epp["ports"]}
    for p in service["spec"]["ports"]:
        assert named[p["targetPort"]] == p["port"]
    args = epp["args"]
    assert args[args.index("extproc") :][:2] == ["extproc", "--kubernetes"]
    assert f"--pool-name={pool['metadata']['name']}" in args
    assert "--namespace=$(POD_NAMESPACE)" in args
    assert {e["name"] for e in epp["env"]} >= {"POD_NAMESPACE"}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert epp[probe]["grpc"]["port"] == 9003

    # --config points into the mounted ConfigMap, whose file builds a scheduler.
    config_path = next(a.split("=", 1)[1] for a in args if a.startswith("--config="))
    mount = next(m for m in epp["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    configmap = find("ConfigMap", volume["configMap"]["name"], within="epp/")
    _builds(configmap["data"][config_path.rsplit("/", 1)[1]])


def _builds(text: str) -> None:
    config = parse_config(text, source="ConfigMap")
    assert config.picker is not None
    assert config.pools == {}
    build_scheduler(config.picker, PluginContext(MonotonicClock(), 0), default_registry())


def test_rbac_grants_read_only_access_to_what_is_watched() -> None:
    deployment = find("Deployment", "llama3-8b-epp")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    find("ServiceAccount", account)
    binding = find("RoleBinding", "llama3-8b-epp")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    role = find("Role", binding["roleRef"]["name"])
    granted = set()
    for rule in role["rules"]:
        assert sorted(rule["verbs"]) == ["get", "list", "watch"]
        granted |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {(k.group, k.plural) for k in ALL_KINDS}


# ---------------------------------------------------------------------- overlays and layout


def _merge(base: Any, patch: Any) -> Any:
    """The part of strategic-merge-patch semantics these patches use: maps merge
    recursively, lists of named maps merge by ``name``, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list):
        named = all(isinstance(x, dict) and "name" in x for x in [*base, *patch])
        if named:
            out_list = list(base)
            index = {x["name"]: i for i, x in enumerate(out_list)}
            for item in patch:
                if item["name"] in index:
                    i = index[item["name"]]
                    out_list[i] = _merge(out_list[i], item)
                else:
                    out_list.append(item)
            return out_list
    return patch


def test_predictor_sidecar_overlay() -> None:
    overlay = DEPLOY / "overlays" / "predictor-sidecars"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../../epp"]
    (sidecars,) = _load(overlay / "sidecars.yaml")
    (config_patch,) = _load(overlay / "config.yaml")
    assert {p["path"] for p in kustomization["patches"]} == {"sidecars.yaml", "config.yaml"}

    deployment = _merge(find("Deployment", sidecars["metadata"]["name"]), sidecars)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    spec = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert list(containers) == ["epp", "training-server", "prediction-server"]
    assert containers["training-server"]["args"][:2] == ["predictor", "train-server"]
    assert containers["prediction-server"]["args"][:2] == ["predictor", "predict-server"]
    assert "--training-server=http://localhost:8000" in containers["prediction-server"]["args"]
    assert containers["training-server"]["ports"][0]["containerPort"] == 8000
    assert containers["prediction-server"]["ports"][0]["containerPort"] == 8001
    # The predictor servers take training data unauthenticated: localhost only, probed
    # from inside the pod.
    for name, port in (("training-server", 8000), ("prediction-server", 8001)):
        assert "--host=127.0.0.1" in containers[name]["args"]
        for probe in ("livenessProbe", "readinessProbe"):
            (command,) = containers[name][probe]["exec"]["command"][2:]
            assert f"http://127.0.0.1:{port}/" in command
    env = {e["name"]: e.get("value") for e in containers["epp"]["env"]}
    assert env["TRAINING_SERVER_URL"] == "http://localhost:8000"
    assert env["PREDICTION_SERVER_URL"] == "http://localhost:8001"
    assert "POD_NAMESPACE" in env  # the patch added to, not replaced, the env
    volumes = {v["name"] for v in spec["volumes"]}
    for container in containers.values():
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes

    configmap = _merge(find("ConfigMap", config_patch["metadata"]["name"]), config_patch)
    kubernetes_validate.validate(configmap, K8S_VERSIONS[-1], strict=True)
    _builds(configmap["data"]["config.yaml"])
    # It says it is the shipped predicted-latency preset: it must stay that.
    preset = resources.files("sluicegate.scheduling").joinpath("presets/predicted-latency.yaml")
    assert yaml.safe_load(configmap["data"]["config.yaml"]) == yaml.safe_load(preset.read_text())


def test_shared_predictor_overlay_files() -> None:
    kustomization = yaml.safe_load((SHARED_PREDICTOR / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../predictor-sidecars", "trainer.yaml"]
    assert [p["path"] for p in kustomization["patches"]] == ["replicas.yaml"]
    trainer = find("Deployment", "llama3-8b-latency-trainer")
    assert trainer["spec"]["replicas"] == 1  # one window of samples, one model
    service = find("Service", "llama3-8b-latency-trainer")
    labels = trainer["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["port"] == 8000
    policy = find("NetworkPolicy", "llama3-8b-latency-trainer")
    epp_labels = find("Deployment", "llama3-8b-epp")["spec"]["template"]["metadata"]["labels"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= epp_labels.items()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on the PATH")
def test_shared_predictor_overlay_renders_one_trainer_for_every_replica() -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    done = subprocess.run(
        [kubectl, "kustomize", str(SHARED_PREDICTOR)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    (epp,) = [
        d
        for d in rendered
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "llama3-8b-epp"
    ]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(epp, version, strict=True)
    spec = epp["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert list(containers) == ["epp", "prediction-server"]  # no training server of its own
    url = "http://llama3-8b-latency-trainer:8000"
    assert f"--training-server={url}" in containers["prediction-server"]["args"]
    assert "--sync-interval=1" in containers["prediction-server"]["args"]
    env = {e["name"]: e.get("value") for e in containers["epp"]["env"]}
    assert env["TRAINING_SERVER_URL"] == url
    assert env["PREDICTION_SERVER_URL"] == "http://localhost:8001"
    volumes = {v["name"] for v in spec["volumes"]}
    assert "models" not in volumes
    for container in containers.values():
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes
    assert epp["spec"]["replicas"] == 3


def test_kustomizations_list_every_file() -> None:
    for path in DEPLOY.rglob("kustomization.yaml"):
        data = yaml.safe_load(path.read_text())
        listed = {*data.get("resources", []), *(p["path"] for p in data.get("patches", []))}
        for entry in listed:
            target = (path.parent / entry).resolve()
            assert target.is_file() or (target / "kustomization.yaml").is_file(), (path, entry)
        local = {p.name for p in path.parent.glob("*.yaml")} - {"kustomization.yaml"}
        subdirs = {p.name for p in path.parent.iterdir() if (p / "kustomization.yaml").is_file()}
        assert local <= listed, f"{path}: not listed: {local - listed}"
        # Applied on their own: they need a gateway / the Prometheus Operator installed.
        optional = {"overlays", "gateway", "monitoring", "grafana"}
        assert {d for d in subdirs if d not in optional} <= listed, path


def _listed_objects(directory: Path) -> set[tuple[str, str]]:
    """(kind, name) of every object a kustomization's resources and ConfigMap generators
    hold, recursively."""
    data = yaml.safe_load((directory / "kustomization.yaml").read_text())
    out = {("ConfigMap", g["name"]) for g in data.get("configMapGenerator", [])}
    for entry in data.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            out |= _listed_objects(target)
        else:
            out |= {(d["kind"], d["metadata"]["name"]) for d in _load(target)}
    return out


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on the PATH")
@pytest.mark.parametrize(
    "directory",
    sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml")),
    ids=lambda p: str(p.relative_to(DEPLOY)) or "deploy",
)
def test_kustomize_renders_exactly_the_listed_objects(directory: Path) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in rendered} == _listed_objects(directory)
    assert len(rendered) == len(_listed_objects(directory))
    if directory.name == "predictor-sidecars":  # the patches were applied
        (deployment,) = [d for d in rendered if d["kind"] == "Deployment"]
        names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
        assert names == ["epp", "training-server", "prediction-server"]


def test_gateway_resources_reference_each_other() -> None:
    gateway = find("Gateway", within="gateway/")
    assert (
        find("GatewayClass", gateway["spec"]["gatewayClassName"])["spec"]["controllerName"]
        == "gateway.envoyproxy.io/gatewayclass-controller"
    )
    route = find("HTTPRoute", within="gateway/")
    assert [p["name"] for p in route["spec"]["parentRefs"]] == [gateway["metadata"]["name"]]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    pool = find("InferencePool", backend["name"])
    assert backend["kind"] == "InferencePool"
    assert backend["group"] == pool["apiVersion"].split("/")[0]
