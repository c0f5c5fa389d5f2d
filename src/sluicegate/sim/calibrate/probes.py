"""The designed requests of a calibration and what each one measures.

Every probe turns into :class:`Point` values: one engine iteration of known shape (tokens
batched, decoding sequences, their total context, prefill chunks) and its measured
duration in ms. Prompts are token ids of exact length whose first two ids are a per-run,
per-prompt nonce, so no probe finds another probe's blocks in the server's prefix cache
(the cached-prefix probe re-sends its own warm-up prompt on purpose).

- ``prefill``: one request on an idle server, ``max_tokens`` 1. Measured by the server's
  ``vllm:request_prefill_time_seconds`` (scheduled → first token: exactly the iteration)
  when it exports it, else by the client's time to first token. A prefill the server ran
  in more than one iteration (``vllm:iteration_tokens_total`` counted two steps) is
  dropped with a note: its chunking is not the one the plan assumed.
- ``cached-prefill``: a warm-up prompt of ``p`` tokens, then the same prompt followed by
  ``c`` new ones: a chunk of ``c`` tokens after ``p`` cached (what hit the cache is read
  from ``vllm:prefix_cache_hits`` or the response's ``cached_tokens``).
- ``decode``: ``B`` requests of exactly ``D`` tokens (``min_tokens`` = ``max_tokens``,
  ``ignore_eos``) sent together, measured while all ``B`` are decoding (after the last
  one's first token, before the first one ends): by the server's mean inter-token latency
  over that window (``vllm:inter_token_latency_seconds`` scraped at its two ends: the
  server's own view, which the held-out check and the lab compare against) when it
  exports it, else by the median gap between a stream's tokens.
- ``mixed``: during a decode run, one more prompt of ``P`` tokens: its prefill shares an
  iteration with the ``B`` decoding sequences (server prefill time, else the decoders'
  gap around its first token).
"""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import dataclass, field

from sluicegate.sim.calibrate.client import (
    ITERATION_TOKENS,
    ITL,
    PREFILL_TIME,
    PREFIX_HITS,
    TTFT,
    Scrape,
    Stream,
    Target,
)

_ID_LOW, _ID_HIGH = 200, 1800
"""Token ids used in prompts: inside any real vocabulary (the tests' tiny model has 2,048)."""
TIMED = 2
"""Requests of a decode batch that stream (and are timed)."""
SETTLE_S = 3.0
"""How long to wait for ``/metrics`` to show a finished probe (the simulator may serve
histograms up to ``--histogram-max-age`` old)."""


@dataclass(frozen=True, slots=True)
class Point:
    """One measured iteration. ``chunks`` are prefill chunks as (new tokens, cached
    tokens before them); ``decode_context`` is the summed context of the decoding
    sequences; ``measured_ms`` the median over ``samples`` measurements."""

    kind: str
    batched_tokens: int
    decode_seqs: int
    decode_context: int
    chunks: tuple[tuple[int, int], ...]
    measured_ms: float
    samples: int
    source: str
    """``server`` (the server's histograms) or ``client`` (client timings)."""
    probe: str = ""
    """The plan step that measured it (points of several passes merge by it)."""

    @property
    def first_token(self) -> bool:
        """Whether the value runs to a request's first token (a prefill time or time to
        first token) rather than between two tokens (a decode gap, a mixed point measured
        by the decoders' gap)."""
        return self.kind != "decode" and not (self.kind == "mixed" and self.source == "client")

    @property
    def label(self) -> str:
        if self.kind == "decode":
            return f"decode B={self.decode_seqs} ctx={self.decode_context // self.decode_seqs}"
        c, p = self.chunks[0]
        cached = f" after {p} cached" if p else ""
        if self.kind == "mixed":
            per = self.decode_context // max(1, self.decode_seqs)
            return f"prefill {c}{cached} + decode B={self.decode_seqs} ctx={per}"
        return f"prefill {c}{cached}"


@dataclass(slots=True)
class Prober:
    """Runs probes against ``target`` serving ``model``; ``time_scale`` divides client
    timings (wall seconds per second of a ``sluicegate sim --time-scale`` target)."""

    target: Target
    model: str
    time_scale: float = 1.0
    seed: int = 0
    notes: list[str] = field(default_factory=list)
    outside_ms: list[float] = field(default_factory=list)
    """Per idle prefill: the server's TTFT minus its prefill time (ms) — time outside the
    engine's iterations (API server, queueing, transfer), which the simulator does not model."""
    _rng: random.Random = field(init=False)
    _count: int = field(init=False, default=0)
    _run: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        # The run's nonce: a later run does not hit this run's cached prompts either.
        self._run = random.SystemRandom().randrange(_ID_HIGH - _ID_LOW)

    def prompt(self, tokens: int) -> list[int]:
        """A fresh prompt of exactly ``tokens`` token ids, unlike any other probe's."""
        self._count += 1
        span = _ID_HIGH - _ID_LOW
        head = [_ID_LOW + self._run, _ID_LOW + self._count % span]
        body = [self._rng.randrange(_ID_LOW, _ID_HIGH) for _ in range(max(0, tokens - 2))]
        return (head + body)[:tokens]

    async def _settled(self, before: Scrape | None, name: str, expect: float) -> Scrape | None:
        """A scrape once histogram ``name`` counts ``expect`` more observations than
        ``before`` (None after :data:`SETTLE_S` or without metrics)."""
        if before is None or name not in before.histograms:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        while True:
            after = await self.target.scrape()
            delta = before.delta(after, name) if after is not None else None
            if delta is not None and delta[1] >= expect:
                return after if delta[1] == expect else None
            if loop.time() > deadline:
                return None
            await asyncio.sleep(0.05)

    async def _one_prefill(
        self, prompt: list[int], one_step: bool = True
    ) -> tuple[float, str, int, Stream] | None:
        """(ms, source, cached tokens, stream) of one prefill; None if ``one_step`` and the
        server ran it in more than one iteration."""
        before = await self.target.scrape()
        stream = await self.target.complete(self.model, prompt, 1)
        after = await self._settled(before, PREFILL_TIME, 1)
        cached = stream.cached_tokens
        if before is not None and after is not None:
            hits = before.counter_delta(after, PREFIX_HITS)
            cached = int(hits) if hits is not None else cached
            steps = before.delta(after, ITERATION_TOKENS)
            if one_step and steps is not None and steps[1] > 1:
                self.notes.append(
                    f"prefill of {len(prompt)} tokens ran in {steps[1]:g} iterations: dropped "
                    "(is --max-num-batched-tokens the server's?)"
                )
                return None
            delta = before.delta(after, PREFILL_TIME)
            assert delta is not None
            ttft = before.delta(after, TTFT)
            if one_step and ttft is not None and ttft[1] == 1:
                self.outside_ms.append((ttft[0] - delta[0]) * 1e3)
            return delta[0] * 1e3, "server", cached or 0, stream
        return stream.ttft * 1e3 / self.time_scale, "client", cached or 0, stream

    async def prefill(self, tokens: int, repeats: int) -> Point | None:
        """``tokens`` tokens prefilled on an idle server (median of ``repeats``)."""
        values: list[float] = []
        source = "server"
        for _ in range(repeats):
            got = await self._one_prefill(self.prompt(tokens))
            if got is None:
                return None
            values.append(got[0])
            source = got[1]
            tokens = got[3].prompt_tokens or tokens
        return _point("prefill", tokens, 0, 0, ((tokens, 0),), values, source)

    async def cached_prefill(self, new: int, cached: int, repeats: int) -> Point | None:
        """``new`` tokens prefilled after ``cached`` tokens found in the prefix cache."""
        values: list[float] = []
        source = "server"
        hit = cached
        for _ in range(repeats):
            head = self.prompt(cached)
            await self._one_prefill(head, one_step=False)
            got = await self._one_prefill(head + self.prompt(new))
            if got is None:
                return None
            values.append(got[0])
            source, hit = got[1], got[2]
        if hit <= 0:
            self.notes.append("the server cached no prefix (prefix caching off?): b not probed")
            return None
        total = new + cached
        return _point("cached-prefill", total - hit, 0, 0, ((total - hit, hit),), values, source)

    async def decode(
        self, batch: int, context: int, tokens: int, inject: int = 0, inject_tokens: int = 0
    ) -> list[Point]:
        """``batch`` streams of ``context``-token prompts decoding ``tokens`` tokens each;
        with ``inject`` > 0, that many ``inject_tokens``-token prefills sent while all
        decode (``mixed`` points)."""
        # Only the last TIMED requests stream: B streams would cost the server (and this
        # client) a chunk per sequence per iteration, which slows the very iterations
        # measured. Sent last, they are scheduled last: once they have their first token,
        # the batch decodes.
        timed = min(batch, TIMED)
        whole = [
            asyncio.create_task(
                self.target.complete(self.model, self.prompt(context), tokens, stream=False)
            )
            for _ in range(batch - timed)
        ]
        if whole:
            await asyncio.sleep(0.01)
        started = [asyncio.Event() for _ in range(timed)]
        streams = whole + [
            asyncio.create_task(self.target.complete(self.model, self.prompt(context), tokens, e))
            for e in started
        ]
        mixed: list[tuple[float, str, float]] = []  # (ms, source, first-token time)
        window: tuple[float, float, float, float] | None = None  # (ITL s, count, t0, t1)
        try:
            await _started(started, streams)
            if not inject:
                window = await self._itl_window(streams)
            for _ in range(inject):
                if any(s.done() for s in streams):
                    break
                got = await self._one_prefill(self.prompt(inject_tokens), one_step=False)
                if got is not None:
                    mixed.append((got[0], got[1], got[3].times[0]))
                await asyncio.sleep(0.02)
            results = await asyncio.gather(*streams)
        finally:
            for s in streams:
                s.cancel()
        points = []
        decode = _decode_point(results[batch - timed :], results, batch, self.time_scale)
        if decode is not None and window is not None:
            itl_s, count, t0, t1 = window
            ref = results[-1]
            inside = [n for t, n in zip(ref.times, ref.tokens, strict=True) if t0 <= t <= t1]
            if inside:
                # a token j of a sequence is made by an iteration reading prompt + j − 1
                per_seq = ref.prompt_tokens + round(statistics.median(inside)) - 1
                decode = Point(
                    "decode",
                    batch,
                    batch,
                    batch * per_seq,
                    (),
                    itl_s / count * 1e3,
                    int(count),
                    "server",
                )
        if decode is not None:
            points.append(decode)
        else:
            self.notes.append(f"decode B={batch}: no window with all sequences decoding")
        if mixed:
            ref = results[-1]
            per_seq = ref.prompt_tokens + _median_index(ref, [m[2] for m in mixed])
            values = []
            source = mixed[0][1]
            for ms, src, at in mixed:
                values.append(ms if src == "server" else _gap_at(ref, at) * 1e3 / self.time_scale)
            points.append(
                _point(
                    "mixed",
                    batch + inject_tokens,
                    batch,
                    batch * per_seq,
                    ((inject_tokens, 0),),
                    values,
                    source,
                )
            )
        return points

    async def _itl_window(
        self, streams: list[asyncio.Task[Stream]]
    ) -> tuple[float, float, float, float] | None:
        """The server's inter-token latencies between now (every request decoding) and
        the first request's end: (summed s, count, window start, end in loop time); None
        without the histogram or with fewer than 4 observations."""
        loop = asyncio.get_running_loop()
        before = await self.target.scrape()
        if before is None or ITL not in before.histograms:
            return None
        t0 = loop.time()
        await asyncio.wait(streams, return_when=asyncio.FIRST_COMPLETED)
        t1 = loop.time()
        after = await self.target.scrape()
        delta = before.delta(after, ITL) if after is not None else None
        if delta is None or delta[1] < 4:
            return None
        return delta[0], delta[1], t0, t1


async def _started(events: list[asyncio.Event], tasks: list[asyncio.Task[Stream]]) -> None:
    """Wait until every event is set; a request that failed first raises its error."""
    while not all(e.is_set() for e in events):
        for t in tasks:
            if t.done() and t.exception() is not None:
                await t  # raises the request's error
        await asyncio.sleep(0.005)


def _point(
    kind: str,
    tokens: int,
    seqs: int,
    context: int,
    chunks: tuple[tuple[int, int], ...],
    values: list[float],
    source: str,
) -> Point:
    return Point(
        kind, tokens, seqs, context, chunks, statistics.median(values), len(values), source
    )


def _decode_point(
    streams: list[Stream], ended: list[Stream], batch: int, time_scale: float
) -> Point | None:
    """The pure-decode iteration of a ``batch``: the median per-token gap of ``streams``
    after their last first token and before the first request of ``ended`` finished."""
    start = max(s.times[0] for s in streams)
    end = min(s.times[-1] for s in ended)
    gaps: list[float] = []
    index: list[int] = []
    for s in streams:
        for j in range(1, len(s.times)):
            if s.times[j - 1] >= start and s.times[j] <= end:
                gaps.append((s.times[j] - s.times[j - 1]) / (s.tokens[j] - s.tokens[j - 1]))
                index.append(s.tokens[j])
    if len(gaps) < 4:
        return None
    # The iteration producing token j of a sequence reads a context of prompt + j − 1.
    per_seq = round(statistics.mean(s.prompt_tokens for s in streams)) + round(
        statistics.median(index)
    )
    return Point(
        "decode",
        batch,
        batch,
        batch * (per_seq - 1),
        (),
        statistics.median(gaps) * 1e3 / time_scale,
        len(gaps),
        "client",
    )


def _median_index(stream: Stream, times: list[float]) -> int:
    """Tokens ``stream`` had generated at the median of ``times``."""
    at = statistics.median(times)
    done = [n for t, n in zip(stream.times, stream.tokens, strict=True) if t <= at]
    return done[-1] if done else 0


def _gap_at(stream: Stream, at: float) -> float:
    """The gap between ``stream``'s tokens that ends closest to ``at`` (seconds)."""
    j = min(range(1, len(stream.times)), key=lambda i: abs(stream.times[i] - at))
    return stream.times[j] - stream.times[j - 1]
