"""deploy/monitoring and deploy/grafana: the Prometheus Operator monitors select what
deploy/ runs, on ports and paths that serve /metrics, and the dashboard ConfigMap is
generated from the shipped dashboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MONITORING = DEPLOY / "monitoring"
GRAFANA = DEPLOY / "grafana"


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc


def test_the_service_monitor_scrapes_the_pickers_metrics_port() -> None:
    monitor = load(MONITORING / "epp-servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    service = load(DEPLOY / "epp" / "service.yaml")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert ports[endpoint["port"]]["port"] == 9090  # --metrics-port's default
    assert endpoint["path"] == "/metrics"
    deployment = load(DEPLOY / "epp" / "deployment.yaml")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports[endpoint["port"]]["port"])


def test_the_pod_monitor_scrapes_standalone_gateways() -> None:
    monitor = load(MONITORING / "gateway-podmonitor.yaml")
    assert monitor["kind"] == "PodMonitor"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == {
        "app.kubernetes.io/name": "sluicegate",
        "app.kubernetes.io/component": "gateway",
    }
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] == "http"
    # metricsAuth: the Bearer key is documented next to the endpoint.
    assert "metricsAuth" in (MONITORING / "gateway-podmonitor.yaml").read_text()


def test_the_dashboard_config_map_is_generated_from_the_dashboard() -> None:
    kustomization = load(MONITORING / "kustomization.yaml")
    assert "../grafana" in kustomization["resources"]
    grafana = load(GRAFANA / "kustomization.yaml")
    (generator,) = grafana["configMapGenerator"]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"
    (file,) = generator["files"]
    dashboard = json.loads((GRAFANA / file).read_text(encoding="utf-8"))
    assert dashboard["uid"] == "sluicegate"
    assert len([p for p in dashboard["panels"] if p["type"] != "row"]) >= 30
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
