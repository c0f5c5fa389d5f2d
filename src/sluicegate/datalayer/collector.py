"""Keeping endpoint state fresh: metric scrapes, served-model lists and health.

One asyncio task per endpoint scrapes ``/metrics`` every ``scrape_interval_s`` with a
bounded timeout; another lists ``/v1/models`` every ``models_interval_s`` (sooner until the
first answer). A failed scrape leaves the previous snapshot in place with its old
timestamp, so it turns stale instead of looking idle. ``eject_after`` consecutive failures
(scrapes or proxied requests, see :meth:`Collector.record_failure`) take an endpoint out
of scheduling; the next successful scrape brings it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import Endpoint, ServedModels
from sluicegate.datalayer.parsers import MetricsParseError, MetricsParser
from sluicegate.upstream import UpstreamError, UpstreamPool

log = logging.getLogger("sluicegate.datalayer")

# The gateway's HTTP client does not decompress (proxied bodies pass through as they are),
# so scrapes ask for plain text.
_IDENTITY = (("Accept-Encoding", "identity"),)


@dataclass(frozen=True, slots=True)
class CollectorSettings:
    """Intervals and timeouts in seconds."""

    scrape_interval_s: float = 0.05
    scrape_timeout_s: float = 1.0
    models_interval_s: float = 10.0
    eject_after: int = 3


class Collector:
    """Scrapes every endpoint of a datastore while running."""

    def __init__(
        self,
        datastore: Datastore,
        upstream: UpstreamPool,
        clock: Clock,
        settings: CollectorSettings | None = None,
    ) -> None:
        self.datastore = datastore
        self.upstream = upstream
        self.clock = clock
        self.settings = settings or CollectorSettings()
        self._tasks: dict[int, list[asyncio.Task[None]]] = {}
        self.on_scrape: list[Callable[[Endpoint], None]] = []
        """Called after each successful scrape, with the endpoint (e.g. to dispatch
        requests waiting for room)."""
        self._stopping: set[asyncio.Task[None]] = set()
        """Tasks of removed endpoints, cancelled but maybe not finished yet."""
        self._running = False
        datastore.on_added(self._start_endpoint)
        datastore.on_removed(self._stop_endpoint)

    def start(self) -> None:
        self._running = True
        for endpoint in self.datastore.all_endpoints():
            self._start_endpoint(endpoint)

    async def stop(self) -> None:
        self._running = False
        tasks = [t for ts in self._tasks.values() for t in ts]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        tasks += self._stopping
        self._stopping.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def refresh(self, endpoint: Endpoint) -> None:
        """Scrape ``endpoint`` and list its models once, now."""
        await self._scrape_once(endpoint, MetricsParser(endpoint.engine_type))
        await self._list_models(endpoint)

    # ------------------------------------------------------------------ health

    def record_failure(self, endpoint: Endpoint, error: str) -> None:
        """A connection to ``endpoint`` failed (scrape or proxied request)."""
        health = endpoint.health
        health.consecutive_failures += 1
        health.last_error = error
        if not health.ejected and health.consecutive_failures >= self.settings.eject_after:
            health.ejected = True
            log.warning(
                "endpoint %s (%s) ejected after %d failures: %s",
                endpoint.name,
                endpoint.address,
                health.consecutive_failures,
                error,
            )

    def record_success(self, endpoint: Endpoint) -> None:
        health = endpoint.health
        health.consecutive_failures = 0
        if health.ejected:
            health.ejected = False
            log.info("endpoint %s (%s) is back", endpoint.name, endpoint.address)

    # ------------------------------------------------------------------ tasks

    def _start_endpoint(self, endpoint: Endpoint) -> None:
        if not self._running or id(endpoint) in self._tasks:
            return
        self._tasks[id(endpoint)] = [
            asyncio.create_task(self._scrape_loop(endpoint), name=f"scrape-{endpoint.name}"),
            asyncio.create_task(self._models_loop(endpoint), name=f"models-{endpoint.name}"),
        ]

    def _stop_endpoint(self, endpoint: Endpoint) -> None:
        for task in self._tasks.pop(id(endpoint), []):
            task.cancel()
            # Keep a reference until it has finished, so stop() can wait for it.
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def _scrape_loop(self, endpoint: Endpoint) -> None:
        loop = asyncio.get_running_loop()
        try:
            parser = MetricsParser(endpoint.engine_type)
        except ValueError as exc:
            log.error("endpoint %s: %s; not scraping it", endpoint.name, exc)
            return
        interval = self.settings.scrape_interval_s
        while True:
            started = loop.time()
            try:
                if parser.engine_type != endpoint.engine_type:  # changed by a reload
                    parser = MetricsParser(endpoint.engine_type)
                await self._scrape_once(endpoint, parser)
            except Exception as exc:  # a bug must not stop this endpoint's scrapes for good
                log.exception("endpoint %s: unexpected scrape failure", endpoint.name)
                self.record_failure(endpoint, f"scrape: {type(exc).__name__}: {exc}")
            await asyncio.sleep(max(0.0, interval - (loop.time() - started)))

    async def _scrape_once(self, endpoint: Endpoint, parser: MetricsParser) -> None:
        try:
            status, body = await self._get(endpoint, "/metrics")
            if status != 200:
                raise MetricsParseError(f"/metrics answered {status}")
            endpoint.metrics = parser.parse(body.decode("utf-8", "replace"), self.clock.now())
        except (UpstreamError, TimeoutError, MetricsParseError, ValueError) as exc:
            self.record_failure(endpoint, f"scrape: {type(exc).__name__}: {exc}")
            return
        endpoint.inflight.scraped()
        self.record_success(endpoint)
        for listener in self.on_scrape:
            listener(endpoint)

    async def _models_loop(self, endpoint: Endpoint) -> None:
        retry = min(1.0, self.settings.models_interval_s)
        while True:
            try:
                ok = await self._list_models(endpoint)
            except Exception:
                log.exception("endpoint %s: unexpected failure listing models", endpoint.name)
                ok = False
            await asyncio.sleep(self.settings.models_interval_s if ok else retry)

    async def _list_models(self, endpoint: Endpoint) -> bool:
        try:
            status, body = await self._get(endpoint, "/v1/models")
            if status != 200:
                return False
            payload = orjson.loads(body)
        except (UpstreamError, TimeoutError, orjson.JSONDecodeError):
            return False
        models = parse_models(payload, self.clock.now())
        if models is None:
            return False
        endpoint.models = models
        return True

    async def _get(self, endpoint: Endpoint, path: str) -> tuple[int, bytes]:
        """Status and body of a GET, within ``scrape_timeout_s`` in all."""
        async with asyncio.timeout(self.settings.scrape_timeout_s):
            response = await self.upstream.request(
                endpoint.scheme, endpoint.host, endpoint.port, "GET", path, _IDENTITY
            )
            try:
                return response.status, await response.read()
            finally:
                response.release()


def parse_models(payload: object, now: float) -> ServedModels | None:
    """Base models and adapters from a ``/v1/models`` answer; None if malformed."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return None
    base: set[str] = set()
    adapters: set[str] = set()
    for entry in payload["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        (adapters if entry.get("parent") else base).add(entry["id"])
    return ServedModels(frozenset(base), frozenset(adapters), now)
