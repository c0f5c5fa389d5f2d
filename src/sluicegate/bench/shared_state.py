"""What shared state costs a decision: ``python -m sluicegate.bench.shared_state --redis-url URL``.

Three numbers, in µs per operation (median of ``--repeats`` runs), for the choice in
``docs/replicas.md``:

- ``local``: one approximate prefix match plus the record after the decision
  (:class:`~sluicegate.scheduling.approximate.ApproximatePrefix`), without sharing;
- ``shared``: the same with a :class:`~sluicegate.datalayer.sharing.PrefixShare` attached
  (the write-behind: one outbox append per decision) — the difference is what the request
  path pays;
- ``round_trip``: one Redis call from the asyncio client (a ``ZRANGE``-sized read of the
  blocks a prompt has), what a synchronous read-on-lookup design would add per decision,
  and ``sync``: one in-flight sync (the script every replica runs every ``inflightSyncMs``,
  off the request path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable

from sluicegate.api.settings import SharedStateSettings
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.datalayer.sharing import PrefixShare
from sluicegate.framework import LLMRequest
from sluicegate.runtime.shared import SharedState
from sluicegate.scheduling.approximate import ApproximatePrefix


def _requests(n: int, prompt_tokens: int) -> list[LLMRequest]:
    # 16 conversations sharing system prompts: realistic hits, and every decision records.
    system = [f"system prompt {g}: " + "x" * (prompt_tokens * 4) for g in range(16)]
    return [
        LLMRequest(
            request_id=str(i),
            model="m",
            target_model="m",
            prompt=(system[i % 16] + f" turn {i}").encode(),
            prompt_tokens=prompt_tokens,
            arrival=0.0,
        )
        for i in range(n)
    ]


def _decisions(
    matcher: ApproximatePrefix,
    reqs: list[LLMRequest],
    eps: list[Endpoint],
    share: PrefixShare | None = None,
) -> float:
    start = time.perf_counter()
    for i, req in enumerate(reqs):
        match = matcher.match(req, eps)
        matcher.remember(eps[i % len(eps)], match)
        if share is not None and i % 64 == 63:
            share.take(64)  # as the writer does every prefixFlushMs (encoding not counted)
    return (time.perf_counter() - start) / len(reqs) * 1e6


def _median(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


async def _redis(url: str, n: int, datastore: Datastore) -> tuple[float, float]:
    spec = SharedStateSettings.model_validate({"redis": {"url": url, "timeoutMs": 1000}})
    state = SharedState(spec, datastore)
    client = state.client
    await client.ping()
    start = time.perf_counter()
    for _ in range(n):
        await client.zrange("sluicegate-bench:absent", 0, 24)
    trip = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for _ in range(n):
        await state.sync_inflight()
    sync = (time.perf_counter() - start) / n * 1e6
    await state.stop()
    return trip, sync


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--prompt-tokens", type=int, default=1600)
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ds = Datastore()
    ds.set_endpoints(
        "pool",
        [EndpointSpec(f"e{i}", "127.0.0.1", 9000 + i) for i in range(args.endpoints)],
    )
    eps = ds.all_endpoints()
    for e in eps:
        e.inflight.dispatch(100, 100)
    reqs = _requests(args.decisions, args.prompt_tokens)

    def local() -> float:
        return _decisions(ApproximatePrefix(64, 131_072, 31_250, False), reqs, eps)

    def shared() -> float:
        matcher = ApproximatePrefix(64, 131_072, 31_250, False)
        share = PrefixShare(lambda name: True, max_outbox=args.decisions)
        matcher.share(share, "approx/64")
        return _decisions(matcher, reqs, eps, share)

    out = {
        "decisions": args.decisions,
        "prompt_tokens": args.prompt_tokens,
        "endpoints": args.endpoints,
        "local_us": round(_median(args.repeats, local), 2),
        "shared_us": round(_median(args.repeats, shared), 2),
    }
    trip, sync = asyncio.run(_redis(args.redis_url, min(args.decisions, 2000), ds))
    out["round_trip_us"] = round(trip, 1)
    out["sync_us"] = round(sync, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
