"""Routing state shared between gateway replicas through Redis (``docs/replicas.md``).

:class:`SharedState` runs three background tasks on the host's event loop; none is on the
request path, which only reads local state (the prefix index, ``Endpoint.peers``) and
appends its prefix decisions to the :class:`~sluicegate.datalayer.sharing.PrefixShare`
outbox:

- **prefix writer** — every ``prefixFlushMs`` it packs the outbox into batches
  (:mod:`~sluicegate.runtime.shared_wire`) and appends them to one Redis stream
  (``XADD … MAXLEN ~ prefixStreamMaxEntries``; the stream's TTL is renewed to
  ``prefixTtlMs`` on every write);
- **prefix reader** — follows that stream (``XREAD BLOCK``), skipping its own batches, and
  inserts the other replicas' records into the local indexes, yielding to the event loop
  every :data:`APPLY_SLICE_BATCHES` batches or :data:`APPLY_SLICE_S` (requests keep being
  served while a backlog is applied). At start it replays what the stream holds from the
  last ``prefixTtlMs`` (at most ``prefixStreamMaxEntries`` batches: the stream's bound), so
  a replica that starts late agrees at once; after an outage it reads on from the last
  batch it applied (or the TTL's start, if later), never the whole stream again;
- **in-flight sync** — every ``inflightSyncMs`` one script call stores this replica's
  in-flight counts per endpoint under a key that expires after ``leaseMs`` (its lease),
  lists the replicas alive (a sorted set scored by lease end, in Redis's own clock) and
  returns their snapshots; their sum becomes each endpoint's :class:`PeerLoad`. A replica
  that dies stops being counted once its lease runs out; a snapshot replaces the previous
  one whole, so no count can leak.

Degrade, never fail: every Redis call has one timeout (``redis.timeoutMs``). The first that
fails or times out switches the replica to local state — peers' counts zeroed, prefix
decisions kept local — logs one warning, and counts the fallback; it tries again every
``retryMs`` and logs once more when Redis answers. The password in the URL is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from sluicegate.api.settings import SharedStateSettings
from sluicegate.api.settings import redacted_url as redacted
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import PeerLoad
from sluicegate.datalayer.sharing import PrefixShare
from sluicegate.runtime._shared_keys import default_replica_id, key_base
from sluicegate.runtime.shared_wire import (
    SYNC_SCRIPT,
    WireError,
    decode_load,
    decode_prefix,
    encode_load,
    encode_prefix,
    later_id,
)

log = logging.getLogger("sluicegate.shared")

T = TypeVar("T")
_Entry = tuple[bytes, dict[bytes, bytes]]
_StreamReply = tuple[bytes, list[_Entry]]

READ_BLOCK_MS = 500
"""How long one ``XREAD`` waits for new prefix batches before asking again."""
MAX_ABANDONED = 16
"""Timed-out calls still running at which no new call is started (each holds a
connection until its socket timeout ends it)."""
_READ_COUNT = 32
"""Batches one ``XREAD`` returns, at most (each up to 64 KiB)."""
APPLY_SLICE_BATCHES = 4
"""Batches applied between two yields to the event loop, at most."""
APPLY_SLICE_S = 0.002
"""Time spent applying batches before yielding to the event loop, at most (seconds; one
batch of 8,192 hashes takes ~1-17 ms, so on a loaded box that is one batch a slice)."""
_TAKE = 4096


class SharedState:
    """This replica's link to the shared state: the tasks above and their counters.

    ``datastore`` holds the endpoints whose :class:`PeerLoad` it writes; ``share`` (when
    ``prefixIndex`` is on) the prefix producers' outbox and sinks. :meth:`start` starts the
    tasks; :meth:`stop` removes this replica's counts from Redis at once (a clean exit
    does not wait for its lease) and closes the connections.
    """

    def __init__(self, settings: SharedStateSettings, datastore: Datastore) -> None:
        self.settings = settings
        self.datastore = datastore
        self.replica_id = settings.replica_id or default_replica_id()
        r = settings.redis
        self.timeout_s = r.timeout_ms / 1000.0
        p = self.key_base = key_base(r.key_prefix)
        self.replicas_key = f"{p}:replicas"
        self.snapshot_prefix = f"{p}:inflight:"
        self.stream_key = f"{p}:prefix"
        self.claim_key = f"{p}:claim:{self.replica_id}"
        self._nonce = uuid.uuid4().hex
        self.id_clashes = 0
        """Syncs that found this replica id claimed by another process (one warning)."""
        self._names: frozenset[str] = frozenset()
        """This replica's endpoint names, refreshed before each batch is applied."""
        self.share: PrefixShare | None = (
            PrefixShare(lambda name: name in self._names) if settings.prefix_index else None
        )
        self.up = False
        """Whether the last Redis call succeeded."""
        self.fallbacks: dict[str, int] = {}
        """Redis calls that failed or timed out, by task (``inflight``, ``prefix-write``,
        ``prefix-read``): each made the replica route on local state."""
        self.batches_written = 0
        self.batches_read = 0
        self.bad_batches = 0
        self.lost_records = 0
        """Prefix decisions not shipped (their write failed)."""
        self.peer_replicas = 0
        """Other replicas whose in-flight lease was alive at the last sync."""
        self._failed_before = False
        self._tasks: list[asyncio.Task[None]] = []
        self._abandoned: set[asyncio.Future[Any]] = set()  # results of any type: dropped
        """Calls given up on (timed out or cancelled) that have not ended yet."""
        self._writer = self._client(self.timeout_s)
        self._reader = self._client(self.timeout_s + READ_BLOCK_MS / 1000.0)
        self._sync = self._writer.register_script(SYNC_SCRIPT)

    def _client(self, socket_timeout_s: float) -> redis.asyncio.Redis:
        # One immediate retry: a pooled connection the server closed (it restarted) fails
        # once and reconnects. The caller's one timeout bounds the whole, retry included.
        return redis.asyncio.Redis.from_url(
            self.settings.redis.url.get_secret_value(),
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 1),
            client_name=None,
        )

    @property
    def client(self) -> redis.asyncio.Redis:
        """The client the in-flight sync and prefix writes use."""
        return self._writer

    @property
    def where(self) -> str:
        return redacted(self.settings.redis.url.get_secret_value())

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._tasks:
            return
        if self.settings.inflight:
            self._tasks.append(asyncio.create_task(self._inflight_loop(), name="shared-inflight"))
        if self.share is not None:
            self._tasks.append(asyncio.create_task(self._write_loop(), name="shared-prefix-w"))
            self._tasks.append(asyncio.create_task(self._read_loop(), name="shared-prefix-r"))
        log.info("shared state via %s as replica %s", self.where, self.replica_id)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.settings.inflight and self.up:
            # Leave at once rather than when the lease runs out.
            await self.call("inflight", self._leave())
        self._zero_peers()
        closing: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(c.aclose()) for c in (self._writer, self._reader)
        ]
        # Bounded like every call: a hung connection is left to the process's end.
        _, pending = await asyncio.wait([*closing, *self._abandoned], timeout=self.timeout_s)
        for left in pending:
            left.cancel()

    async def _leave(self) -> None:
        pipe = self._writer.pipeline(transaction=True)
        pipe.delete(self.snapshot_prefix + self.replica_id, self.claim_key)
        pipe.zrem(self.replicas_key, self.replica_id)
        await pipe.execute()

    # ------------------------------------------------------------------ degrade

    async def call(self, task: str, op: Awaitable[T], timeout_s: float | None = None) -> T | None:
        """``op`` within the timeout; None (and local state) when it fails or times out.

        The call runs as a task of its own that is abandoned (cancelled, not awaited) when
        the timeout passes or the caller is cancelled: a client call interrupted inside
        its socket write was seen to hold its cancellation for seconds, and nothing here
        may wait longer than the one timeout."""
        if len(self._abandoned) >= MAX_ABANDONED:
            if asyncio.iscoroutine(op):
                op.close()
            self._failed(task, TimeoutError(f"{len(self._abandoned)} earlier calls still hang"))
            return None
        call = asyncio.ensure_future(op)
        try:
            done, _ = await asyncio.wait([call], timeout=timeout_s or self.timeout_s)
        except asyncio.CancelledError:
            self._abandon(call)
            raise
        if not done:
            self._abandon(call)
            self._failed(task, TimeoutError(f"no answer within {timeout_s or self.timeout_s} s"))
            return None
        exc = call.exception()
        if exc is not None:  # redis, socket and protocol errors alike: degrade
            self._failed(task, exc)
            return None
        result = call.result()
        if not self.up:
            if self._failed_before:
                log.warning("shared state: %s answers again; sharing resumed", self.where)
            self.up = True
            if self.share is not None:
                self.share.enabled = True
        return result

    def _abandon(self, call: asyncio.Future[Any]) -> None:
        call.cancel()
        self._abandoned.add(call)
        call.add_done_callback(self._reap)

    def _reap(self, call: asyncio.Future[Any]) -> None:
        self._abandoned.discard(call)
        if not call.cancelled():
            call.exception()  # retrieved: an abandoned call's error is no news

    def _failed(self, task: str, exc: BaseException) -> None:
        self.fallbacks[task] = self.fallbacks.get(task, 0) + 1
        if self.up or not self._failed_before:
            log.warning(
                "shared state: %s unavailable (%s: %s); routing on local state until it answers",
                self.where,
                type(exc).__name__,
                exc,
            )
        self._failed_before = True
        self.up = False
        self._zero_peers()
        if self.share is not None:
            self.share.enabled = False
            self.lost_records += len(self.share.outbox)
            self.share.outbox.clear()

    def _zero_peers(self) -> None:
        for e in self.datastore.all_endpoints():
            p = e.peers
            p.requests = p.prompt_tokens = p.decode_tokens = 0
        self.peer_replicas = 0

    # ------------------------------------------------------------------ in-flight

    def _snapshot(self) -> bytes:
        return encode_load(
            (e.name, e.inflight.requests, e.inflight.prompt_tokens, e.inflight.decode_tokens)
            for e in self.datastore.all_endpoints()
        )

    async def sync_inflight(self) -> bool:
        """Publish this replica's counts and read the others' once; False on fallback."""
        lease = int(self.settings.lease_ms)
        keys = [self.replicas_key, self.snapshot_prefix + self.replica_id, self.claim_key]
        args: list[bytes | str | int] = [
            self.replica_id,
            lease,
            self._snapshot(),
            self.snapshot_prefix,
            self._nonce,
        ]
        result = await self.call("inflight", self._sync(keys=keys, args=args))
        if result is None:
            return False
        if result and result[0] == b"1":
            if not self.id_clashes:
                log.warning(
                    "shared state: another gateway uses replicaId %r too; their in-flight "
                    "counts overwrite each other (give each replica its own id, or none)",
                    self.replica_id,
                )
            self.id_clashes += 1
        totals: dict[str, list[int]] = {}
        peers = 0
        for blob in result[1:]:
            try:
                decode_load(blob, totals)
            except WireError:
                continue
            peers += 1
        self.peer_replicas = peers
        for e in self.datastore.all_endpoints():
            t = totals.get(e.name)
            p: PeerLoad = e.peers
            if t is None:
                p.requests = p.prompt_tokens = p.decode_tokens = 0
            else:
                p.requests, p.prompt_tokens, p.decode_tokens = t
        return True

    async def _inflight_loop(self) -> None:
        every = self.settings.inflight_sync_ms / 1000.0
        retry = self.settings.retry_ms / 1000.0
        while True:
            ok = await guarded("in-flight sync", self.sync_inflight())
            await asyncio.sleep(every if ok else retry)

    # ------------------------------------------------------------------ prefix index

    async def flush_prefix(self) -> bool:
        """Ship what the outbox holds; False on fallback (the records are lost)."""
        share = self.share
        if share is None or not share.outbox:
            return True
        records = share.take(_TAKE)
        pipe = self._writer.pipeline(transaction=False)
        maxlen = self.settings.prefix_stream_max_entries
        n = 0
        for batch in encode_prefix(records):
            pipe.xadd(self.stream_key, {"r": self.replica_id, "d": batch}, maxlen=maxlen)
            n += 1
        pipe.pexpire(self.stream_key, int(self.settings.prefix_ttl_ms))
        if await self.call("prefix-write", pipe.execute()) is None:
            self.lost_records += len(records)
            return False
        self.batches_written += n
        return True

    async def _write_loop(self) -> None:
        every = self.settings.prefix_flush_ms / 1000.0
        retry = self.settings.retry_ms / 1000.0
        while True:
            ok = await guarded("prefix write", self.flush_prefix())
            await asyncio.sleep(every if ok else retry)

    async def _replay_start(self) -> str | None:
        """The stream id to replay from: ``prefixTtlMs`` before Redis's clock now."""
        now = await self.call("prefix-read", self._reader.time())
        if now is None:
            return None
        seconds, micros = now
        start_ms = int(seconds) * 1000 + int(micros) // 1000 - int(self.settings.prefix_ttl_ms)
        return f"{max(0, start_ms)}-0"

    async def _apply(self, entries: list[_Entry]) -> str | None:
        """Insert the peers' records of ``entries``; the last entry's id. Yields to the
        event loop between slices (see :data:`APPLY_SLICE_S`)."""
        share = self.share
        assert share is not None
        last: str | None = None
        me = self.replica_id.encode()
        self._names = frozenset(e.name for e in self.datastore.all_endpoints())
        clock = time.perf_counter
        slice_end = clock() + APPLY_SLICE_S
        in_slice = 0
        for entry_id, fields in entries:
            last = entry_id.decode()
            if fields.get(b"r") == me:
                continue
            try:
                records = decode_prefix(fields.get(b"d", b""))
            except WireError:
                self.bad_batches += 1
                continue
            self.batches_read += 1
            for record in records:
                share.deliver(record)
            in_slice += 1
            if in_slice >= APPLY_SLICE_BATCHES or clock() >= slice_end:
                await asyncio.sleep(0)
                # Endpoints may have changed while others ran.
                self._names = frozenset(e.name for e in self.datastore.all_endpoints())
                slice_end = clock() + APPLY_SLICE_S
                in_slice = 0
        return last

    async def read_prefix(self, last_id: str, block_ms: int | None) -> str | None:
        """Apply the batches after ``last_id`` (waiting up to ``block_ms`` for some);
        the id to read on from, or None on fallback."""
        timeout = self.timeout_s + (block_ms or 0) / 1000.0
        got = await self.call(
            "prefix-read",
            self._xread(last_id, block_ms),
            timeout,
        )
        if got is None:
            return None
        for _stream, entries in got:
            last_id = await self._apply(entries) or last_id
        return last_id

    async def _xread(self, last_id: str, block_ms: int | None) -> list[_StreamReply]:
        reply = await self._reader.xread(
            {self.stream_key: last_id}, count=_READ_COUNT, block=block_ms
        )
        # RESP2 (the client's default protocol): [[stream, [(id, {field: value})]]].
        return cast("list[_StreamReply] | None", reply) or []

    async def _read_loop(self) -> None:
        retry = self.settings.retry_ms / 1000.0
        last_id: str | None = None
        resume = False
        while True:
            if last_id is None or resume:
                start = await self._replay_start()
                if start is None:
                    await asyncio.sleep(retry)
                    continue
                # Back after an outage: read on from the last batch applied, unless it is
                # older than the TTL (those batches are not replayed at all).
                last_id = start if last_id is None else later_id(last_id, start)
                resume = False
            after = await guarded("prefix read", self.read_prefix(last_id, READ_BLOCK_MS))
            if after is None:
                resume = True
                await asyncio.sleep(retry)
            else:
                last_id = after


async def guarded(what: str, step: Awaitable[T]) -> T | None:
    """One step of a loop; a bug logs and counts as a failed step instead of ending the
    loop (and sharing) for good."""
    try:
        return await step
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("shared state: %s failed", what)
        return None


__all__ = [
    "APPLY_SLICE_BATCHES",
    "APPLY_SLICE_S",
    "READ_BLOCK_MS",
    "SharedState",
    "guarded",
    "redacted",
]
