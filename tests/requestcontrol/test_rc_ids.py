"""Generated request ids: unique, well-formed, and not a visible count."""

from __future__ import annotations

import os
import re

from sluicegate.requestcontrol.ids import new_request_id


def test_ids_are_unique_hex_and_do_not_count_up_visibly() -> None:
    ids = [new_request_id() for _ in range(50_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    tails = [int(i[16:], 16) for i in ids[:100]]
    assert tails != sorted(tails)  # consecutive requests are not ordered by their ids


def test_a_forked_child_draws_its_own_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert child[:16] != new_request_id()[:16]


def test_a_client_id_is_kept_only_when_clean() -> None:
    from sluicegate.requestcontrol.ids import MAX_REQUEST_ID_LENGTH, request_id_from

    for good in ("req-123", "a", "x" * MAX_REQUEST_ID_LENGTH, "trace=1; span 2/3"):
        assert request_id_from(good) == good
    for unusable in (
        None,
        "",
        "x" * (MAX_REQUEST_ID_LENGTH + 1),
        "caf\udcc3",  # a byte that is not UTF-8, as the server decodes it
        "\udcff",
        "naïve",  # not ASCII
        "line\nbreak",
        "tab\t",
        "del\x7f",
    ):
        replaced = request_id_from(unusable)
        assert re.fullmatch(r"[0-9a-f]{32}", replaced), unusable
