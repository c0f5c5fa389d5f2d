"""One ZeroMQ subscriber per endpoint, feeding the precise index.

:class:`KVEventSubscribers` keeps a SUB socket (``zmq.asyncio``) connected to each
endpoint's publisher; :meth:`~KVEventSubscribers.sync` connects new ones, closes the ones
that left (dropping their entries) and restarts those whose addresses changed. Each
subscriber checks the sequence numbers (see :mod:`~sluicegate.datalayer.kvevents.wire`):

- the next expected one: applied;
- a gap (some batches lost, e.g. over the PUB high-water mark): the missing range is asked
  of the replay socket, waiting at most ``replay_timeout`` seconds; replayed batches are
  applied in order, then the one that showed the gap. When replay is impossible (no replay
  address, timeout, the publisher's buffer no longer reaches back) the endpoint's entries
  are dropped — a lost removal would leave a false entry — and its view becomes unknown;
- a smaller one: the publisher restarted (a new process counts from 0, its cache empty):
  entries dropped, then the range from 0 replayed if it is not seq 0.

The view (:class:`View`) is *synced* while every batch since the publisher's seq 0 (or its
last ``AllBlocksCleared``) was applied, *unknown* otherwise: after a failed replay, or when
joining a publisher whose early batches are gone. An unknown view becomes synced again at
a clear, a restart from 0, or once ``turnover_blocks`` blocks were stored since it became
unknown (the cache has turned over, so what the index missed is likely evicted). Later
slices fall back to the approximate prefix match for endpoints whose view is unknown.

Malformed frames or payloads are counted (``dropped``), logged at most once per
``log_interval`` seconds per endpoint, and skipped. Sockets bound what they take: a frame
over ``max_message_bytes`` is refused by ZeroMQ, the receive queue holds ``rcvhwm``
messages. Times come from the injected clock except the replay wait (an asyncio timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from sluicegate.clock import Clock, MonotonicClock
from sluicegate.datalayer.kvevents.index import PreciseIndex
from sluicegate.datalayer.kvevents.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_batch,
    decode_replay_answer,
    decode_seq,
    encode_seq,
)

log = logging.getLogger(__name__)

ERROR_BACKOFF_S = 0.1
"""Pause (s) after an unexpected fault before reading on, so a fault cannot spin a core."""


@dataclass(frozen=True, slots=True)
class KVEventSource:
    """Where an endpoint publishes: ``pub_address`` (e.g. ``tcp://10.0.0.5:5557``), the
    replay address or None, the topic (vLLM's default ``""``) and the capacity of its
    index entries in blocks (None: the index default)."""

    pub_address: str
    replay_address: str | None = None
    topic: str = ""
    capacity_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class SubscriberSettings:
    """``replay_timeout`` (s): the longest wait for a replay; ``turnover_blocks``: stores
    after which an unknown view counts as synced again (None: the index capacity);
    ``log_interval`` (s) between malformed-payload log lines per endpoint;
    ``max_message_bytes``/``rcvhwm``: ZeroMQ receive bounds."""

    replay_timeout: float = 1.0
    turnover_blocks: int | None = None
    log_interval: float = 10.0
    max_message_bytes: int = 64 * 1024 * 1024
    rcvhwm: int = 100_000


class View(enum.Enum):
    """How complete the index's view of an endpoint's cache is."""

    SYNCED = "synced"
    UNKNOWN = "unknown"


@dataclass
class KVEventCounters:
    """Totals since start, per endpoint (for metrics): messages received, batches decoded
    and applied (replayed ones included), malformed messages dropped, messages of another
    topic (ZeroMQ filters by prefix), events of a kind this decoder does not know, sequence
    gaps, replays that filled a gap, replays that did not, publisher restarts."""

    received: int = 0
    decoded: int = 0
    dropped: int = 0
    other_topic: int = 0
    unknown_events: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    restarts: int = 0


@dataclass
class EndpointStream:
    """One endpoint's stream state: its view, counters, next expected sequence (None
    before the first batch) and when (clock s) it last delivered a batch."""

    view: View = View.UNKNOWN
    counters: KVEventCounters = field(default_factory=KVEventCounters)
    next_seq: int | None = None
    last_batch_at: float | None = None
    stored_since_unknown: int = 0


class _Subscriber:
    """The task reading one endpoint's PUB socket."""

    def __init__(
        self,
        key: str,
        source: KVEventSource,
        owner: KVEventSubscribers,
        stream: EndpointStream,
    ) -> None:
        self.key = key
        self.source = source
        self.owner = owner
        self.stream = stream
        self.topic = source.topic.encode()
        self._last_log = float("-inf")
        self._suppressed = 0
        ctx = owner.context
        settings = owner.settings
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, settings.rcvhwm)
        self.sub.setsockopt(zmq.MAXMSGSIZE, settings.max_message_bytes)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.connect(source.pub_address)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"kvevents:{key}")

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.sub.close(linger=0)

    async def _run(self) -> None:
        while True:
            try:
                frames = await self.sub.recv_multipart(copy=True)
                await self.handle(frames)
            except asyncio.CancelledError:
                raise
            except Exception:
                # a fault of ours or the socket's must not end the stream silently: what
                # the batch held is lost, so is the view; the next batch starts over
                log.exception("kv events: %s: unexpected fault; its entries are dropped", self.key)
                self._lost()
                self.stream.next_seq = None
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def handle(self, frames: list[bytes]) -> None:
        """One PUB message: ``(topic, seq, payload)``."""
        stream = self.stream
        stream.counters.received += 1
        if len(frames) != 3:
            self._malformed(f"{len(frames)} frames, expected 3")
            return
        if frames[0] != self.topic:
            stream.counters.other_topic += 1
            return
        try:
            seq = decode_seq(frames[1])
        except KVEventDecodeError as exc:
            self._malformed(str(exc))
            return
        try:
            batch = decode_batch(frames[2])
        except KVEventDecodeError as exc:
            # a batch we cannot read is a lost batch (it may have held removals); a replay
            # would hand back the same bytes, so the view is lost at once
            self._malformed(str(exc))
            self._lost()
            stream.next_seq = seq + 1
            return
        expected = stream.next_seq
        if expected is not None and seq < expected:
            self._restarted(seq)
            expected = None
        if expected is None:
            # a publisher we have not heard since its seq 0: complete only from 0
            if seq == 0 or await self._replay(0, seq):
                self._become_synced()
            else:
                self._lost()
        elif seq > expected:
            stream.counters.gaps += 1
            if not await self._replay(expected, seq):
                self._lost()
        self._apply(batch)
        stream.next_seq = seq + 1

    def _apply(self, batch: KVEventBatch) -> None:
        stream = self.stream
        index = self.owner.index
        for event in batch.events:
            index.apply(self.key, event)
            if isinstance(event, AllBlocksCleared):
                self._become_synced()
            elif isinstance(event, BlockStored) and stream.view is View.UNKNOWN:
                stream.stored_since_unknown += len(event.block_hashes)
        if stream.view is View.UNKNOWN and stream.stored_since_unknown >= self._turnover():
            self._become_synced()
        stream.counters.decoded += 1
        stream.counters.unknown_events += batch.skipped
        stream.last_batch_at = self.owner.clock.now()

    async def _replay(self, start: int, stop: int) -> bool:
        """Ask for batches ``start`` … ``stop − 1`` and apply them; True when all came."""
        if self.source.replay_address is None:
            self.stream.counters.replay_failures += 1
            return False
        got = await self._fetch_replay(start, stop)
        if got is None or len(got) != stop - start:
            self.stream.counters.replay_failures += 1
            return False
        for _, batch in got:
            self._apply(batch)
        self.stream.counters.replays += 1
        return True

    async def _fetch_replay(self, start: int, stop: int) -> list[tuple[int, KVEventBatch]] | None:
        """Batches with ``start ≤ seq < stop`` from the replay socket, in order; None on
        timeout or a malformed answer. A fresh DEALER per replay, so a late answer to a
        timed-out request can never be taken for the next one's."""
        assert self.source.replay_address is not None
        dealer = self.owner.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.owner.settings.max_message_bytes)
        # at most stop − start batches are kept: vLLM's replay buffer (buffer_steps, 10,000
        # by default) bounds that, the replay timeout bounds the time
        got: list[tuple[int, KVEventBatch]] = []
        try:
            dealer.connect(self.source.replay_address)
            # vLLM's ROUTER expects (identity, b"", start): a DEALER sends the empty delimiter
            # itself (a REQ socket would take only the first of the many replies)
            await dealer.send_multipart([b"", encode_seq(start)])
            async with asyncio.timeout(self.owner.settings.replay_timeout):
                while True:
                    frames = await dealer.recv_multipart(copy=True)
                    seq, payload = decode_replay_answer(frames)
                    if seq == END_SEQ:
                        return got
                    if seq >= stop:
                        continue  # newer than the gap: it reaches us on the PUB socket too
                    if seq != start + len(got):
                        return None  # the buffer no longer reaches back; stop decoding
                    got.append((seq, decode_batch(payload)))
        except TimeoutError:
            return None
        except KVEventDecodeError as exc:
            self._malformed(f"replay: {exc}")
            return None
        finally:
            dealer.close(linger=0)

    def _restarted(self, seq: int) -> None:
        self.stream.counters.restarts += 1
        log.info("kv events: %s restarted (seq %d after %s)", self.key, seq, self.stream.next_seq)
        self.owner.index.drop_endpoint(self.key, keep_capacity=True)
        self.stream.next_seq = 0

    def _lost(self) -> None:
        if self.owner.index.size(self.key):
            log.warning("kv events: %s lost batches; its entries are dropped", self.key)
        self.owner.index.drop_endpoint(self.key, keep_capacity=True)
        self.stream.view = View.UNKNOWN
        self.stream.stored_since_unknown = 0

    def _become_synced(self) -> None:
        self.stream.view = View.SYNCED
        self.stream.stored_since_unknown = 0

    def _turnover(self) -> int:
        turnover = self.owner.settings.turnover_blocks
        if turnover is not None:
            return turnover
        return self.source.capacity_blocks or self.owner.index.default_capacity

    def _malformed(self, why: str) -> None:
        self.stream.counters.dropped += 1
        now = self.owner.clock.now()
        if now - self._last_log < self.owner.settings.log_interval:
            self._suppressed += 1
            return
        log.warning(
            "kv events: malformed message from %s skipped: %s (%d more since the last line)",
            self.key,
            why[:200],
            self._suppressed,
        )
        self._last_log = now
        self._suppressed = 0


class KVEventSubscribers:
    """Every endpoint's subscriber, writing into one :class:`PreciseIndex`.

    Must be created and used inside a running event loop; :meth:`close` ends every task
    and socket.
    """

    def __init__(
        self,
        index: PreciseIndex,
        settings: SubscriberSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.index = index
        self.settings = settings or SubscriberSettings()
        self.clock: Clock = clock or MonotonicClock()
        self.context = zmq.asyncio.Context()
        self._subs: dict[str, _Subscriber] = {}
        self.streams: dict[str, EndpointStream] = {}

    async def sync(self, endpoints: Mapping[str, KVEventSource]) -> None:
        """Subscribe to exactly ``endpoints`` (key → source); a key that left or whose
        source changed loses its entries."""
        for key in list(self._subs):
            if endpoints.get(key) != self._subs[key].source:
                await self._subs.pop(key).close()
                del self.streams[key]
                self.index.drop_endpoint(key)
        for key, source in endpoints.items():
            if key in self._subs:
                continue
            if source.capacity_blocks is not None:
                self.index.set_capacity(key, source.capacity_blocks)
            stream = self.streams[key] = EndpointStream()
            self._subs[key] = _Subscriber(key, source, self, stream)

    def view(self, key: str) -> View:
        """The view of ``key``'s cache; UNKNOWN for an endpoint without a subscriber."""
        stream = self.streams.get(key)
        return View.UNKNOWN if stream is None else stream.view

    async def close(self) -> None:
        """Stop every subscriber; the index keeps nothing of them."""
        await self.sync({})
        self.context.term()
