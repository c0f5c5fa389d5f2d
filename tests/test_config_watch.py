"""The configuration watcher shared by ``serve`` and ``extproc``: what a reload refuses
(invalid, empty, truncated, comments-only, bad API keys), and how it reads the file
(only once it stopped changing; a file renamed into place counts)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluicegate.api.loader import Config
from sluicegate.config_watch import ConfigRules, read_config, watch_config

POOL: dict[str, Any] = {
    "apiVersion": "inference.networking.k8s.io/v1",
    "kind": "InferencePool",
    "metadata": {"name": "pool"},
    "spec": {"targetPorts": [{"number": 8000}], "endpoints": [{"address": "127.0.0.1:9"}]},
}
KEY = "sk-reload-0123456789abcdef"


def model(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {"modelName": name, "poolRef": {"name": "pool"}},
    }


def gateway(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig", "spec": spec}


def dump(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(list(docs))


class Watcher:
    """A running :func:`watch_config` recording every configuration it applied."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.applied: list[Config] = []
        self.reload_now = asyncio.Event()

    def models(self) -> list[set[str]]:
        return [set(c.models) for c in self.applied]

    async def until(self, done: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Poll ``done`` (what the watcher did is seen in its effects: nothing to wait on)."""
        async with asyncio.timeout(timeout_s):
            while not done():  # noqa: ASYNC110
                await asyncio.sleep(0.02)


@pytest.fixture
async def watching(tmp_path: Path) -> AsyncIterator[Callable[..., Watcher]]:
    tasks: list[asyncio.Task[None]] = []

    async def start(rules: ConfigRules | None = None, path: Path | None = None) -> Watcher:
        path = path or tmp_path / "config.yaml"
        watcher = Watcher(path)
        task = watch_config(
            path, rules or ConfigRules(), watcher.applied.append, watcher.reload_now, 0.05
        )
        tasks.append(asyncio.create_task(task))
        await asyncio.sleep(0)  # the watcher takes the file's stamp
        return watcher

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


async def refused(
    watcher: Watcher, caplog: pytest.LogCaptureFixture, text: str, reason: str
) -> None:
    """Write ``text``; it must be refused at ERROR with ``reason`` and nothing applied."""
    before = len(watcher.applied)
    caplog.clear()
    watcher.path.write_text(text)
    await watcher.until(lambda: bool(errors(caplog)))
    await asyncio.sleep(0.2)  # time to (wrongly) apply it anyway
    assert len(watcher.applied) == before
    (message,) = errors(caplog)
    assert "not applied; keeping the running one" in message
    assert reason in message


async def test_empty_truncated_and_comments_only_files_are_refused(
    tmp_path: Path, watching: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluicegate.config")
    path = tmp_path / "config.yaml"
    full = dump(POOL, model("m"))
    path.write_text(full)
    watcher = await watching()
    await refused(watcher, caplog, "", "defines no InferencePool")
    await refused(watcher, caplog, "# managed by a tool\n\n# nothing yet\n", "no InferencePool")
    await refused(watcher, caplog, "---\n---\n", "defines no InferencePool")
    await refused(watcher, caplog, full[: full.index("spec:")], "spec: Field required")
    await refused(watcher, caplog, full[: full.index("endpoints:") + 14], "endpoints")
    await refused(watcher, caplog, dump(model("m")), "unknown InferencePool")  # pool cut off
    # The watcher lives on: a complete file is applied.
    path.write_text(dump(POOL, model("later")))
    await watcher.until(lambda: bool(watcher.applied))
    assert watcher.models() == [{"later"}]


async def test_allow_empty_config_accepts_an_empty_file(tmp_path: Path, watching: Any) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(dump(POOL))
    watcher = await watching(ConfigRules(allow_empty=True))
    path.write_text("")
    await watcher.until(lambda: bool(watcher.applied))
    assert watcher.applied[0].pools == {}
    assert read_config(path, ConfigRules(allow_empty=True)).pools == {}


async def test_pools_from_elsewhere_refuse_only_a_file_without_documents(
    tmp_path: Path, watching: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``--kubernetes`` the file only holds settings: no pool is fine, nothing is not."""
    path = tmp_path / "config.yaml"
    path.write_text(dump(gateway(maxRetries=1)))
    watcher = await watching(ConfigRules(pools_from_file=False))
    await refused(watcher, caplog, "# truncated\n", "holds no document")
    path.write_text(dump(gateway(maxRetries=4)))
    await watcher.until(lambda: bool(watcher.applied))
    assert watcher.applied[0].gateway.max_retries == 4
    assert watcher.applied[0].pools == {}


async def test_a_reload_with_a_bad_api_key_is_refused_without_logging_keys(
    tmp_path: Path, watching: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "config.yaml"
    path.write_text(dump(POOL, gateway(apiKeys=[KEY])))
    watcher = await watching()
    await refused(watcher, caplog, dump(POOL, gateway(apiKeys=[KEY, ""])), "apiKeys[1] is empty")
    await refused(
        watcher, caplog, dump(POOL, gateway(apiKeys=["tiny-secret", KEY])), "apiKeys[0] is 11"
    )
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert KEY not in logged
    assert "tiny-secret" not in logged


async def test_a_file_written_in_two_steps_is_applied_once_complete(
    tmp_path: Path, watching: Any
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(dump(POOL))
    watcher = await watching()
    await asyncio.sleep(0.1)
    # The first step alone is a valid file: applied, it would drop model "m" for a while.
    with path.open("w") as out:
        out.write(dump(POOL) + "---\n")
    watcher.reload_now.set()  # the watcher reads the first step for sure
    await asyncio.sleep(0.03)  # a config tool's pause, shorter than the 0.1 s settle time
    with path.open("a") as out:
        out.write(dump(model("m")))
    await watcher.until(lambda: bool(watcher.applied))
    await asyncio.sleep(0.3)
    assert watcher.models() == [{"m"}]


async def test_a_file_renamed_into_place_is_picked_up_even_with_the_old_mtime(
    tmp_path: Path, watching: Any
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(dump(POOL, model("aaaa")))
    watcher = await watching()
    await asyncio.sleep(0.1)
    new = tmp_path / ".config.yaml.tmp"
    new.write_text(dump(POOL, model("bbbb")))  # the same size
    old = path.stat()
    os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))  # and the same mtime
    assert new.stat().st_size == old.st_size
    os.replace(new, path)  # what editors and config tools do
    await watcher.until(lambda: bool(watcher.applied))
    assert watcher.models() == [{"bbbb"}]


async def test_a_swapped_symlink_is_picked_up(tmp_path: Path, watching: Any) -> None:
    """A Kubernetes ConfigMap volume updates by pointing ``..data`` at a new directory."""
    for version, name in (("v1", "first"), ("v2", "second")):
        (tmp_path / version).mkdir()
        (tmp_path / version / "config.yaml").write_text(dump(POOL, model(name)))
    (tmp_path / "..data").symlink_to("v1")
    path = tmp_path / "config.yaml"
    path.symlink_to("..data/config.yaml")
    watcher = await watching(path=path)
    await asyncio.sleep(0.1)
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    await watcher.until(lambda: bool(watcher.applied))
    assert watcher.models() == [{"second"}]


async def test_a_missing_file_is_reported_once_and_its_return_applied(
    tmp_path: Path, watching: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluicegate.config")
    path = tmp_path / "config.yaml"
    path.write_text(dump(POOL))
    watcher = await watching()
    await asyncio.sleep(0.1)
    path.unlink()
    await watcher.until(lambda: bool(errors(caplog)), timeout_s=8)
    await asyncio.sleep(0.3)
    assert errors(caplog) == [f"configuration {path} is missing; keeping the running one"]
    path.write_text(dump(POOL, model("back")))
    await watcher.until(lambda: bool(watcher.applied), timeout_s=8)
    assert watcher.models() == [{"back"}]


async def test_reload_event_rereads_an_unchanged_file(tmp_path: Path, watching: Any) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(dump(POOL, model("m")))
    watcher = await watching()
    await asyncio.sleep(0.2)
    assert watcher.applied == []  # nothing changed
    watcher.reload_now.set()
    await watcher.until(lambda: bool(watcher.applied))
    assert watcher.models() == [{"m"}]
