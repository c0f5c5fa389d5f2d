"""The rest of a prompt, encoded after dispatch: a routing decision encodes only as far
as it needs (:mod:`~sluicegate.tokenization.progressive`); the rest is encoded here, in
one worker thread per tokenizer, so its prefix cache holds the whole conversation for the
next turn.

Bounded: at most :data:`MAX_PENDING` prompts wait, of :data:`MAX_PENDING_BYTES` in all; one
that would exceed either is dropped and counted (``dropped``) — the cache then keeps what
the decision encoded, and a next turn encodes the rest itself. The BPE runs without the
cache's lock (the ``tokenizers`` library releases the GIL for texts of 4,096 characters or
more), the store under it. ``done(keys)``, when given, receives the prompt's whole block
keys — on the event loop the request was decided on (``call_soon_threadsafe``), or, in a
host without one (a benchmark, the lab), on the submitting thread: queued by the worker
and run at that thread's next :meth:`DeferredEncoder.submit` or
:meth:`DeferredEncoder.drain` (a callback mutates state the caller reads, e.g. the
speculative entries, so it never runs in the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

from tokenizers import Encoding

from sluicegate.model_tokenizer.prefix_cache import PrefixTokenCache
from sluicegate.tokenization.base import DeferredCounters
from sluicegate.tokenization.progressive import Progress, advance, store

log = logging.getLogger(__name__)

MAX_PENDING = 64
"""Prompts waiting to be finished, at most."""
MAX_PENDING_BYTES = 64 << 20
"""UTF-8 bytes of the prompts waiting, at most (64 MiB; a waiting prompt keeps its text
and its UTF-8, about twice that in memory): 64 bodies of the largest size a gateway
takes would otherwise pin gigabytes."""

Done = Callable[[list[int]], None]
_Job = tuple[Progress, Done | None, asyncio.AbstractEventLoop | None]


class DeferredEncoder:
    """One worker thread finishing prompts into ``cache`` (see the module docstring)."""

    def __init__(
        self,
        cache: PrefixTokenCache,
        encode: Callable[[str], Encoding],
        lock: threading.Lock,
        on_drop: Callable[[Progress], None] | None = None,
    ) -> None:
        self.cache = cache
        self.encode = encode
        self.lock = lock
        self.on_drop = on_drop
        """Called (on the submitting thread) with a prompt the full queue refused."""
        self.counters = DeferredCounters()
        self._queue: queue.Queue[_Job | None] = queue.Queue(MAX_PENDING)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopping = False
        self.max_bytes = MAX_PENDING_BYTES
        """UTF-8 bytes of the waiting prompts, at most (:data:`MAX_PENDING_BYTES`)."""
        self.pending_bytes = 0
        """UTF-8 bytes of the prompts queued and not yet finished."""
        self._bytes_lock = threading.Lock()
        self._ready: deque[tuple[Done, list[int]]] = deque()
        """Callbacks of prompts finished for a host without an event loop, for the
        submitting thread to run (at most one per prompt queued: bounded as the queue
        is, since each submit runs those ready before)."""

    def submit(self, progress: Progress, done: Done | None = None) -> None:
        """Queue ``progress`` to be encoded to its end and stored (a full queue drops it,
        counted, and hands it to ``on_drop``). On an event loop it is queued once the
        current callback returns — the request's handler has dispatched it and yielded —
        so the worker does not contend with the rest of the decision for the GIL."""
        if self._stopping:  # closed (its tokenizer was replaced): nothing is finished
            self.counters.dropped += 1
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._ensure_thread()
        if loop is None:
            self.run_ready()
            self._enqueue((progress, done, None))
        else:
            loop.call_soon(self._enqueue, (progress, done, loop))

    def _enqueue(self, job: _Job) -> None:
        size = len(job[0].data)
        with self._bytes_lock:
            room = self.pending_bytes + size <= self.max_bytes
            if room:
                self.pending_bytes += size
        try:
            if not room:
                raise queue.Full
            self._queue.put_nowait(job)
        except queue.Full:
            if room:
                self._release(size)
            self.counters.dropped += 1
            if self.on_drop is not None:
                self.on_drop(job[0])

    def _release(self, size: int) -> None:
        with self._bytes_lock:
            self.pending_bytes -= size

    def drain(self) -> None:
        """Wait until every queued prompt is finished (benchmarks, tests), then run the
        callbacks ready for this thread (a host without an event loop)."""
        if self._thread is not None:
            self._queue.join()
        self.run_ready()

    def run_ready(self) -> None:
        """Run, on the calling thread, the callbacks of prompts finished for a host
        without an event loop (one failing is logged; the rest still run)."""
        ready = self._ready
        while ready:
            done, keys = ready.popleft()
            try:
                done(keys)
            except Exception:
                log.exception("handing a finished prompt's block keys on failed")

    def close(self) -> None:
        """Stop the worker after the prompt it is on (what is still queued is dropped; it
        is a daemon thread: a process exiting does not wait for it). Never blocks."""
        self._stopping = True
        if self._thread is not None:
            with contextlib.suppress(queue.Full):  # busy: it sees the flag after its prompt
                self._queue.put_nowait(None)  # wakes it when idle
            self._thread = None

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tokenizer-deferred", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None or self._stopping:
                    return
                self._finish(*job)
            finally:
                if job is not None:
                    self._release(len(job[0].data))
                self._queue.task_done()

    def _finish(
        self, p: Progress, done: Done | None, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        started = time.thread_time()
        try:
            before = p.encoded_tokens
            advance(p, self.encode, None, p.limit)
            with self.lock:
                store(self.cache, p)
                self.cache.counters.add(tokens_encoded=p.encoded_tokens - before)
        except Exception:  # a worker must survive any one prompt
            self.counters.failed += 1
            log.exception("finishing a prompt's encoding after dispatch failed")
            return
        finally:
            self.counters.seconds += time.thread_time() - started
        self.counters.finished += 1
        if done is None:
            return
        keys = list(p.keys)
        try:  # a failing callback, or a loop closing meanwhile, must not end the worker
            if loop is None:  # for the submitting thread (deque appends are atomic)
                self._ready.append((done, keys))
            elif not loop.is_closed():
                loop.call_soon_threadsafe(done, keys)
        except Exception:  # the prompt itself is finished (counted) and stored
            log.exception("handing a finished prompt's block keys on failed")


__all__ = ["MAX_PENDING", "DeferredEncoder"]
