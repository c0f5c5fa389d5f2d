"""What the gateway costs: added latency against a simulated pool, and requests/s on a core.

Two measurements, in processes pinned with ``taskset`` so that the router under test has
a core of its own (core 1) and everything else shares the other (core 0):

- added latency (:mod:`~sluicegate.bench.gateway.latency`) — streaming completions
  straight to a ``sluicegate sim`` pool, straight to it while an idle gateway scrapes it
  (the baseline), and through ``sluicegate serve`` with each preset, at 200 and 500
  requests/s from an open-loop Poisson generator; TTFT and end-to-end time per request,
  and the gateway's own ``sluicegate_gateway_overhead_seconds`` histogram;
- requests/s on one core (:mod:`~sluicegate.bench.gateway.throughput`) — ``wrk`` saturating
  each router (sluicegate presets, ``vllm-router`` policies, and no router: the ceiling)
  in front of an nginx mock of four vLLM replicas (:mod:`~sluicegate.bench.gateway.mock`);
  py-spy then samples the saturated gateway to show where its core goes
  (:mod:`~sluicegate.bench.gateway.profile`).

Apart from the report, :mod:`~sluicegate.bench.gateway.server_compare` runs the
throughput measurement with the gateway behind its own HTTP server, granian and uvicorn
(:mod:`~sluicegate.bench.gateway.servers`, the adapters; the libraries are not
dependencies and live in a venv of their own).

The rest: :mod:`~sluicegate.bench.gateway.settings` (pool, cores, request shape,
durations), :mod:`~sluicegate.bench.gateway.routers` (starting the routers compared),
:mod:`~sluicegate.bench.gateway.summary` (runs to table rows),
:mod:`~sluicegate.bench.gateway.sections` and :mod:`~sluicegate.bench.gateway.report`
(the Markdown; :func:`sluicegate.bench.gateway.report.report` is the entry point of
``sluicegate bench micro gateway``).
Process management and load generation shared with other benchmarks are in
:mod:`sluicegate.bench.processes` and :mod:`sluicegate.bench.loadgen`.

``scripts/bench-setup`` installs nginx, wrk, vllm-router and py-spy. Every process is
started with a deadline and stopped in ``finally``; only 127.0.0.1 is used. On a shared
machine, ``SLUICEGATE_BENCH_NICE=-10`` (root) runs every benchmark process, and its
scheduler autogroup, ahead of other work.
"""

__all__: list[str] = []
"""Nothing is re-exported: the modules are the API (the entry point is
:func:`sluicegate.bench.gateway.report.report`)."""
