"""Booster prediction without the Python wrapper's per-call overhead.

``Booster.inplace_predict`` on a numpy matrix validates its input, builds its arguments and
an array interface, then calls ``XGBoosterPredictFromDense`` without a proxy DMatrix, so
XGBoost makes a new one — whose context reads the cgroup CPU quota files, five file
system calls — for every prediction. On a 10-row matrix and a 200-tree model the wrapper
and that set-up cost more than the trees (≈ 200 µs against ≈ 75 µs).
:func:`dense_predictor` makes the same C call with the arguments built once and a proxy
DMatrix kept per thread, for C-contiguous float32 matrices. It is what ``inplace_predict``
does, so it is thread-safe in the same way (any number of concurrent predictions, each
thread with its own proxy; never while the booster trains).

It relies on ``xgboost.core`` internals: when they are missing, or the fast call disagrees
with ``inplace_predict`` on a probe matrix, it falls back to ``inplace_predict``.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import xgboost as xgb

log = logging.getLogger("sluicegate.latency")

c_bst_ulong = ctypes.c_uint64
"""XGBoost's ``bst_ulong``."""

Predict = Callable[[np.ndarray], np.ndarray]
"""Predictions (float32, one per row) for a float32 feature matrix."""

try:  # pragma: no branch - both outcomes are valid
    from xgboost.core import _LIB, _check_call, _ProxyDMatrix, make_jcargs

    _ARGS: bytes | None = make_jcargs(
        type=0,
        training=False,
        iteration_begin=0,
        iteration_end=0,
        missing=float("nan"),
        strict_shape=False,
        cache_id=0,
    )
    _CALL: Any = _LIB.XGBoosterPredictFromDense
except (ImportError, AttributeError, TypeError):  # pragma: no cover - other xgboost versions
    _ARGS = None
    _CALL = None

_local = threading.local()


def _thread_proxy() -> Any:
    """This thread's proxy DMatrix handle (the input holder XGBoost fills per call)."""
    proxy = getattr(_local, "proxy", None)
    if proxy is None:
        proxy = _local.proxy = _ProxyDMatrix()
    return proxy.handle


def _wrapper_predict(booster: xgb.Booster) -> Predict:
    def predict(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = booster.inplace_predict(x, validate_features=False)
        return out.astype(np.float32, copy=False)

    return predict


def _fast_predict(booster: xgb.Booster) -> Predict:
    handle = booster.handle
    args = _ARGS
    call = _CALL
    proxy = _thread_proxy
    c_float_p = ctypes.POINTER(ctypes.c_float)
    shape_p = ctypes.POINTER(c_bst_ulong)
    byref = ctypes.byref
    memmove = ctypes.memmove
    interface = (
        '{{"data": [{}, true], "shape": [{}, {}], "strides": null, "typestr": "<f4", "version": 3}}'
    ).format
    fallback = _wrapper_predict(booster)

    def predict(x: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        if x.dtype != np.float32 or not x.flags.c_contiguous or x.ndim != 2 or n == 0:
            return fallback(x)
        preds = c_float_p()
        shape = shape_p()
        dims = c_bst_ulong()
        array = interface(x.__array_interface__["data"][0], n, x.shape[1]).encode()
        _check_call(call(handle, array, args, proxy(), byref(shape), byref(dims), byref(preds)))
        if dims.value != 1 or shape[0] != n:
            return fallback(x)
        out = np.empty(n, dtype=np.float32)
        # The result lives in the booster's per-thread buffer: copy it before anything else.
        memmove(out.ctypes.data, preds, 4 * n)
        return out

    return predict


def dense_predictor(booster: xgb.Booster, probe: np.ndarray | None = None) -> Predict:
    """The fastest correct way to predict with ``booster`` (fast path checked on
    ``probe``, a float32 matrix with the model's number of columns)."""
    if _CALL is None or _ARGS is None:
        return _wrapper_predict(booster)
    fast = _fast_predict(booster)
    if probe is None:
        probe = np.zeros((2, booster.num_features()), dtype=np.float32)
    probe = np.ascontiguousarray(probe, dtype=np.float32)
    try:
        same = np.array_equal(fast(probe), _wrapper_predict(booster)(probe))
    except Exception as exc:  # an incompatible xgboost build
        log.warning("fast XGBoost prediction unavailable (%s); using inplace_predict", exc)
        return _wrapper_predict(booster)
    if not same:  # pragma: no cover - would mean an incompatible xgboost build
        log.warning("fast XGBoost prediction disagrees with inplace_predict; not using it")
        return _wrapper_predict(booster)
    return fast
