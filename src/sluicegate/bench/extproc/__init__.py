"""What the Envoy endpoint picker costs (``sluicegate bench micro extproc``).

Two measurements, with real processes on 127.0.0.1 (started and stopped by a
:class:`~sluicegate.bench.processes.Processes`):

- decisions per second on one core (:mod:`~sluicegate.bench.extproc.decisions`) —
  ``sluicegate extproc`` pinned to core 0 in front of 10 simulated replicas, driven by a
  gRPC client in this process that keeps N ext_proc streams in flight, each a whole
  request as Envoy sends it; plus the same load against a do-nothing servicer, the cost of
  grpc.aio itself;
- added latency through a real Envoy (:mod:`~sluicegate.bench.extproc.envoy_latency`) —
  one Envoy with two listeners in front of the same replicas, one through the picker and
  one to a plain round-robin cluster, timed request by request, alternating.

:mod:`~sluicegate.bench.extproc.fleet` starts what is measured (the simulated replicas
and the picker) and builds the request bodies both measurements send;
:mod:`~sluicegate.bench.extproc.report` runs both and writes the Markdown
(:func:`sluicegate.bench.extproc.report.report` is the entry point).

Nothing here asserts anything about time; numbers depend on the machine and its load.
"""

__all__: list[str] = []
"""Nothing is re-exported: the modules are the API (the entry point is
:func:`sluicegate.bench.extproc.report.report`)."""
