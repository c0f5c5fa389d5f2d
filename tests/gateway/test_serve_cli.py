"""``sluicegate serve`` as a user runs it: the embedded default, a config file, reloads."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from gw_support import model_doc, pool_doc

from sluicegate.gateway.app import Gateway
from sluicegate.gateway.run import embedded_config, try_commands
from sluicegate.scheduling.config import load_preset

BASE = "tiny-llama"
SRC = str(Path(__file__).resolve().parents[2] / "src")
"""The sources the CLI runs from: this tree's, whatever the installed package is."""


def cli_env(**extra: str) -> dict[str, str]:
    """The CLI's environment: this tree's sources, no API keys but ``extra``'s."""
    env = {k: v for k, v in os.environ.items() if k != "SLUICEGATE_API_KEYS"}
    return {**env, "COLUMNS": "200", "PYTHONPATH": SRC, **extra}


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sluicegate serve ARGS`` expected to exit on its own (a refused start)."""
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env or cli_env(),
    )


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The one line a refused start prints; it must contain ``words``."""
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def serve_process() -> Iterator[Any]:
    """Start ``sluicegate serve ARGS`` on a free port; stopped with SIGINT at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or cli_env(),
        )
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return proc, port
            except OSError:
                time.sleep(0.1)
        raise AssertionError("serve did not start listening")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r,
    ):
        return r.status, await r.json()


async def _models(port: int) -> set[str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/v1/models") as r:
        return {m["id"] for m in (await r.json())["data"]}


async def test_serve_without_config_fronts_an_embedded_pool(serve_process: Any) -> None:
    proc, port = serve_process("--sim-profile", "tiny", "--sim-time-scale", "0.1")
    for _ in range(50):  # the first scrape makes the pool ready
        status, body = await _post(port, {"model": BASE, "prompt": "Hello", "max_tokens": 4})
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert "curl" in (proc.stdout.read() if proc.stdout else "")


async def test_config_reload_on_change_and_sighup(
    sim_cluster: Any, serve_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=2)
    path = tmp_path / "pool.yaml"
    pool = pool_doc(cluster.urls)
    path.write_text(yaml.safe_dump_all([pool]))
    proc, port = serve_process("--config", str(path))
    assert "first" not in await _models(port)

    # A new InferenceModel appears without a restart.
    path.write_text(yaml.safe_dump_all([pool, model_doc("first", {BASE: 1})]))
    for _ in range(60):
        if "first" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "first" in await _models(port)
    assert (await _post(port, {"model": "first", "prompt": "x", "max_tokens": 1}))[0] == 200

    # An invalid file is reported and the running configuration kept.
    path.write_text("kind: InferenceModel\napiVersion: inference.networking.x-k8s.io/v1alpha2\n")
    await asyncio.sleep(1.5)
    assert proc.poll() is None
    assert (await _post(port, {"model": "first", "prompt": "x", "max_tokens": 1}))[0] == 200

    # SIGHUP re-reads even when the modification time did not move.
    stat = path.stat()
    path.write_text(yaml.safe_dump_all([pool, model_doc("second", {BASE: 1})]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    proc.send_signal(signal.SIGHUP)
    for _ in range(60):
        if "second" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "second" in await _models(port)
    assert "first" not in await _models(port)


def test_serve_rejects_an_invalid_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
                "kind": "InferenceModel",
                "metadata": {"name": "m"},
                "spec": {"modelName": "m", "poolRef": {"name": "missing"}, "criticality": "Urgent"},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    assert result.returncode == 2
    assert "criticality" in result.stderr
    assert "document 1 (InferenceModel m)" in result.stderr


def test_serve_rejects_an_unknown_policy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--policy", "fastest"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "round-robin" in result.stderr  # the error lists the known presets


def test_serve_rejects_an_unknown_plugin_type(tmp_path: Path) -> None:
    path = tmp_path / "picker.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                pool_doc(["127.0.0.1:9"]),
                {
                    "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
                    "kind": "EndpointPickerConfig",
                    "plugins": [{"type": "fastest-scorer"}],
                    "schedulingProfiles": [
                        {"name": "p", "plugins": [{"pluginRef": "fastest-scorer"}]}
                    ],
                },
            ]
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    assert result.returncode == 2
    assert "unknown plugin type 'fastest-scorer'" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_rejects_a_bad_flow_control_policy_reference(tmp_path: Path) -> None:
    path = tmp_path / "picker.yaml"
    picker = load_preset("default").model_dump(by_alias=True, exclude_none=True)
    picker["featureGates"] = ["flowControl"]
    picker["flowControl"] = {"defaultPriorityBand": {"orderingPolicyRef": "queue-scorer"}}
    path.write_text(yaml.safe_dump_all([pool_doc(["127.0.0.1:9"]), picker]))
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    assert result.returncode == 2
    assert "orderingPolicyRef" in result.stderr
    assert "Traceback" not in result.stderr


async def test_reload_with_a_bad_plugin_keeps_the_running_config(
    sim_cluster: Any, serve_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=1)
    path = tmp_path / "pool.yaml"
    pool = pool_doc(cluster.urls)
    path.write_text(yaml.safe_dump_all([pool, model_doc("kept", {BASE: 1})]))
    proc, port = serve_process("--config", str(path))
    bad_picker = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer", "parameters": {"nonsense": 1}}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    path.write_text(yaml.safe_dump_all([pool, model_doc("dropped", {BASE: 1}), bad_picker]))
    await asyncio.sleep(2.0)
    assert "kept" in await _models(port)  # nothing of the bad file was applied
    assert "dropped" not in await _models(port)
    # The watcher is still alive: a good file is applied.
    path.write_text(yaml.safe_dump_all([pool, model_doc("later", {BASE: 1})]))
    for _ in range(60):
        if "later" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "later" in await _models(port)
    assert proc.poll() is None


async def test_a_failed_start_leaves_nothing_open() -> None:
    """The port is taken: start raises, and the upstream connection pool and the metrics
    scraper it started are closed again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = Gateway(embedded_config(["127.0.0.1:9"], None))
        with pytest.raises(OSError, match="address already in use"):
            await gateway.start("127.0.0.1", port)
    assert gateway.upstream is not None
    assert gateway.upstream.closed
    assert gateway.runtime.collector is None


# ----------------------------------------------------------------------------- API keys

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-team-b_ZYXWVUT/+.~=="
KEY_C = "c" * 16


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "--api-key #1: the key is empty"),
        (f" {KEY_A}", "--api-key #1: the key has leading or trailing whitespace"),
        ("s3cret", "--api-key #1: the key is 6 characters long, fewer than the 16"),
        ("sk-team-a:0123456789", "a character a bearer token cannot hold"),
    ],
)
def test_serve_refuses_a_bad_api_key(key: str, problem: str) -> None:
    line = refused(run_serve("--api-key", KEY_C, "--api-key", key), problem.replace("#1", "#2"))
    assert KEY_C not in line
    if key.strip():
        assert key.strip() not in line


def test_serve_refuses_bad_key_files_and_environment(tmp_path: Path) -> None:
    refused(
        run_serve("--api-key-file", str(tmp_path / "absent")),
        f"--api-key-file {tmp_path / 'absent'}: cannot be read: No such file or directory",
    )
    bad = tmp_path / "keys"
    bad.write_text(f"# team a\n{KEY_A}\nshort-secret\n")
    line = refused(run_serve("--api-key-file", str(bad)), f"{bad} line 3", "12 characters")
    assert "short-secret" not in line
    assert KEY_A not in line
    comments = tmp_path / "comments"
    comments.write_text("# filled in by the secret manager\n")
    refused(run_serve("--api-key-file", str(comments)), "holds no key")
    # SLUICEGATE_API_KEYS=$KEY with $KEY unset: not an open gateway.
    refused(run_serve(env=cli_env(SLUICEGATE_API_KEYS="")), "SLUICEGATE_API_KEYS is set")
    line = refused(
        run_serve(env=cli_env(SLUICEGATE_API_KEYS=f"{KEY_A},tiny")), "entry 2", "4 characters"
    )
    assert KEY_A not in line


def test_serve_refuses_a_config_with_a_bad_api_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    gateway = {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig"}
    path.write_text(
        yaml.safe_dump_all([pool_doc(["127.0.0.1:9"]), {**gateway, "spec": {"apiKeys": [""]}}])
    )
    refused(run_serve("--config", str(path)), "spec.apiKeys", "apiKeys[0] is empty")
    path.write_text(
        yaml.safe_dump_all(
            [pool_doc(["127.0.0.1:9"]), {**gateway, "spec": {"apiKeys": [KEY_A, "tiny-secret"]}}]
        )
    )
    line = refused(run_serve("--config", str(path)), "apiKeys[1] is 11 characters long")
    assert "tiny-secret" not in line
    assert KEY_A not in line


async def _status(port: int, path: str, key: str | None = None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r,
    ):
        return r.status


async def test_serve_takes_keys_from_flags_files_and_the_environment(
    serve_process: Any, tmp_path: Path
) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# team b\n\n{KEY_B}\n")
    proc, port = serve_process(
        *("--sim-profile", "tiny", "--sim-time-scale", "0.1", "--api-key", KEY_A),
        *("--api-key-file", str(path)),
        env=cli_env(SLUICEGATE_API_KEYS=f"{KEY_C}\n"),
    )
    assert await _status(port, "/v1/models") == 401
    assert await _status(port, "/v1/models", "sk-team-z-0123456789abcdef") == 401
    for key in (KEY_A, KEY_B, KEY_C):
        assert await _status(port, "/v1/models", key) == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    output = proc.stdout.read() if proc.stdout else ""
    for key in (KEY_A, KEY_B, KEY_C):
        assert key not in output


# ----------------------------------------------------------------------------- empty configs


def test_serve_refuses_an_empty_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    for text in ("", "# nothing yet\n", "---\n"):
        path.write_text(text)
        refused(
            run_serve("--config", str(path)),
            f"{path} defines no InferencePool to route to",
            "--allow-empty-config",
        )


async def test_serve_allow_empty_config_starts_and_reloads_into_a_pool(
    sim_cluster: Any, serve_process: Any, tmp_path: Path
) -> None:
    cluster = await sim_cluster(replicas=1)
    path = tmp_path / "config.yaml"
    path.write_text("")
    proc, port = serve_process("--config", str(path), "--allow-empty-config")
    assert await _models(port) == set()
    path.write_text(yaml.safe_dump_all([pool_doc(cluster.urls), model_doc("late", {BASE: 1})]))
    for _ in range(60):
        if "late" in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "late" in await _models(port)
    path.write_text("")  # allowed: back to no pool
    for _ in range(60):
        if "late" not in await _models(port):
            break
        await asyncio.sleep(0.1)
    assert "late" not in await _models(port)
    assert proc.poll() is None


# ------------------------------------------------------------ banner and embedded ports


def _banner_commands(output: str) -> list[str]:
    lines = output.splitlines()
    start = lines.index("Try:") + 1
    return lines[start : lines.index("", start)]


async def test_banner_commands_paste_into_a_shell(serve_process: Any) -> None:
    """On a 60-column console the example lines come out as built, each under 80 columns,
    and a shell given them as pasted runs curl with a body the gateway answers."""
    proc, port = serve_process(
        "--sim-profile", "tiny", "--sim-time-scale", "0.1", env=cli_env(COLUMNS="60")
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    commands = _banner_commands(proc.stdout.read() if proc.stdout else "")
    url = f"http://127.0.0.1:{port}"
    assert commands == try_commands(url, BASE)
    assert all(len(line) < 80 for line in commands), commands
    # The first command, as pasted, with curl standing in for a function printing its argv.
    first = "\n".join(commands[:4])
    shell = f"curl() {{ printf '%s\\0' \"$@\"; }}\n{first}\n"
    bash = await asyncio.create_subprocess_exec(
        "bash", "-c", shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(bash.communicate(), timeout=10)
    assert bash.returncode == 0, err
    argv = out.decode().split("\0")[:-1]
    assert argv[:4] == [f"{url}/v1/completions", "-H", "content-type: application/json", "-d"]
    body = json.loads(argv[4])
    assert body == {"model": BASE, "prompt": "Hello, sluicegate", "max_tokens": 16}
    _, port = serve_process("--sim-profile", "tiny", "--sim-time-scale", "0.1")
    for _ in range(50):  # the first scrape makes the pool ready
        status, answer = await _post(port, body)
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200, answer


def _free_run(count: int) -> int:
    """A first port of ``count`` consecutive free loopback ports."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        socks = []
        try:
            for offset in range(count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


async def test_sim_base_port_pins_the_embedded_pool(serve_process: Any) -> None:
    base = _free_run(2)
    proc, _ = serve_process(
        "--sim-profile", "tiny", "--sim-time-scale", "0.1",
        "--sim-replicas", "2", "--sim-base-port", str(base),
    )  # fmt: skip
    for replica_port in (base, base + 1):
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{replica_port}/v1/models") as r,
        ):
            assert r.status == 200
            assert BASE in {m["id"] for m in (await r.json())["data"]}
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    output = proc.stdout.read() if proc.stdout else ""
    assert f"at http://127.0.0.1:{base}, http://127.0.0.1:{base + 1}\n" in output


def test_sim_base_port_on_a_taken_port_fails_and_names_the_ports() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        result = run_serve(
            "--sim-profile", "tiny", "--sim-replicas", "2", "--sim-base-port", str(busy - 1)
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"cannot start the embedded pool on ports {busy - 1}-{busy}" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--sim-base-port", "65535", "--sim-replicas", "2"), ("65535-65536", "1-65535")),
        (("--sim-base-port", "-5"), ("--sim-base-port -5",)),
        (("--sim-base-port", "9000", "--config", "pool.yaml"), ("cannot be used with --config",)),
    ],
)
def test_sim_base_port_refusals(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    refused(run_serve(*args), *words)


def test_sim_base_port_must_not_cover_the_gateway_port() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "serve", "--port", "9001", "--sim-base-port", "9000"],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    refused(result, "--port 9001", "9000-9003")
