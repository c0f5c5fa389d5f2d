"""Running one simulated engine against the event loop's clock.

An :class:`EngineDriver` owns an :class:`~sluicegate.sim.engine.Engine` and its exported
metrics, and steps the engine in an asyncio task: each step's tokens become visible to the
request handlers once the step's duration has passed (scaled by ``time_scale`` wall
seconds per simulated second). The HTTP routes (:mod:`sluicegate.sim.server`) submit
sequences and wait on their :class:`Handle`; they never step the engine themselves.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sluicegate.sim.engine import Engine, Sequence
from sluicegate.sim.kvevents import KVEventLog
from sluicegate.sim.metrics import EngineMetrics
from sluicegate.sim.profiles import EngineProfile
from sluicegate.sim.prompt_tokens import PromptTokens, load_prompt_tokens

if TYPE_CHECKING:
    from sluicegate.sim.kvpublisher import KVEventPublisher

_MIN_SLEEP_S = 0.001
"""Waits shorter than this are not slept (the event loop rounds timers up to 1 ms)."""


class Handle:
    """Wakes a request's handler whenever its sequence produced tokens or ended.

    The engine runs a step ahead of the wall clock: a step's tokens are in the sequence as
    soon as the driver computes it, but only due once its duration has passed. ``visible``
    and ``done`` are what the driver has published so far; handlers read those, never the
    sequence's live state.
    """

    __slots__ = ("done", "event", "seq", "visible")

    def __init__(self, seq: Sequence, event: asyncio.Event | None = None) -> None:
        self.seq = seq
        self.event = event or asyncio.Event()
        self.visible = 0
        self.done = False

    def publish(self) -> None:
        """Make the sequence's tokens so far (and whether it ended) visible to the handler."""
        self.visible = self.seq.num_output
        self.done = self.seq.finished
        self.event.set()


class EngineDriver:
    """One engine, its metrics and the task that steps it in (scaled) real time."""

    def __init__(
        self,
        profile: EngineProfile,
        model_name: str,
        *,
        time_scale: float = 1.0,
        enable_prefix_caching: bool = True,
        lora_enabled: bool = False,
        legacy_metric_names: bool = False,
        histogram_max_age_s: float = 0.0,
        prompt_tokens: PromptTokens | None = None,
    ) -> None:
        """``prompt_tokens``: the profile's tokenizer, loaded (None: loaded here); every
        engine this driver makes (:meth:`reset`) uses the one load."""
        self.profile = profile
        self._prompt_tokens = prompt_tokens or load_prompt_tokens(profile.tokenizer)
        self.model_name = model_name
        self.time_scale = time_scale
        """Wall seconds per simulated second."""
        self._prefix_caching = enable_prefix_caching
        self._legacy_metric_names = legacy_metric_names
        self._histogram_max_age_s = histogram_max_age_s
        self.handles: dict[str, Handle] = {}
        """Requests being answered, by request id."""
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._t0 = 0.0
        self._engine_now = 0.0
        self.kv_publisher: KVEventPublisher | None = None
        """Publishes the engine's KV-cache events once per step, when they are on."""
        self.reset(lora_enabled)

    def reset(self, lora_enabled: bool) -> None:
        """A fresh engine and metrics (a restarted server); the driver must be stopped."""
        self.engine = Engine(self.profile, self._prefix_caching, self._prompt_tokens)
        self.metrics = EngineMetrics(
            self.engine,
            self.model_name,
            lora_enabled=lora_enabled,
            legacy_names=self._legacy_metric_names,
            histogram_max_age_s=self._histogram_max_age_s,
        )

    def publish_kv_events_to(self, publisher: KVEventPublisher | None) -> None:
        """Publish the engine's KV-cache events through ``publisher`` (None: stop logging)."""
        self.kv_publisher = publisher
        self.engine.log_kv_events(None if publisher is None else KVEventLog())

    def flush_kv_events(self) -> None:
        """Publish what the KV cache did since the last batch, as one batch (if anything)."""
        events = self.engine.kv_events
        if self.kv_publisher is not None and events is not None and events.events:
            self.kv_publisher.publish(events.take())

    def now(self) -> float:
        """Simulated seconds since :meth:`start`."""
        return (asyncio.get_running_loop().time() - self._t0) / self.time_scale

    def arrival_time(self) -> float:
        """The simulated time a request arriving now is stamped with (never before the
        step the engine has computed up to)."""
        return max(self._engine_now, self.now())

    def start(self, name: str) -> None:
        """Start stepping the engine, with simulated time 0 now."""
        self._t0 = asyncio.get_running_loop().time()
        self._engine_now = 0.0
        self._task = asyncio.create_task(self._drive(), name=name)

    async def stop(self) -> None:
        """Stop stepping and drop all work: every request is aborted and its handler woken."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        now = self.now()
        for request_id in list(self.handles):
            self.engine.abort(request_id, now)
        for handle in self.handles.values():
            handle.publish()
        self.handles.clear()

    def submit(self, seq: Sequence, event: asyncio.Event | None = None) -> Handle:
        """Add ``seq`` to the engine; its handle wakes the caller as tokens come (through
        ``event`` if given: the choices of one request share theirs)."""
        self.engine.add(seq)
        handle = self.handles[seq.request_id] = Handle(seq, event)
        self._wake.set()
        return handle

    def release(self, handle: Handle) -> None:
        """The handler is done with ``handle``: abort its sequence if it has not finished
        (the client left, or a fault cut it)."""
        seq = handle.seq
        self.handles.pop(seq.request_id, None)
        if not seq.finished:
            self.engine.abort(seq.request_id, self.now())
            self.metrics.forget(seq.request_id)
            self._wake.set()

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.time_scale
        engine = self.engine
        busy = False
        while True:
            if not engine.has_work():
                busy = False
                self._wake.clear()
                await self._wake.wait()
                continue
            # Back-to-back steps keep the absolute schedule (timer lateness is not carried
            # into the engine's clock); after idling, or when far behind, resynchronise.
            sim_now = self.now()
            if busy and sim_now - self._engine_now < 0.005 / scale:
                now = self._engine_now
            else:
                now = max(self._engine_now, sim_now)
            result = engine.step(now)
            if result.idle:
                busy = False
                # Nothing can be scheduled until a request arrives or leaves.
                self._wake.clear()
                await self._wake.wait()
                continue
            busy = True
            done_at = now + result.duration
            delay = self._t0 + done_at * scale - loop.time()
            # Yield even when behind the clock: a driver that never yields would starve the
            # HTTP handlers (and the whole process) whenever steps cost more than they last.
            # Waits under a millisecond are not slept: the event loop's timers round them up
            # to a whole millisecond, and the schedule is absolute, so the next wait makes up
            # for a skipped one.
            await asyncio.sleep(delay if delay >= _MIN_SLEEP_S else 0.0)
            self._engine_now = done_at
            # vLLM publishes a step's events once the step ran: here when its results show
            self.flush_kv_events()
            self.metrics.observe_step(result)
            handles = self.handles
            for seq in result.emitted:
                handle = handles.get(seq.request_id)
                if handle is not None:
                    handle.publish()


__all__ = ["EngineDriver", "Handle"]
