"""Recorded samples: JSON Lines, one sample per line.

Each line is a JSON object with the :class:`~sluicegate.latency.features.FeatureRow`
fields by name and the observed times in ms, ``ttft_ms`` and ``tpot_ms`` (left out when
not observed)::

    {"kv_cache_percentage": 0.42, "input_token_length": 1830, "num_request_waiting": 2,
     "num_request_running": 17, "prefill_tokens_in_flight": 4096,
     "decode_tokens_in_flight": 3100, "prefix_cache_score": 0.75,
     "dispatched_since_scrape": 1, "expected_output_tokens": 256,
     "ttft_ms": 183.2, "tpot_ms": 11.9}

(one line in the file), plus ``"hardware_class": "h100-80gb"`` when the sample was filed
under a hardware class (a hardware-aware producer). Readers accept what
:func:`~sluicegate.latency.wire.sample_from_json` accepts (the reference's
``actual_ttft_ms``/``actual_tpot_ms`` too; unknown keys ignored; blank lines skipped).
``sluicegate predictor train --trace FILE --out DIR`` trains one model from such a file,
and ``sluicegate serve|extproc --latency-trace FILE`` trains the in-process models from
one at start, each hardware class's from its own lines; both fill a sample store with
:func:`load_trace`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol

import orjson

from sluicegate.latency.features import Sample
from sluicegate.latency.wire import FieldError, sample_from_json, sample_to_json


class TraceError(ValueError):
    """A trace line that is not a valid sample (the message names file, line and field)."""


class TraceWriter:
    """Appends samples to a JSON Lines file (buffered; :meth:`flush` or close to write).

    Writes are plain buffered file writes: cheap enough to call from the event loop for
    each completed request, while the OS absorbs the I/O.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] | None = open(self.path, "ab" if append else "wb")  # noqa: SIM115
        self.written = 0

    def write(self, sample: Sample) -> None:
        """Append one sample (ignored after :meth:`close`)."""
        if self._file is None:
            return
        self._file.write(orjson.dumps(sample_to_json(sample)) + b"\n")
        self.written += 1

    def write_all(self, samples: Iterable[Sample]) -> None:
        for sample in samples:
            self.write(sample)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SampleSink(Protocol):
    def add(self, sample: Sample) -> bool:
        """File ``sample``; False when refused."""
        ...


def load_trace(path: str | os.PathLike[str], store: SampleSink) -> int:
    """Add every sample of the trace at ``path`` to ``store`` (e.g. a
    :class:`~sluicegate.latency.store.SampleStore`, whose stratified window keeps the
    latest samples per bucket); returns how many were read. Raises OSError or
    :class:`TraceError`."""
    read = 0
    for sample in read_trace(path):
        store.add(sample)
        read += 1
    return read


def read_trace(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """The samples of a trace file, in order. Raises :class:`TraceError` at the first bad
    line (``FILE:LINE: field: problem``)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield sample_from_json(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise TraceError(f"{path}:{number}: not JSON: {exc}") from None
            except FieldError as exc:
                raise TraceError(f"{path}:{number}: {exc}") from None
