"""Decompressing request bodies as they arrive (``Content-Encoding: gzip`` or ``deflate``),
bounded by the caller's limit on the decompressed size."""

from __future__ import annotations

import zlib

_GZIP_WBITS = 16 + zlib.MAX_WBITS
_CODINGS: dict[str, int | None] = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": None}
"""Content codings decoded: zlib's ``wbits`` for each (None: zlib or raw deflate, told
by the first two bytes)."""


class _Inflater:
    """Decompresses a request body as it arrives, never producing more than asked for."""

    __slots__ = ("_obj", "_start")

    def __init__(self, wbits: int | None) -> None:
        self._obj = None if wbits is None else zlib.decompressobj(wbits)
        self._start = b""
        """The first byte of a ``deflate`` body, until the second tells its format."""

    def feed(self, data: bytes, limit: int) -> bytes | None:
        """The output of ``data``: at most ``limit`` bytes, else None (the rest is not
        decompressed). Raises :class:`zlib.error` for a corrupt stream."""
        obj = self._obj
        if obj is None:
            data = self._start + data
            if len(data) < 2:
                self._start = data
                return b""
            self._start = b""
            # "deflate" is the zlib format (RFC 9110 §8.4.1.2), but some clients send raw
            # deflate: a zlib header is a multiple of 31 with method 8 (RFC 1950 §2.2).
            zlib_format = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            obj = self._obj = zlib.decompressobj(zlib.MAX_WBITS if zlib_format else -zlib.MAX_WBITS)
        if obj.eof:
            if data:
                raise zlib.error("data after the end of the compressed stream")
            return b""
        out = obj.decompress(data, limit + 1)  # one byte more than allowed tells "too large"
        if len(out) > limit:
            return None
        if obj.unused_data:
            raise zlib.error("data after the end of the compressed stream")
        return out

    def finish(self) -> None:
        """Raises :class:`zlib.error` unless the stream ended properly."""
        if self._obj is None or not self._obj.eof:
            raise zlib.error("the compressed stream is truncated")
