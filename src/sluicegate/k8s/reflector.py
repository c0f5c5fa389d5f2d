"""List-then-watch one collection and keep a local copy of it (a "reflector").

The protocol is the API server's (the same one client-go's reflector speaks):

1. **List** the collection, in pages of ``page_size`` (``limit`` + ``continue``). The list's
   ``metadata.resourceVersion`` is the version of that snapshot. The local store is replaced
   by the list, so objects deleted while no watch was open disappear.
2. **Watch** from that version (``?watch=true&resourceVersion=…&allowWatchBookmarks=true``):
   one JSON object per line, ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}``.
   Every event (bookmarks included) advances the stored version, so a new watch resumes
   exactly where the last one stopped.
3. A watch ends normally after ``timeoutSeconds`` (chosen at random in [T, 2T) so replicas
   do not reconnect in lockstep): watch again from the stored version, at once.
4. **410 Gone** (an ``ERROR`` event with code 410, or a 410 answer; the version was compacted
   away) → list again. Other failures (connection refused or reset, timeouts, 5xx, a
   malformed line) → wait (exponential backoff with jitter, reset by the next success) and
   watch again from the stored version, or list again if no list has succeeded yet.
5. **404** (the CRD is not installed) and **401/403** (no permission) make the collection
   *unavailable*: it counts as synced and empty, the reason is kept in
   :attr:`Reflector.unavailable`, and the list is retried every ``unavailable_retry_s``.

Memory is bounded: the store holds projections (:mod:`sluicegate.k8s.objects`) of at most
``max_objects`` objects (more are ignored and counted in :attr:`Reflector.overflow`), and a
single watch line may not exceed aiohttp's read buffer (4 MiB with kubernetes-asyncio's
session; the API server's own object limit is 1.5 MiB).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient

from sluicegate.k8s.kinds import ResourceKind, request
from sluicegate.k8s.objects import ProjectionError

log = logging.getLogger("sluicegate.k8s")


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


@dataclass(frozen=True, slots=True)
class ReflectorSettings:
    """Timing and size limits of one list/watch loop. Durations in seconds."""

    page_size: int = 500
    """Objects per list page (``limit``)."""
    watch_timeout_s: float = 300.0
    """Server-side watch duration: each watch asks for a random value in [T, 2T)."""
    connect_timeout_s: float = 10.0
    list_timeout_s: float = 60.0
    """Total time for one list page."""
    read_margin_s: float = 30.0
    """A watch with no byte for ``timeoutSeconds + read_margin_s`` is treated as dead."""
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    unavailable_retry_s: float = 60.0
    """How often a missing (404) or forbidden (401/403) collection is tried again."""
    min_watch_s: float = 1.0
    """A watch that ends sooner than this without any event counts as a failure (backoff),
    so a proxy that closes streams at once cannot make the loop spin."""
    max_objects: int = 10_000
    """Objects kept per collection; more are ignored (and counted)."""


class ApiError(Exception):
    """The API server answered with an error status (or an ``ERROR`` watch event)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip(": "))
        self.status = status
        self.reason = reason
        self.message = message


class GoneError(ApiError):
    """410: the requested resource version is no longer available; list again."""


def _status_error(status: int, body: bytes) -> ApiError:
    reason, message = "", body[:200].decode("utf-8", "replace")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        reason = str(data.get("reason", ""))
        message = str(data.get("message", message))
        code = data.get("code")
        if isinstance(code, int) and code >= 400:
            status = code
    cls = GoneError if status == 410 else ApiError
    return cls(status, reason, message)


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status >= 400:
        raise _status_error(response.status, await response.read())


class Reflector(Generic[T]):
    """Keeps :attr:`store` (name → projection) in step with one collection of a namespace.

    ``on_change`` is called (synchronously, on the event loop) after every change to the
    store or to :attr:`synced` / :attr:`unavailable`. Run :meth:`run` as a task; cancel it
    to stop.
    """

    def __init__(
        self,
        api: ApiClient,
        kind: ResourceKind,
        namespace: str,
        project: Callable[[Mapping[str, Any]], T],
        on_change: Callable[[], None],
        settings: ReflectorSettings | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.kind = kind
        self.namespace = namespace
        self.project = project
        self.on_change = on_change
        self.settings = settings or ReflectorSettings()
        self.rng = rng or random.Random()
        self.store: dict[str, T] = {}
        self.resource_version: str | None = None
        self.synced = False
        """True once a list succeeded or the collection was found unavailable."""
        self.unavailable: str | None = None
        """Why the collection cannot be read (404/401/403), or None."""
        self.last_error: str | None = None
        """The last transient failure (cleared by the next success)."""
        self.overflow = 0
        """Objects ignored because the store was full (since the last list)."""
        self.lists = 0
        """Successful lists (the first one and every relist)."""
        self.watches = 0
        """Watch requests started."""

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """List and watch until cancelled. Never returns otherwise; never raises."""
        failures = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                if await self._watch():
                    failures = 0  # only a working watch proves the loop healthy
                    continue
                failures += 1  # ended at once without events
                await self._backoff(failures, "watch closed immediately")
            except GoneError as exc:
                log.info("%s: %s; listing again", self.kind, exc)
                need_list = True
                failures += 1
                if failures > 1:  # a second 410 in a row: do not hammer the server
                    await self._backoff(failures, str(exc))
            except ApiError as exc:
                if exc.status in (401, 403, 404):
                    self._set_unavailable(exc)
                    need_list = True
                    await asyncio.sleep(self.settings.unavailable_retry_s)
                    continue
                failures += 1
                await self._backoff(failures, str(exc))
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                # Connection errors, timeouts, a malformed or oversized line.
                failures += 1
                await self._backoff(failures, f"{type(exc).__name__}: {exc}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug: keep watching, start afresh
                log.exception("%s: unexpected error", self.kind)
                need_list = True
                failures += 1
                await self._backoff(failures, f"{type(exc).__name__}: {exc}")

    async def _backoff(self, failures: int, why: str) -> None:
        s = self.settings
        delay = min(s.max_backoff_s, s.initial_backoff_s * 2 ** min(failures - 1, 30))
        delay *= self.rng.uniform(0.5, 1.0)
        self.last_error = why
        log.warning("%s: %s; retrying in %.2fs", self.kind, why, delay)
        await asyncio.sleep(delay)

    def _set_unavailable(self, exc: ApiError) -> None:
        reason = {404: "not found (is the CRD installed?)", 403: "forbidden (check RBAC)"}.get(
            exc.status, f"{exc.status} {exc.reason}".strip()
        )
        text = f"{self.kind} in namespace {self.namespace}: {reason}"
        if self.unavailable != text:
            log.warning(
                "%s; treating it as empty, retrying every %.0fs",
                text,
                self.settings.unavailable_retry_s,
            )
        changed = self.store or not self.synced or self.unavailable != text
        self.store = {}
        self.resource_version = None
        self.unavailable = text
        self.synced = True
        if changed:
            self.on_change()

    # ------------------------------------------------------------------ list

    async def _list(self) -> None:
        s = self.settings
        timeout = aiohttp.ClientTimeout(total=s.list_timeout_s, sock_connect=s.connect_timeout_s)
        items: list[Any] = []
        version: str | None = None
        token: str | None = None
        overflow = 0
        while True:
            response = await request(
                self.api,
                self.kind,
                self.namespace,
                limit=s.page_size,
                continue_token=token,
                request_timeout=timeout,
            )
            try:
                await _raise_for_status(response)
                body = await response.read()
            finally:
                response.release()
            data = orjson.loads(body)
            if not isinstance(data, dict):
                raise ValueError("list response is not an object")
            meta = data.get("metadata") or {}
            if version is None:
                version = meta.get("resourceVersion") or None
            page = data.get("items") or []
            room = s.max_objects - len(items)
            items.extend(page[: max(room, 0)])
            overflow += max(len(page) - max(room, 0), 0)
            token = meta.get("continue") or None
            if not token or overflow:
                break
        store: dict[str, T] = {}
        for raw in items:
            try:
                obj = self.project(raw)
            except ProjectionError as exc:
                log.warning("%s: ignoring an object: %s", self.kind, exc)
                continue
            store[obj.name] = obj
        if overflow:
            log.warning("%s: more than %d objects; ignoring the rest", self.kind, s.max_objects)
        self.store = store
        self.overflow = overflow
        self.resource_version = version
        self.synced = True
        self.unavailable = None
        self.last_error = None
        self.lists += 1
        self.on_change()

    # ------------------------------------------------------------------ watch

    async def _watch(self) -> bool:
        """One watch request; True when it delivered events or lasted long enough."""
        s = self.settings
        server_timeout = int(s.watch_timeout_s * self.rng.uniform(1.0, 2.0)) or 1
        timeout = aiohttp.ClientTimeout(
            sock_connect=s.connect_timeout_s, sock_read=server_timeout + s.read_margin_s
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        events = 0
        self.watches += 1
        response = await request(
            self.api,
            self.kind,
            self.namespace,
            watch=True,
            resource_version=self.resource_version,
            timeout_seconds=server_timeout,
            request_timeout=timeout,
        )
        try:
            await _raise_for_status(response)
            while True:
                line = await response.content.readline()
                if not line:
                    break
                line = line.strip()
                if line:
                    self._apply(orjson.loads(line))
                    events += 1
                    self.last_error = None
        finally:
            response.close()
        return events > 0 or loop.time() - started >= s.min_watch_s

    def _apply(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise ValueError("watch event is not an object")
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise ValueError(f"watch event {kind!r} without an object")
        if kind == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 500
            cls = GoneError if status == 410 else ApiError
            raise cls(status, str(obj.get("reason", "")), str(obj.get("message", "")))
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if kind == "BOOKMARK":
            if version:
                self.resource_version = str(version)
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("%s: ignoring watch event of type %r", self.kind, kind)
            return
        try:
            item = self.project(obj)
        except ProjectionError as exc:
            log.warning("%s: ignoring a %s event: %s", self.kind, kind, exc)
            item = None
        if version:
            self.resource_version = str(version)
        if item is None:
            return
        if kind == "DELETED":
            if self.store.pop(item.name, None) is None:
                return
        elif item.name not in self.store and len(self.store) >= self.settings.max_objects:
            self.overflow += 1
            if self.overflow == 1:
                log.warning(
                    "%s: more than %d objects; ignoring the rest",
                    self.kind,
                    self.settings.max_objects,
                )
            return
        else:
            self.store[item.name] = item
        self.on_change()
