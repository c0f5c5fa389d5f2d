"""ResponseStats: usage from every answer shape the gateway relays."""

from __future__ import annotations

import orjson

from sluicegate.requestcontrol.responses import ResponseStats


def event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def test_a_responses_stream_reports_usage_in_response_completed() -> None:
    usage = {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3}
    stream = b"".join(
        [
            event("response.created", response={"id": "r", "usage": None}),
            *(event("response.output_text.delta", delta=d) for d in ("a", "b", "c")),
            event("response.completed", response={"id": "r", "usage": usage}),
        ]
    )
    stats = ResponseStats()
    for i in range(0, len(stream), 7):  # events split across chunks anywhere
        stats.observe_stream_chunk(stream[i : i + 7])
    stats.end_stream()
    assert (stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens) == (11, 3, 4)
    assert stats.usage().output_tokens == 3
    assert stats.chunks == 3  # the text deltas, should the server report no usage


def test_a_responses_stream_without_usage_counts_its_deltas() -> None:
    stats = ResponseStats()
    stats.observe_stream_chunk(
        b"".join(event("response.output_text.delta", delta="x") for _ in range(4))
    )
    stats.observe_stream_chunk(event("response.completed", response={"id": "r"}))
    stats.end_stream()
    assert stats.usage().output_tokens == 4


def test_whole_answers_of_other_routes() -> None:
    responses = ResponseStats()
    responses.observe_json({"object": "response", "usage": {"input_tokens": 5, "output_tokens": 2}})
    assert (responses.prompt_tokens, responses.completion_tokens) == (5, 2)
    embeddings = ResponseStats()
    embeddings.observe_json({"object": "list", "usage": {"prompt_tokens": 9, "total_tokens": 9}})
    assert (embeddings.prompt_tokens, embeddings.completion_tokens) == (9, None)
    assert embeddings.usage().output_tokens == 0
    tokenize = ResponseStats()
    tokenize.observe_json({"count": 2, "tokens": [1, 2]})
    assert tokenize.prompt_tokens is None


def test_usage_fields_that_are_not_counts_are_ignored() -> None:
    # A server's junk must not become a negative TPOT or a True-token histogram sample.
    stats = ResponseStats()
    stats.observe_json(
        {
            "usage": {
                "prompt_tokens": True,
                "completion_tokens": -3,
                "prompt_tokens_details": {"cached_tokens": 1.5},
            }
        }
    )
    assert (stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens) == (None, None, None)
