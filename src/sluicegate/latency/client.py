"""The gateway's client of remote prediction and training servers.

:class:`RemotePredictor` is a :class:`~sluicegate.latency.predictor.LatencyPredictor` whose
predictions need I/O (``needs_io``; as llm-d-router's client,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/latencypredictorclient/):

- **Coalescing.** ``predict_async`` calls made within ``coalesce_window_s`` (1 ms) of the
  first pending one go out together as one ``POST /predict/bulk/strict`` (at most
  ``max_bulk_rows`` rows per HTTP request; a call's rows are never split, and a full batch
  goes at once without waiting for the window).
- **Spreading.** Each HTTP request goes to a random prediction-server URL among those not
  backing off; a URL that failed is skipped for ``retry_after_s``, doubling up to
  ``max_retry_after_s`` while it keeps failing. With none available a call answers None at
  once.
- **Deadline.** Each call answers within ``timeout_s`` (100 ms: prediction sits on the
  request path): None on timeout, HTTP error, bad answer or no server. Callers fall back.
- **Samples.** ``observe()`` buffers samples (bounded: the oldest are dropped and counted
  in ``samples_dropped``); every ``flush_interval_s`` (1 s) they go to the training server
  as ``POST /add_training_data_bulk`` bodies of at most ``max_flush_samples``.

``ready`` is true while the last successful prediction is at most ``ready_window_s`` old.
Use it for metrics; keep calling ``predict_async`` (the producer does: it is how the client
finds out the servers are back). ``warming_up`` is true while the last server that
answered said it has no model yet (503): the servers are up but not trained.

When every prediction server is unreachable (connection failures or timeouts, not 503s)
a warning is logged, again every :data:`UNREACHABLE_LOG_EVERY_S` while it lasts, and an
info line when one answers again. Call :meth:`RemotePredictor.start` at startup and
:meth:`RemotePredictor.close` at shutdown, on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np
import orjson

from sluicegate.clock import Clock, MonotonicClock
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import FeatureRow, Sample
from sluicegate.latency.predictor import PredictionQuery, Predictions
from sluicegate.latency.wire import sample_to_json

log = logging.getLogger("sluicegate.latency")

_JSON = {"Content-Type": "application/json"}

UNREACHABLE_LOG_EVERY_S = 30.0
"""How often (s) the warning that no prediction server can be reached is repeated."""


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """Where the servers are and how hard to try. Times in seconds."""

    prediction_urls: tuple[str, ...]
    """Base URLs of prediction servers (``http://host:port``)."""
    training_url: str | None = None
    """Base URL of the training server (None: samples are not sent anywhere)."""
    timeout_s: float = 0.1
    coalesce_window_s: float = 0.001
    max_bulk_rows: int = 1000
    """Rows per HTTP request (one call with more goes alone; servers take ≤ 10,000)."""
    retry_after_s: float = 0.5
    max_retry_after_s: float = 5.0
    flush_interval_s: float = 1.0
    max_flush_samples: int = 1000
    max_buffered_samples: int = 10_000
    flush_timeout_s: float = 5.0
    ready_window_s: float = 5.0
    quantile: float | None = None
    """The quantile the servers' models predict (None: a mean objective, or unknown);
    with it, predictions are rescaled online (:mod:`sluicegate.latency.calibration`)."""

    def __post_init__(self) -> None:
        if not self.prediction_urls:
            raise ValueError("at least one prediction server URL is required")
        if self.timeout_s <= 0 or self.coalesce_window_s < 0:
            raise ValueError("timeout_s must be positive and coalesce_window_s non-negative")
        if self.max_bulk_rows < 1 or self.max_flush_samples < 1 or self.max_buffered_samples < 1:
            raise ValueError("max_bulk_rows, max_flush_samples, max_buffered_samples ≥ 1")


class _Call:
    __slots__ = ("future", "rows")

    def __init__(self, rows: Sequence[FeatureRow], future: asyncio.Future[Predictions | None]):
        self.rows = rows
        self.future = future


class RemotePredictor:
    """Predictions from prediction servers; samples to a training server.

    Counters (plain attributes): ``calls``, ``http_requests``, ``failures`` (calls answered
    None for an HTTP/server problem), ``timeouts``, ``no_server`` (calls answered None
    because every URL was backing off), ``samples_sent``, ``samples_dropped``,
    ``flush_failures``.
    """

    def __init__(
        self,
        settings: RemoteSettings,
        *,
        session: aiohttp.ClientSession | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or MonotonicClock()
        self.rng = rng or random.Random(0)
        self._urls = [u.rstrip("/") for u in settings.prediction_urls]
        self._session = session
        self._own_session = session is None
        self._pending: list[_Call] = []
        self._pending_rows = 0
        self._window: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._down_until: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._buffer: deque[Sample] = deque(maxlen=settings.max_buffered_samples)
        self._flusher: asyncio.Task[None] | None = None
        self._last_success: float | None = None
        self._warming = False
        self._unreachable: set[str] = set()
        """URLs whose last request failed without an answer (connection, timeout)."""
        self._all_down_since: float | None = None
        self._all_down_logged_at = 0.0
        self.calibration = (
            LatencyCalibration(settings.quantile) if settings.quantile is not None else None
        )
        self.calls = 0
        self.http_requests = 0
        self.failures = 0
        self.timeouts = 0
        self.no_server = 0
        self.samples_sent = 0
        self.samples_dropped = 0
        self.flush_failures = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the HTTP session (unless given one) and start flushing samples."""
        self._ensure_session()
        if self.settings.training_url is not None and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_loop(), name="latency-samples")

    async def close(self) -> None:
        """Stop flushing (one last flush is attempted), answer pending calls None."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
            with contextlib.suppress(Exception):
                await self.flush()
        if self._window is not None:
            self._window.cancel()
            self._window = None
        for call in self._pending:
            if not call.future.done():
                call.future.set_result(None)
        self._pending.clear()
        self._pending_rows = 0
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            )
        return self._session

    # ------------------------------------------------------------------ predicting

    needs_io = True
    """Predictions are HTTP calls: the producer awaits :meth:`predict_query_async`."""

    @property
    def ready(self) -> bool:
        """A prediction succeeded within the last ``ready_window_s``."""
        last = self._last_success
        return last is not None and self.clock.now() - last <= self.settings.ready_window_s

    async def predict_async(self, rows: Sequence[FeatureRow]) -> Predictions | None:
        """TTFT/TPOT (ms) for every row, or None (failure, timeout: fall back)."""
        if not rows:
            return Predictions(np.empty(0, np.float32), np.empty(0, np.float32))
        self.calls += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Predictions | None] = loop.create_future()
        self._pending.append(_Call(rows, future))
        self._pending_rows += len(rows)
        if self._pending_rows >= self.settings.max_bulk_rows:
            self._dispatch()
        elif self._window is None:
            self._window = loop.call_later(self.settings.coalesce_window_s, self._dispatch)
        deadline = loop.call_later(self.settings.timeout_s, self._expire, future)
        try:
            return await future
        finally:
            deadline.cancel()

    async def predict_query_async(self, query: PredictionQuery) -> Predictions | None:
        """:meth:`predict_async` of the query's rows (the producer's call)."""
        return await self.predict_async(query.rows)

    @property
    def warming_up(self) -> bool:
        """The last prediction server to answer had no model yet (HTTP 503)."""
        return self._warming

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        """None: the servers cannot be asked without awaiting (see ``needs_io``)."""
        return None

    def _expire(self, future: asyncio.Future[Predictions | None]) -> None:
        if not future.done():
            self.timeouts += 1
            future.set_result(None)

    def _dispatch(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None
        calls, self._pending, self._pending_rows = self._pending, [], 0
        limit = self.settings.max_bulk_rows
        batch: list[_Call] = []
        rows = 0
        for call in calls:
            if call.future.done():  # timed out or cancelled while waiting
                continue
            if batch and rows + len(call.rows) > limit:
                self._send(batch)
                batch, rows = [], 0
            batch.append(call)
            rows += len(call.rows)
        if batch:
            self._send(batch)

    def _send(self, batch: list[_Call]) -> None:
        url = self._pick_url()
        if url is None:
            self.no_server += len(batch)
            self._note_unreachable(None)
            _answer(batch, None)
            return
        task = asyncio.create_task(self._post(url, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _pick_url(self) -> str | None:
        now = self.clock.now()
        up = [u for u in self._urls if self._down_until.get(u, 0.0) <= now]
        if not up:
            return None
        return up[0] if len(up) == 1 else self.rng.choice(up)

    async def _post(self, url: str, batch: list[_Call]) -> None:
        rows = [row for call in batch for row in call.rows]
        body = orjson.dumps({"requests": rows})  # FeatureRow dataclasses: fields by name
        session = self._ensure_session()
        self.http_requests += 1
        try:
            async with session.post(
                f"{url}/predict/bulk/strict",
                data=body,
                headers=_JSON,
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
            ) as resp:
                raw = await resp.read()
                if resp.status == 503:
                    raise _NotReadyError(f"answered 503: {raw[:200]!r}")
                if resp.status != 200:
                    raise ValueError(f"answered {resp.status}: {raw[:200]!r}")
            predictions = orjson.loads(raw)["predictions"]
            ttft = np.array([p["ttft_ms"] for p in predictions], dtype=np.float32)
            tpot = np.array([p["tpot_ms"] for p in predictions], dtype=np.float32)
            if len(ttft) != len(rows):
                raise ValueError(f"{len(ttft)} predictions for {len(rows)} rows")
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            # orjson.JSONDecodeError is a ValueError.
            self._failed(url, exc)
            self.failures += sum(1 for call in batch if not call.future.done())
            _answer(batch, None)
            return
        self._succeeded(url)
        start = 0
        for call in batch:
            end = start + len(call.rows)
            if not call.future.done():
                call.future.set_result(Predictions(ttft[start:end], tpot[start:end]))
            start = end

    def _failed(self, url: str, exc: BaseException) -> None:
        answered = not isinstance(exc, aiohttp.ClientConnectionError | TimeoutError)
        self._warming = isinstance(exc, _NotReadyError)
        if answered:
            self._reachable(url)
        else:
            self._unreachable.add(url)
            self._note_unreachable(exc)
        backoff = self._backoff.get(url)
        backoff = (
            self.settings.retry_after_s
            if backoff is None
            else min(backoff * 2, self.settings.max_retry_after_s)
        )
        self._backoff[url] = backoff
        self._down_until[url] = self.clock.now() + backoff
        log.debug("prediction server %s failed (%s); skipping it for %.1fs", url, exc, backoff)

    def _succeeded(self, url: str) -> None:
        self._last_success = self.clock.now()
        self._warming = False
        self._reachable(url)
        if url in self._backoff:
            del self._backoff[url]
            self._down_until.pop(url, None)

    def _reachable(self, url: str) -> None:
        self._unreachable.discard(url)
        since = self._all_down_since
        if since is not None:
            self._all_down_since = None
            log.info(
                "prediction server %s reachable again after %.0fs", url, self.clock.now() - since
            )

    def _note_unreachable(self, exc: BaseException | None) -> None:
        """Log (rate-limited) when no prediction server can be reached."""
        if len(self._unreachable) < len(self._urls):
            return
        now = self.clock.now()
        if self._all_down_since is None:
            self._all_down_since = now
        elif now - self._all_down_logged_at < UNREACHABLE_LOG_EVERY_S:
            return
        self._all_down_logged_at = now
        log.warning(
            "no prediction server reachable (%d configured, for %.0fs%s): scheduling falls "
            "back to the heuristics",
            len(self._urls),
            now - self._all_down_since,
            f"; last error: {type(exc).__name__}: {exc}" if exc is not None else "",
        )

    # ------------------------------------------------------------------ samples

    def observe(self, sample: Sample) -> None:
        """Queue a sample for the training server (O(1); the oldest go when full)."""
        if self.settings.training_url is None:
            return
        if len(self._buffer) == self._buffer.maxlen:
            self.samples_dropped += 1
        self._buffer.append(sample)

    @property
    def buffered_samples(self) -> int:
        return len(self._buffer)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flush_interval_s)
            try:
                await self.flush()
            except Exception:  # a bug must not stop the flushes for good
                log.exception("unexpected failure sending latency samples")

    async def flush(self) -> int:
        """Send every buffered sample now (in bodies of ``max_flush_samples``); the
        number sent. Samples of a failed request are dropped and counted."""
        url = self.settings.training_url
        if url is None:
            return 0
        sent = 0
        session = self._ensure_session()
        while self._buffer:
            take = min(len(self._buffer), self.settings.max_flush_samples)
            entries = [sample_to_json(self._buffer.popleft()) for _ in range(take)]
            try:
                async with session.post(
                    f"{url.rstrip('/')}/add_training_data_bulk",
                    data=orjson.dumps({"entries": entries}),
                    headers=_JSON,
                    timeout=aiohttp.ClientTimeout(total=self.settings.flush_timeout_s),
                ) as resp:
                    if resp.status not in (200, 202):
                        text = (await resp.read())[:200]
                        raise ValueError(f"answered {resp.status}: {text!r}")
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.flush_failures += 1
                self.samples_dropped += take
                log.warning("sending %d latency samples to %s failed: %s", take, url, exc)
                return sent
            sent += take
            self.samples_sent += take
        return sent


class _NotReadyError(ValueError):
    """A prediction server answered 503: it has no model yet."""


def _answer(batch: list[_Call], value: Predictions | None) -> None:
    for call in batch:
        if not call.future.done():
            call.future.set_result(value)
