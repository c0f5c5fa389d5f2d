"""Child processes of the benchmarks that start servers: ports, cores, niceness, readiness.

Shared by the gateway-overhead benchmark (:mod:`sluicegate.bench.gateway`), HTTP mode of
``sluicegate bench`` (:mod:`sluicegate.bench.http`), the latency predictor speed
benchmark (:mod:`sluicegate.bench.latency_speed`) and the Envoy picker benchmark
(:mod:`sluicegate.bench.extproc`). Every process is started by a
:class:`Processes` (in its own session, pinned to a core with ``taskset`` when one is
given, output to a log file in a work folder) and stopped by it in the caller's
``finally``; only 127.0.0.1 is used.

On a machine shared with other work, a benchmark's numbers depend on who else gets the
cores: :func:`bench_nice` reads ``$SLUICEGATE_BENCH_NICE`` (``-10`` as root runs the
benchmark ahead of other work) and :func:`niceness` applies it to this process, its
scheduler autogroup and every process started meanwhile. :func:`cpu_seconds` and
:func:`listen_overflows` tell afterwards how much of a core a process got and whether
connections were dropped by full listen queues; :func:`load_average` is what the reports
print about the machine's load before and after.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(start, stop - count)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def bench_nice() -> int:
    """Scheduling niceness for every benchmark process, from ``$SLUICEGATE_BENCH_NICE``
    (default 0; negative values — ahead of other work on a shared machine — need root)."""
    try:
        value = int(os.environ.get("SLUICEGATE_BENCH_NICE", "0"))
    except ValueError:
        return 0
    if value < 0 and os.geteuid() != 0:
        return 0
    return max(-20, min(19, value))


def _autogroup_nice(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int | str, value: int) -> None:
    """Give ``pid``'s scheduler autogroup (its session, where the kernel groups tasks by
    session) niceness ``value``; with autogroups on, a process's own niceness only ranks it
    within its session. Does nothing where there are no autogroups."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(value))


@contextlib.contextmanager
def niceness(value: int) -> Iterator[None]:
    """Run this thread and its session — and every process started meanwhile — at
    ``value`` (processes started by :class:`Processes` get their own session; it sets
    theirs)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    group_before = _autogroup_nice("self")
    if value:
        os.setpriority(os.PRIO_PROCESS, 0, value)
        set_autogroup_nice("self", value)
    try:
        yield
    finally:
        if value:
            os.setpriority(os.PRIO_PROCESS, 0, before)
            if group_before is not None:
                set_autogroup_nice("self", group_before)


def can_pin(cpu: int | None) -> bool:
    """Whether :func:`pinned` puts a command on core ``cpu`` (a core is given, the machine
    has it, and there is a taskset)."""
    return cpu is not None and (os.cpu_count() or 1) > cpu and shutil.which("taskset") is not None


def pinned(cmd: Sequence[str], cpu: int | None) -> list[str]:
    """``cmd`` run on core ``cpu`` (via taskset, if there is one and a core is given)."""
    if not can_pin(cpu):
        return list(cmd)
    return ["taskset", "-c", str(cpu), *cmd]


@contextlib.contextmanager
def pin_this_thread(cpu: int) -> Iterator[bool]:
    """Run the calling thread (and threads it starts meanwhile) on core ``cpu``; restore
    its affinity afterwards. Yields whether it is pinned (False where the machine has no
    such core or no ``sched_setaffinity``)."""
    if (os.cpu_count() or 1) <= cpu or not hasattr(os, "sched_setaffinity"):
        yield False
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads), or by
    its thread ``tid`` alone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Processes:
    """Subprocesses started for a measurement; :meth:`stop_all` ends every one of them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: Sequence[str], cpu: int | None = None) -> int:
        """Start ``cmd`` (pinned to ``cpu``) in its own session, output to ``name``.log."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - kept by the child
        try:
            proc = subprocess.Popen(
                pinned(cmd, cpu),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self.procs[name] = proc
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        if nice < 0:  # its own session is its own autogroup: rank that too
            set_autogroup_nice(proc.pid, nice)
        return proc.pid

    def log(self, name: str) -> str:
        """The last lines ``name`` printed."""
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-30:])

    def check(self, name: str) -> None:
        """Raise if ``name`` has exited."""
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; only the process this object started."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def load_average() -> str:
    """The machine's 1- and 5-minute load averages, for a report ("unknown" where there
    are none)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def listen_overflows() -> int:
    """The machine's count of connections dropped because a listen queue was full (Linux
    ``TcpExt: ListenOverflows``; every process's, not only ours; 0 where unknown)."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table.get("ListenOverflows", 0))
    return 0


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET (status 0 when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, TimeoutError):
        return 0, b""


def wait_ready(procs: Processes, name: str, url: str, timeout_s: float = 30.0) -> None:
    """Poll ``url`` until it answers 200; raise if ``name`` dies or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check(name)
        if http_get(url, 1.0)[0] == 200:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} not ready at {url} after {timeout_s:.0f} s:\n{procs.log(name)}")


def wait_listening(procs: Processes, name: str, port: int, timeout_s: float = 30.0) -> None:
    """Poll until something accepts TCP connections on 127.0.0.1:``port`` (for servers
    without an HTTP readiness route: gRPC, Envoy listeners); raise if ``name`` dies or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check(name)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"{name} not listening on {port} after {timeout_s:.0f} s:\n{procs.log(name)}"
    )
