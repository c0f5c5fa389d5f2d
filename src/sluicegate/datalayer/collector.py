"""Keeping endpoint state fresh: metric scrapes, served-model lists and health.

One asyncio task per endpoint scrapes ``/metrics`` every ``scrape_interval_s`` with a
bounded timeout; another lists ``/v1/models`` every ``models_interval_s`` (sooner until the
first answer). A failed scrape leaves the previous snapshot in place with its old
timestamp, so it turns stale instead of looking idle. ``eject_after`` consecutive failed
scrapes take an endpoint out of scheduling; the next successful scrape brings it back.
Failed *requests* are the outlier detector's (:mod:`sluicegate.datalayer.outlier`): a
scrape neither counts nor clears them.

Stale is not idle, and neither is frozen: a scrape whose token counter
(``EngineMetrics.generation_tokens``) does not count tokens this gateway relayed before it
sent the scrape, and stands where the previous scrape had it, is not believed. Relayed
tokens were generated after the scrape their request was dispatched on
(``InFlight.relayed`` keeps that scrape's count in ``token_check``), so an honest counter
shows more; a scrape sent before the relay is not judged (it may count the tokens or not).
A scrape not believed is stored with the last believable scrape's timestamp (so after
``staleness_s`` of that the endpoint is stale) and, once that lasts ``frozen_after_s``,
the endpoint is marked frozen until its counter moves again (or ``frozen_recheck_s``
passed: then it is given another chance). An ejection forgets the relays before it: they
are not checked against whatever answers after the outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import orjson

from sluicegate.clock import Clock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, ServedModels
from sluicegate.datalayer.outlier import SCRAPE_FAILURE, EjectionListener
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
    """Failed scrapes in a row that eject an endpoint."""
    frozen_after_s: float = 1.0
    """How long a token counter may stand still while tokens are relayed (s)."""
    frozen_recheck_s: float = 30.0
    """How long an endpoint found frozen stays so unless its counter moves (s)."""


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
        self.on_eject: list[EjectionListener] = []
        """Told of each scrape-failure ejection (for metrics)."""
        self.on_reachable: list[Callable[[Endpoint], None]] = []
        """Called when a scrape succeeds after enough failed ones to have ejected the
        endpoint: unreachable for a while, it answers again (e.g. to end an ejection for
        refused connections)."""
        self.on_models: list[Callable[[Endpoint], None]] = []
        """Called when an endpoint's served-model list changed (its first listing
        included): a target no endpoint lists any more can be refused."""
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
        """A scrape of ``endpoint`` failed."""
        health = endpoint.health
        health.consecutive_failures += 1
        health.last_error = error
        if not health.scrape_ejected and health.consecutive_failures >= self.settings.eject_after:
            health.scrape_ejected = True
            health.sync()
            # Relays before an outage are not checked against whatever answers after it:
            # a restarted server counts from 0 and may stand exactly on the check.
            endpoint.inflight.token_check = None
            log.warning(
                "endpoint %s (%s) ejected after %d failed scrapes: %s",
                endpoint.name,
                endpoint.address,
                health.consecutive_failures,
                error,
            )
            for listener in self.on_eject:
                listener(endpoint, SCRAPE_FAILURE)

    def record_success(self, endpoint: Endpoint) -> None:
        """A scrape of ``endpoint`` succeeded (request failures are not touched)."""
        health = endpoint.health
        health.consecutive_failures = 0
        if health.scrape_ejected:
            health.scrape_ejected = False
            health.sync()
            log.info("endpoint %s (%s) answers its scrapes again", endpoint.name, endpoint.address)
            for listener in self.on_reachable:
                listener(endpoint)

    def _believable(self, endpoint: Endpoint, new: EngineMetrics, check: float | None) -> bool:
        """Whether scrape ``new`` shows the endpoint's state now (see the module);
        ``check`` is the endpoint's ``token_check`` when the scrape was sent."""
        old = endpoint.metrics
        health = endpoint.health
        counter = new.generation_tokens
        if old is None or counter is None or old.generation_tokens is None:
            return True
        now = new.scraped_at
        frozen_at = health.metrics_frozen_at
        if frozen_at is not None:
            if counter != old.generation_tokens:
                health.metrics_frozen_at = None
                log.info("endpoint %s: its metrics move again", endpoint.name)
                self._checked(endpoint, check)
                return True
            if now - frozen_at < self.settings.frozen_recheck_s:
                return False
            health.metrics_frozen_at = None  # another chance: traffic will tell
            self._checked(endpoint, check)
            return True
        if check is None or counter != check or counter != old.generation_tokens:
            # Nothing to check, or the counter moved past it, or it went back since the
            # last scrape: a restarted server counts from zero, and may stand exactly on
            # the check (a relay on the count of 0 not yet checked when the old process
            # died), which is no evidence of a frozen /metrics.
            self._checked(endpoint, check)
            return True
        if now - old.scraped_at >= self.settings.frozen_after_s:
            health.metrics_frozen_at = now
            log.warning(
                "endpoint %s (%s): /metrics frozen (no generated token counted for %.1f s "
                "while tokens were relayed); its metrics are stale",
                endpoint.name,
                endpoint.address,
                now - old.scraped_at,
            )
        return False

    @staticmethod
    def _checked(endpoint: Endpoint, check: float | None) -> None:
        """The relays before the scrape that was sent with ``check`` are accounted for;
        a later relay that raised the check waits for the next scrape."""
        inflight = endpoint.inflight
        if check is not None and inflight.token_check == check:
            inflight.token_check = None

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
        check = endpoint.inflight.token_check  # relayed before this scrape is sent
        try:
            status, body = await self._get(endpoint, "/metrics")
            if status != 200:
                raise MetricsParseError(f"/metrics answered {status}")
            metrics = parser.parse(body.decode("utf-8", "replace"), self.clock.now())
        except (UpstreamError, TimeoutError, MetricsParseError, ValueError) as exc:
            self.record_failure(endpoint, f"scrape: {type(exc).__name__}: {exc}")
            return
        self.record_success(endpoint)
        old = endpoint.metrics
        if self._believable(endpoint, metrics, check):
            endpoint.metrics = metrics
            endpoint.inflight.scraped()
        else:
            # Dated from the last believable scrape: it turns stale, and what was
            # dispatched since stays counted on top of it.
            assert old is not None
            endpoint.metrics = replace(metrics, scraped_at=old.scraped_at)
            return
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
        old = endpoint.models
        endpoint.models = models
        listed = (models.base_models, models.adapters)
        if not old.known or (old.base_models, old.adapters) != listed:
            for listener in self.on_models:
                listener(endpoint)
        return True

    async def _get(self, endpoint: Endpoint, path: str) -> tuple[int, bytes]:
        """Status and body of a GET, within ``scrape_timeout_s`` in all."""
        async with asyncio.timeout(self.settings.scrape_timeout_s):
            response = await self.upstream.request(
                endpoint.scheme,
                endpoint.host,
                endpoint.port,
                "GET",
                path,
                _IDENTITY,
                abortable=False,  # not a request in flight: its own timeout bounds it
            )
            try:
                return response.status, await response.read()
            finally:
                response.release()


MAX_LISTED_MODELS = 1024
"""Entries of one endpoint's ``/v1/models`` kept (for the gateway's merged list)."""
MAX_LISTED_ENTRY_BYTES = 16 * 1024
"""Longest entry kept, as JSON (vLLM's are a few hundred bytes)."""


def parse_models(payload: object, now: float) -> ServedModels | None:
    """Base models and adapters from a ``/v1/models`` answer; None if malformed. The first
    :data:`MAX_LISTED_MODELS` entries (each at most :data:`MAX_LISTED_ENTRY_BYTES` long)
    are kept as the server wrote them; the names of all of them count."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return None
    base: set[str] = set()
    adapters: set[str] = set()
    entries: list[dict[str, object]] = []
    for entry in payload["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        (adapters if entry.get("parent") else base).add(entry["id"])
        if len(entries) < MAX_LISTED_MODELS and len(orjson.dumps(entry)) <= MAX_LISTED_ENTRY_BYTES:
            entries.append(entry)
    return ServedModels(frozenset(base), frozenset(adapters), now, tuple(entries))
