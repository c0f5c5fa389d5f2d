"""How fast the latency predictor answers (``sluicegate bench micro latency``).

Models of production size (200 trees of depth ≤ 6, p90 objective) are trained on
synthetic samples shaped like a busy pool (:mod:`~sluicegate.bench.latency_speed.synthetic`),
then measured three ways:

- in-process (:mod:`~sluicegate.bench.latency_speed.in_process`) —
  ``InProcessPredictor.predict`` for 10 and 100 candidate endpoints per call, one call at
  a time on one pinned core; throughput per CPU-second of the calling thread, latency per
  call in wall time;
- one prediction-server process (:mod:`~sluicegate.bench.latency_speed.server`) —
  ``sluicegate predictor predict-server`` on its own core under ``wrk``; requests per
  CPU-second the server used;
- through ``RemotePredictor`` (:mod:`~sluicegate.bench.latency_speed.server`) — many
  concurrent callers in this process against one server: calls/s, the HTTP requests
  coalescing made of them, and per-call latency.

:mod:`~sluicegate.bench.latency_speed.report` runs them and writes the Markdown
(:func:`sluicegate.bench.latency_speed.report.report` is the entry point). It lives under
``bench/`` rather than ``latency/`` because it starts servers and drives wrk through
:mod:`sluicegate.bench.processes` and :mod:`sluicegate.bench.loadgen`; ``latency/`` may
import only ``api`` and ``datalayer``.

Nothing here asserts; the report says which goals are met.
"""

__all__: list[str] = []
"""Nothing is re-exported: the modules are the API (the entry point is
:func:`sluicegate.bench.latency_speed.report.report`)."""
