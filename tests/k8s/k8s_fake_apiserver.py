"""An in-process fake Kubernetes API server (aiohttp) speaking the real list/watch protocol.

It serves, for any namespace:

- ``GET /api/v1/namespaces/{ns}/pods`` and
  ``GET /apis/{group}/{version}/namespaces/{ns}/{plural}`` for the installed custom
  resources; other paths answer 404 with a ``Status`` body, like a missing CRD.
- **List**: ``{"kind": "<Kind>List", "metadata": {"resourceVersion", "continue"}, "items"}``
  with ``limit`` / ``continue`` paging over a consistent snapshot. Pod list items carry no
  ``apiVersion``/``kind`` (as the real server's do not); custom resources do.
- **Watch** (``?watch=true&resourceVersion=N&timeoutSeconds=T``): a chunked stream of JSON
  lines ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}``; first the events
  after ``N`` still in history, then live ones; ends after ``timeoutSeconds``. A version
  older than the compaction point gets one ``ERROR`` event with a 410 ``Status``
  ("Expired"), as the real server sends. ``resourceVersion`` ``""``/``"0"`` starts with
  synthetic ``ADDED`` events for every object.

One resource-version counter is shared by all collections, like etcd's revision.

Test controls: :meth:`apply`, :meth:`delete`, :meth:`compact`, :meth:`pause_delivery` /
:meth:`resume_delivery`, :meth:`bookmark`, :meth:`end_watches` (graceful end, as at
``timeoutSeconds``), :meth:`break_watches` (connection dropped mid-stream),
:meth:`expire_watches` (ERROR 410 mid-stream), :meth:`fail` (inject error answers),
:meth:`install` / :meth:`uninstall` (CRDs).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Json = dict[str, Any]

CORE = ("", "v1", "pods")
CRDS = (
    ("inference.networking.k8s.io", "v1", "inferencepools"),
    ("inference.networking.x-k8s.io", "v1alpha2", "inferencepools"),
    ("inference.networking.x-k8s.io", "v1alpha2", "inferencemodels"),
    ("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives"),
    ("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites"),
)
KINDS = {
    "pods": "Pod",
    "inferencepools": "InferencePool",
    "inferencemodels": "InferenceModel",
    "inferenceobjectives": "InferenceObjective",
    "inferencemodelrewrites": "InferenceModelRewrite",
}
PLURALS = {kind: plural for plural, kind in KINDS.items()}

_END, _BREAK, _GONE = object(), object(), object()


def status(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass(eq=False)
class _Watcher:
    namespace: str
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


@dataclass(eq=False)
class _Collection:
    group: str
    version: str
    plural: str
    objects: dict[tuple[str, str], Json] = field(default_factory=dict)
    history: deque[tuple[int, str, Json]] = field(default_factory=lambda: deque(maxlen=10_000))
    compacted: int = 0
    watchers: set[_Watcher] = field(default_factory=set)

    @property
    def kind(self) -> str:
        return KINDS[self.plural]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass
class _Failure:
    plural: str
    status: int
    times: int
    watch: bool | None


class FakeApiServer:
    """See the module docstring. ``await start()``, use :attr:`url`, ``await stop()``."""

    def __init__(self, crds: Iterable[tuple[str, str, str]] = CRDS) -> None:
        self.rv = 100
        self.collections: dict[tuple[str, str, str], _Collection] = {CORE: _Collection(*CORE)}
        for key in crds:
            self.install(*key)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.failures: list[_Failure] = []
        self.paused = False
        self._held: list[tuple[_Collection, str, Json]] = []
        self._snapshots: dict[str, tuple[str, list[Json]]] = {}
        self._ids = itertools.count(1)
        self._uids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._core)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}", self._custom)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ controls

    def install(self, group: str, version: str, plural: str) -> None:
        self.collections.setdefault((group, version, plural), _Collection(group, version, plural))

    def uninstall(self, group: str, version: str, plural: str) -> None:
        coll = self.collections.pop((group, version, plural), None)
        if coll is not None:
            for w in coll.watchers:
                w.queue.put_nowait(_END)

    def _collection_for(self, obj: Json) -> _Collection:
        api_version = obj["apiVersion"]
        group, _, version = api_version.rpartition("/")
        return self.collections[(group, version, PLURALS[obj["kind"]])]

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def apply(self, obj: Json) -> Json:
        """Create or replace ``obj`` (namespace defaults to ``default``); returns the stored
        copy with server-set metadata."""
        coll = self._collection_for(obj)
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta["name"])
        old = coll.objects.get(key)
        meta["resourceVersion"] = self._next_rv()
        meta["uid"] = old["metadata"]["uid"] if old else f"uid-{next(self._uids)}"
        meta["creationTimestamp"] = (
            old["metadata"]["creationTimestamp"]
            if old
            else f"2026-01-01T00:00:{next(self._uids) % 60:02d}Z"
        )
        meta.setdefault("managedFields", [{"manager": "kubectl", "operation": "Apply"}])
        stored.setdefault("status", {})
        coll.objects[key] = stored
        self._emit(coll, "MODIFIED" if old else "ADDED", stored)
        return stored

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> None:
        group, _, version = api_version.rpartition("/")
        coll = self.collections[(group, version, PLURALS[kind])]
        stored = coll.objects.pop((namespace, name))
        stored = copy.deepcopy(stored)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(coll, "DELETED", stored)

    def _emit(self, coll: _Collection, kind: str, obj: Json) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        coll.history.append((rv, kind, obj))
        if self.paused:
            self._held.append((coll, kind, obj))
            return
        self._deliver(coll, kind, obj)

    def _deliver(self, coll: _Collection, kind: str, obj: Json) -> None:
        for w in coll.watchers:
            if w.namespace == obj["metadata"]["namespace"]:
                w.queue.put_nowait({"type": kind, "object": obj})

    def pause_delivery(self) -> None:
        """Record events but do not send them to open watches (a slow or stuck stream)."""
        self.paused = True

    def resume_delivery(self) -> None:
        self.paused = False
        held, self._held = self._held, []
        for coll, kind, obj in held:
            self._deliver(coll, kind, obj)

    def compact(self) -> None:
        """Forget history: watching from an older version now answers 410."""
        for coll in self.collections.values():
            coll.compacted = self.rv
            coll.history.clear()
        self._held.clear()

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current version to every open watch."""
        for coll in self.collections.values():
            obj = {
                "kind": coll.kind,
                "apiVersion": coll.api_version,
                "metadata": {"resourceVersion": str(self.rv)},
            }
            for w in coll.watchers:
                w.queue.put_nowait({"type": "BOOKMARK", "object": obj})

    def _signal(self, item: object) -> None:
        for coll in self.collections.values():
            for w in coll.watchers:
                w.queue.put_nowait(item)

    def end_watches(self) -> None:
        """End every open watch cleanly (as when ``timeoutSeconds`` elapses)."""
        self._signal(_END)

    def break_watches(self) -> None:
        """Drop every open watch connection without ending the response."""
        self._signal(_BREAK)

    def expire_watches(self) -> None:
        """Send ERROR 410 (Expired) on every open watch, then end it."""
        self._signal(_GONE)

    def fail(self, plural: str, code: int, times: int = 1, watch: bool | None = None) -> None:
        """Answer the next ``times`` requests for ``plural`` (lists, watches or both) with
        ``code``; ``times=-1`` for ever."""
        self.failures.append(_Failure(plural, code, times, watch))

    @property
    def active_watches(self) -> int:
        return sum(len(c.watchers) for c in self.collections.values())

    def count(self, plural: str, watch: bool) -> int:
        """Requests received for ``plural`` (lists or watches)."""
        return sum(
            1
            for path, query in self.requests
            if path.endswith("/" + plural) and _truthy(query.get("watch")) == watch
        )

    # ------------------------------------------------------------------ handlers

    async def _core(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CORE)

    async def _custom(self, request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return await self._serve(request, (m["group"], m["version"], m["plural"]))

    async def _serve(self, request: web.Request, key: tuple[str, str, str]) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.path, query))
        watch = _truthy(query.get("watch"))
        for failure in self.failures:
            if failure.plural == key[2] and failure.times != 0 and failure.watch in (None, watch):
                failure.times -= 1
                return _json(status(failure.status, "Injected", "injected failure"), failure.status)
        coll = self.collections.get(key)
        if coll is None:
            return _json(
                status(404, "NotFound", "the server could not find the requested resource"), 404
            )
        namespace = request.match_info["ns"]
        if watch:
            return await self._watch(request, coll, namespace, query)
        return self._list(coll, namespace, query)

    def _list(self, coll: _Collection, namespace: str, query: dict[str, str]) -> web.Response:
        token = query.get("continue")
        if token:
            snap_id, _, offset_text = token.partition(":")
            if snap_id not in self._snapshots:
                return _json(status(410, "Expired", "the continue token has expired"), 410)
            version, items = self._snapshots[snap_id]
            offset = int(offset_text)
        else:
            version = str(self.rv)
            items = []
            for (ns, _), obj in sorted(coll.objects.items()):
                if ns == namespace:
                    item = copy.deepcopy(obj)
                    if not coll.group:  # core list items omit apiVersion and kind
                        item.pop("apiVersion", None)
                        item.pop("kind", None)
                    items.append(item)
            snap_id = str(next(self._ids))
            self._snapshots[snap_id] = (version, items)
            offset = 0
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[offset : offset + limit]
        meta: Json = {"resourceVersion": version}
        if offset + limit < len(items):
            meta["continue"] = f"{snap_id}:{offset + limit}"
        body = {
            "kind": f"{coll.kind}List",
            "apiVersion": coll.api_version,
            "metadata": meta,
            "items": page,
        }
        return _json(body, 200)

    async def _watch(
        self, request: web.Request, coll: _Collection, namespace: str, query: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        since = query.get("resourceVersion", "")
        watcher = _Watcher(namespace)
        # Backlog and registration without an await in between: no event is lost.
        backlog: list[Json] = []
        if since in ("", "0"):
            backlog = [
                {"type": "ADDED", "object": obj}
                for (ns, _), obj in sorted(coll.objects.items())
                if ns == namespace
            ]
        elif int(since) < coll.compacted:
            message = f"too old resource version: {since} ({coll.compacted})"
            await response.write(
                _line({"type": "ERROR", "object": status(410, "Expired", message)})
            )
            return response
        else:
            backlog = [
                {"type": kind, "object": obj}
                for rv, kind, obj in coll.history
                if rv > int(since) and obj["metadata"]["namespace"] == namespace
            ]
        coll.watchers.add(watcher)
        timeout = float(query.get("timeoutSeconds") or 3600)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            for event in backlog:
                await response.write(_line(event))
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        item = await watcher.queue.get()
                except TimeoutError:
                    break
                if item is _END:
                    break
                if item is _BREAK:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if item is _GONE:
                    gone = status(410, "Expired", "watch expired")
                    await response.write(_line({"type": "ERROR", "object": gone}))
                    break
                await response.write(_line(item))
        finally:
            coll.watchers.discard(watcher)
        return response


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on (at the time of the call)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _line(event: Json) -> bytes:
    return orjson.dumps(event) + b"\n"


def _json(body: Json, code: int) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=code, content_type="application/json")


# ---------------------------------------------------------------------- object builders


def pod(
    name: str,
    labels: dict[str, str] | None = None,
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    deleting: bool = False,
    namespace: str = "default",
) -> Json:
    """A core/v1 Pod with the fields a kubelet would report."""
    metadata: Json = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:10:00Z"
        metadata["deletionGracePeriodSeconds"] = 30
    status_: Json = {
        "phase": "Running",
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "PodScheduled", "status": "True"},
        ],
    }
    if ip:
        status_["podIP"] = ip
        status_["podIPs"] = [{"ip": ip}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": status_,
    }


def pool_v1(
    name: str, match_labels: dict[str, str], ports: list[int], namespace: str = "default"
) -> Json:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": match_labels},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}},
        },
    }


def pool_v1alpha2(name: str, selector: dict[str, str], port: int) -> Json:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": selector,
            "targetPortNumber": port,
            "extensionRef": {"name": f"{name}-epp", "failureMode": "FailOpen"},
        },
    }


def model(
    name: str,
    model_name: str,
    pool: str,
    criticality: str | None = None,
    targets: list[tuple[str, int]] | None = None,
) -> Json:
    spec: Json = {"modelName": model_name, "poolRef": {"name": pool}}
    if criticality:
        spec["criticality"] = criticality
    if targets:
        spec["targetModels"] = [{"name": n, "weight": w} for n, w in targets]
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def rewrite(name: str, pool: str, rules: list[tuple[list[str], list[tuple[str, int]]]]) -> Json:
    """An InferenceModelRewrite: ``rules`` are (matched names, [(target, weight)])."""
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "name": pool},
            "rules": [
                {
                    "matches": [{"model": {"type": "Exact", "value": m}} for m in matches],
                    "targets": [{"modelRewrite": t, "weight": w} for t, w in targets],
                }
                for matches, targets in rules
            ],
        },
    }


def objective(name: str, priority: Any, pool: str) -> Json:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"priority": priority, "poolRef": {"name": pool}},
    }
