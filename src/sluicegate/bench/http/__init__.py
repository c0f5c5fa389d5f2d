"""HTTP mode of the benchmark lab: a scenario replayed against real processes.

For every (policy, load level) a fresh pool is started, on 127.0.0.1 only, on ports found
free at start:

- ``sluicegate sim``: one process running the scenario's N replicas on consecutive ports,
  with the scenario's engine profile (a built-in profile by name, with
  ``--num-gpu-blocks-override`` / ``--max-loras`` for those changes; any other profile, a
  calibrated one included, as a ``--profile-file`` written to the temporary folder), its
  model as ``--served-model-name``, ``--lora`` for each of its adapters, the run's seed,
  and ``--time-scale S``;
- in front of it ``sluicegate serve --config <generated YAML> --policy <policy>`` (pool
  ``sim-pool`` listing the replicas, the scenario's ``extra_docs`` and a ``GatewayConfig``),
  or, for the peer policies (``vllm-router-*``), ``vllm-router`` from ``.venv-bench/``
  (``scripts/bench-setup``) over the same replicas;
- the workload is replayed by an asyncio load generator in this process (uvloop, aiohttp,
  one connection per request in flight) that streams every answer.

**Time scaling.** ``S`` is wall seconds per simulated second (0.25 = four times faster than
real time), the simulator's own ``--time-scale``. A request due at simulated time ``t`` is
sent at wall time ``t0 + t·S``; every instant the client observes (send, each streamed
token, end of stream) is converted back to simulated seconds as ``(wall − t0) / S``. So
all numbers in the results are simulated seconds, comparable with DES mode. What does not
scale (the gateway's processing, loopback networking, the client's parsing, Python's
scheduling noise: 1-3 ms of wall time per request) appears multiplied by ``1/S``; so does
the simulator's own step lateness (its driver carries each engine step's timer lateness,
up to ~1 ms of wall time, into the engine's clock). The smaller ``S``, the faster the run
and the larger those biases. Unless ``--time-scale`` says otherwise, the smallest ``S`` ≥ 1
is picked at which the plan's output token rate (from a DES run) stays within what this
machine streams faithfully; heavy scenarios run slower than real time.

The parts, in the order a run uses them:

- :mod:`~sluicegate.bench.http.plan` — what can run and how: the policies HTTP mode runs
  for a scenario, the time scale, the simulator's options for the engine profile, and the
  gateway configuration (scrape interval and staleness kept equal to DES mode's in
  simulated time);
- :mod:`~sluicegate.bench.http.pool` — the processes of one run: the simulator and the
  router under test, each in its own process group, and the engines' own counters read
  from their ``/metrics`` at the end;
- :mod:`~sluicegate.bench.http.client` — the load generator: sends the workload on
  schedule, follows up on answers (multi-turn chats) and records per request the TTFT,
  every streamed token's arrival (inter-token latencies) and the end-to-end latency;
- :mod:`~sluicegate.bench.http.results` — a run's records and counters as a
  ``results.json`` entry, with the warnings that make its latencies doubtful;
- :mod:`~sluicegate.bench.http.run` — one (policy, level) from start to stop
  (:func:`~sluicegate.bench.http.run.run_level_http`) and a whole plan
  (:func:`~sluicegate.bench.http.run.run_plan_http`, behind ``sluicegate bench run
  --mode http``).

Process management shared with other benchmarks is in :mod:`sluicegate.bench.processes`,
Prometheus histogram reading in :mod:`sluicegate.bench.loadgen`.
"""

__all__: list[str] = []
"""Nothing is re-exported: the modules are the API (the entry point is
:func:`sluicegate.bench.http.run.run_plan_http`)."""
