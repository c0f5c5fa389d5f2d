"""Stalled endpoints: requests in flight, and no sign of work for too long.

A hung model server (it accepts requests and never answers; its ``/metrics`` may well still
answer) holds every non-streaming request sent to it for the whole read timeout: their
first byte would come only with the whole answer, so no first-byte timeout can tell a hang
from a long generation. The endpoint as a whole can: a server that works shows
**progress** —

- a byte of some answer relayed from it (``InFlight.last_token_at``: first bytes and
  streamed chunks, of any request), or
- its generated-token counter (``EngineMetrics.generation_tokens``) moving between checks:
  a server decoding any request of its batch, ours or not, counts tokens every iteration,
  so one busy with a long prefill for one request still moves it for the others. Only a
  check that sees a new scrape judges: without one (scrapes failing or slower than their
  timeout, ``/metrics`` frozen) the counter tells nothing and the clock starts afresh;

and the clock of "no progress" runs only while this gateway has requests in flight there
(``InFlight.requests > 0``): it starts when the first of them is seen in flight. An endpoint
is **stalled** when it has shown no progress for ``timeout_s`` that way.

What could look stalled without being so: a single request whose prefill alone lasts longer
than ``timeout_s``, with nothing else running on the server (no token is generated until it
ends). At the default 30 s that is a prompt of hundreds of thousands of tokens on an idle
server, and the same bound already applies to the first token of every streamed request
(``firstByteTimeoutMs``). An engine that reports no token counter (``generation_tokens`` is
None) is never judged: a long non-streaming generation there shows no progress at all.

A stalled endpoint is acted upon only when the host is waiting for its bytes at all
(``OutlierDetector.waiting_on``): a stream held up because its client stopped reading
reads nothing from the server, so it relays nothing either, through no fault of the server.

Pure: the clock time comes from the caller (the outlier detector's tick, O(1) per
endpoint); the state lives in the endpoint's :class:`~sluicegate.datalayer.endpoint.Health`.
"""

from __future__ import annotations

from sluicegate.datalayer.endpoint import Endpoint


def stalled(endpoint: Endpoint, now: float, timeout_s: float) -> bool:
    """Whether ``endpoint`` is stalled at clock time ``now`` (s), after ``timeout_s`` (s)
    without progress while requests were in flight; updates its progress clock
    (``Health.progress_at``). ``timeout_s <= 0``: never."""
    health = endpoint.health
    metrics = endpoint.metrics
    counter = metrics.generation_tokens if metrics is not None else None
    if timeout_s <= 0 or counter is None:
        health.progress_at = None  # cannot tell a long generation from a hang
        return False
    if endpoint.inflight.requests <= 0:
        health.progress_at = None  # nothing to wait for: the clock starts afresh later
        health.progress_counter = counter
        health.progress_scraped_at = metrics.scraped_at if metrics is not None else None
        return False
    assert metrics is not None  # (the counter came from it)
    if metrics.scraped_at == health.progress_scraped_at:
        # No new scrape since the last check (scrapes failing or slow, metrics frozen):
        # the counter tells nothing, so nothing is judged and the clock starts afresh.
        health.progress_at = None
        return False
    health.progress_scraped_at = metrics.scraped_at
    start = health.progress_at
    if start is None or counter != health.progress_counter:
        start = now  # first seen busy, or its counter moved since the last check
    health.progress_counter = counter
    last_token = endpoint.inflight.last_token_at
    if last_token is not None and last_token > start:
        start = last_token
    health.progress_at = start
    return now - start >= timeout_s


def idle_for(endpoint: Endpoint, now: float) -> float:
    """Seconds ``endpoint`` has shown no progress while busy (0 when not tracked)."""
    start = endpoint.health.progress_at
    return 0.0 if start is None else max(0.0, now - start)


__all__ = ["idle_for", "stalled"]
