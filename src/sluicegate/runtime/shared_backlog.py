"""Flow control's waiting counts shared between gateway replicas through Redis
(``sharedState.backlog``; ``docs/replicas.md``, ``docs/flow-control.md#across-replicas``).

Every ``backlogSyncMs``, while this replica has flow-control queues (none: no call at all),
one script call (:data:`BACKLOG_SCRIPT`) stores this replica's
waiting requests per pool and priority under a key that expires after ``leaseMs`` (its
lease), lists the replicas alive (a sorted set scored by lease end, in Redis's own clock)
and returns their snapshots. Their sum becomes the
:class:`~sluicegate.flowcontrol.peers.PeerBacklogView` the dispatch rule reads, stamped with
the runtime's clock; a snapshot replaces the previous one whole, so no count can leak, and a
replica that dies stops being counted once its lease runs out. Off the request path: the
rule only reads the last reading.

Degrade, never fail: the call goes through :meth:`SharedState.call` (one timeout, the
fallback counted under the task ``backlog``, logged once). On a failure the reading is
dropped at once — the replica dispatches on its own — and the sync tries again every
``retryMs``. A reading is also ignored once older than the lease (the loop stalled).

Snapshot layout (little-endian): records, each ``u16 pool_len, i32 priority, u32 waiting``,
then the pool name (UTF-8); at most :data:`MAX_RECORDS` records. A snapshot that does not
decode is skipped whole (counted), never crashes the reader.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from sluicegate.clock import Clock
from sluicegate.flowcontrol.peers import (
    MAX_BANDS,
    MAX_POOLS,
    Backlog,
    PeerBacklogView,
    PeerYield,
    add_backlog,
    local_backlog,
)
from sluicegate.requestcontrol.director import Director
from sluicegate.runtime.shared import SharedState, guarded
from sluicegate.runtime.shared_wire import WireError

MAX_RECORDS = MAX_POOLS * MAX_BANDS
"""Records one snapshot may hold."""

_HEAD = struct.Struct("<HiI")
_U32 = 0xFFFF_FFFF

# KEYS[1]: the sorted set of replicas publishing backlogs; KEYS[2]: this replica's snapshot
# key. ARGV: replica id, lease (ms), snapshot, snapshot key prefix. Lease ends are Redis's
# own clock (TIME), so replicas need no synchronised clocks.
BACKLOG_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', lease)
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], lease * 4)
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for _, id in ipairs(ids) do
  if id ~= ARGV[1] then
    local v = redis.call('GET', ARGV[4] .. id)
    if v then out[#out + 1] = v end
  end
end
return out
"""


def encode_backlog(backlog: Backlog) -> bytes:
    """One replica's snapshot; empty bands are left out (absent reads as zero)."""
    parts: list[bytes] = []
    records = 0
    for pool, bands in backlog.items():
        raw = pool.encode()
        if len(raw) > 0xFFFF:
            continue  # not a name any configuration produces
        for priority, waiting in bands.items():
            if waiting <= 0 or not -(2**31) <= priority < 2**31 or records >= MAX_RECORDS:
                continue
            parts += (_HEAD.pack(len(raw), priority, min(waiting, _U32)), raw)
            records += 1
    return b"".join(parts)


def decode_backlog(data: bytes) -> list[tuple[str, int, int]]:
    """(pool, priority, waiting) rows of one snapshot; :class:`WireError` if it is not one."""
    view = memoryview(data)
    at, end = 0, len(data)
    rows: list[tuple[str, int, int]] = []
    try:
        while at < end:
            if len(rows) >= MAX_RECORDS:
                raise WireError(f"backlog snapshot of more than {MAX_RECORDS} records")
            n, priority, waiting = _HEAD.unpack_from(view, at)
            at += _HEAD.size
            if at + n > end:
                raise WireError("backlog snapshot cut short")
            rows.append((bytes(view[at : at + n]).decode(), priority, waiting))
            at += n
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"not a backlog snapshot: {exc}") from exc
    return rows


class BacklogSync:
    """Publishes ``local()`` (this replica's waiting counts) and keeps :attr:`view` (the
    other replicas' sum) over ``state``'s Redis link; ``on_update`` is called after each
    reading changes (the director pumps: held requests may go now). While ``active()`` is
    false the loop only idles (:meth:`idle`)."""

    def __init__(
        self,
        state: SharedState,
        local: Callable[[], Backlog],
        clock: Clock,
        on_update: Callable[[], None] | None = None,
        active: Callable[[], bool] | None = None,
    ) -> None:
        self.state = state
        self.local = local
        self.clock = clock
        self.on_update = on_update
        self.active = active
        """Whether this replica has flow-control queues at all (None: always): without,
        the loop makes no Redis call."""
        settings = state.settings
        self.lease_ms = int(settings.lease_ms)
        self.view = PeerBacklogView(max_age_s=settings.lease_ms / 1000.0)
        p = state.key_base  # one hash slot with every other key (Redis Cluster)
        self.replicas_key = f"{p}:backlog-replicas"
        self.snapshot_prefix = f"{p}:backlog:"
        self.key = self.snapshot_prefix + state.replica_id
        self._script = state.client.register_script(BACKLOG_SCRIPT)
        self.bad_snapshots = 0
        """Peers' snapshots skipped as malformed."""
        self._task: asyncio.Task[None] | None = None
        self._published = False
        """Whether a snapshot of this replica's may be in Redis."""

    async def sync(self) -> bool:
        """Publish this replica's counts and read the others' once; False on fallback."""
        args: list[bytes | str | int] = [
            self.state.replica_id,
            self.lease_ms,
            encode_backlog(self.local()),
            self.snapshot_prefix,
        ]
        op = self._script(keys=[self.replicas_key, self.key], args=args)
        result = await self.state.call("backlog", op)
        if result is None:
            had = self.view.as_of is not None
            self.view.clear()
            if had:
                self._updated()
            return False
        self._published = True
        totals: dict[str, dict[int, int]] = {}
        for blob in result:
            try:
                add_backlog(totals, decode_backlog(blob))
            except WireError:
                self.bad_snapshots += 1
        self.view.update(totals, self.clock.now())
        self._updated()
        return True

    def _updated(self) -> None:
        if self.on_update is not None:
            self.on_update()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="shared-backlog")

    async def stop(self) -> None:
        """Stop syncing and remove this replica's counts at once (a clean exit does not
        wait for its lease); call before the shared state closes its connections."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._published and self.state.up:
            await self.state.call("backlog", self._leave())
            self._published = False
        self.view.clear()

    async def _leave(self) -> bool:
        pipe = self.state.client.pipeline(transaction=True)
        pipe.delete(self.key)
        pipe.zrem(self.replicas_key, self.state.replica_id)
        await pipe.execute()
        return True

    async def _loop(self) -> None:
        settings = self.state.settings
        every = settings.backlog_sync_ms / 1000.0
        retry = settings.retry_ms / 1000.0
        while True:
            step = self.sync() if self.active is None or self.active() else self.idle()
            ok = await guarded("backlog sync", step)
            await asyncio.sleep(every if ok else retry)

    async def idle(self) -> bool:
        """No queue here (``active()`` false): nothing to publish and nothing that could
        hold, so no Redis call — but this replica's last snapshot is removed, once. The
        view is cleared after that removal, so a cleared view means the peers no longer
        read this replica's counts."""
        if self._published:
            left = await self.state.call("backlog", self._leave())
            if left is None:
                self.view.clear()
                return False
            self._published = False
        self.view.clear()
        return True


def share_backlog(state: SharedState, director: Director, clock: Clock) -> BacklogSync:
    """The backlog sync of ``director``'s queues over ``state``, with the dispatch rule
    set on the director (``maxYieldMs``); the sync is started by the caller."""

    def pump() -> None:
        if director.waiting_requests():
            director.pump()

    sync = BacklogSync(
        state,
        lambda: local_backlog(director.controllers()),
        clock,
        pump,
        lambda: bool(director.controllers()),
    )
    director.peer_yield = PeerYield(sync.view, state.settings.max_yield_ms / 1000.0)
    return sync


__all__ = [
    "BACKLOG_SCRIPT",
    "MAX_RECORDS",
    "BacklogSync",
    "decode_backlog",
    "encode_backlog",
    "share_backlog",
]
