"""Fitting the simulator's step-time function to measured iterations.

The profile's step time (:meth:`EngineProfile.step_ms`) is linear in its unknowns once
the model's shape (layers, hidden size, KV bytes per token) is fixed::

    measured = LIN(n)                                piecewise linear: one value per knot
            + o · [runs to a first token]            o: first-token latency beyond the step
            + f · [decode_seqs > 0]                  f = layers · attention_fixed_ms_per_layer
            + g · sequences                          g = step_ms_per_seq (decoding + prefilling)
            + a · Σctx_decode                        a = layers · kv_bytes_per_layer / BW · 1e3
            + b · Σ c·(p + c/2)                      b = 4 · hidden · layers / FLOPS · 1e3

(the step time is the sum without ``o``) with ``LIN``'s knots at the distinct token
counts measured (so ``LIN`` is exact there and interpolated between, as the built-in
profiles interpolate vidur's table) and the
per-step overhead inside ``LIN`` (``step_overhead_ms`` 0). The fit minimises the sum of
squared *relative* errors (rows weighted by 1/measured), so short and long iterations
count alike. A term the points cannot tell apart from the others (no decode point next
to a prefill point of the same size for ``f``; decodes at fewer than two batch sizes for
``g`` — one sequence per prefill is a constant ``LIN`` absorbs; no cached-prefix point for
``b``; one context per batch size for ``a``) or that comes out negative is fixed at 0 and
the rest refitted; so is a knot of ``LIN`` that comes out below 0 (a step time must be a
duration, and a profile file refuses negative points).

``o`` is why a server's prefill time (or a client's time to first token) of ``n``
tokens exceeds a decode iteration of ``n`` sequences on a tiny model: the first token of a
request costs more than its iteration (whatever the server does around it: waking an idle
engine, handing the token to its API server), while token-to-token gaps (inter-token
latency) do not carry it. Decode points next to prefill points of the same size and a
mixed point tell it from ``f``; it is not engine time, so it goes into the profile's
per-request overhead: ``request_overhead_ms`` = ``o`` + the server's TTFT minus its
prefill time on an idle server (passed in as measured).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from sluicegate.sim.calibrate.probes import Point
from sluicegate.sim.profiles import EngineProfile, LinearOpsCurve

_TERMS = ("f", "g", "a", "b", "o")
_TINY = 1e-12
"""A coefficient at or below this (ms per unit) counts as zero: BW or FLOPS 'infinite'."""


@dataclass(frozen=True, slots=True)
class Fit:
    profile: EngineProfile
    knots: tuple[float, ...]
    lin_ms: tuple[float, ...]
    o_ms: float
    f_ms: float
    g_ms_per_seq: float
    a_ms_per_token: float
    b_ms_per_unit: float
    fixed: tuple[str, ...]
    """Terms fixed at 0 (not identifiable from the points, or fitted negative)."""

    def predict_ms(self, point: Point) -> float:
        """What the fit says was measured at ``point``: its step time, plus ``o`` if the
        measurement runs to a first token."""
        return predict(self.profile, point) + (self.o_ms if point.first_token else 0.0)


def attention_units(chunks: tuple[tuple[int, int], ...]) -> float:
    """Σ c·(p + c/2) over prefill chunks (the profile's prefill FLOPs / (4·hidden·layers))."""
    return sum(c * (p + c / 2.0) for c, p in chunks)


def predict(profile: EngineProfile, point: Point) -> float:
    """The profile's duration (ms) of the iteration ``point`` describes."""
    flops = sum(profile.prefill_attention_flops(c, p) for c, p in point.chunks)
    return profile.step_ms(
        point.batched_tokens,
        point.decode_seqs,
        point.decode_context,
        flops,
        prefill_seqs=len(point.chunks),
    )


def _hat(knots: list[float], n: float) -> npt.NDArray[np.float64]:
    """Weights of ``n`` on the knots under LinearOpsCurve's interpolation."""
    w = np.zeros(len(knots))
    if n <= knots[0]:
        w[0] = 1.0
        return w
    if n >= knots[-1]:
        w[-1] = 1.0
        return w
    i = int(np.searchsorted(knots, n))
    x0, x1 = knots[i - 1], knots[i]
    w[i - 1], w[i] = (x1 - n) / (x1 - x0), (n - x0) / (x1 - x0)
    return w


def _solve(
    design: npt.NDArray[np.float64], target: npt.NDArray[np.float64], k: int, names: list[str]
) -> tuple[npt.NDArray[np.float64], list[str]]:
    """Least squares with the extra terms (columns k…) dropped while unidentifiable or
    negative, then LIN's knots (columns …k−1) fixed at 0 while one comes out negative;
    returns all coefficients (dropped ones 0) and the dropped terms' names."""
    active = list(range(design.shape[1]))
    dropped: list[str] = []
    while True:
        if not active:
            return np.zeros(design.shape[1]), dropped
        sub = design[:, active]
        coef, *_ = np.linalg.lstsq(sub, target, rcond=None)
        rank = np.linalg.matrix_rank(sub)
        extra = [j for j in active if j >= k]
        bad: int | None = None
        if rank < len(active) and extra:
            # the last extra term whose column the others already span (o, b, a, g, then f):
            # o first, so a first-token latency is only fitted when the points show it
            bad = next((j for j in reversed(extra) if _rank(design, active, j) == rank), extra[-1])
        else:
            negative = [j for j, c in zip(active, coef, strict=True) if j >= k and c < 0]
            below = [(c, j) for j, c in zip(active, coef, strict=True) if j < k and c < 0]
            # A knot below 0 (noise on a server whose step is mostly per-sequence and
            # first-token cost) would make step times negative and the written profile
            # unloadable: the most negative one is fixed at 0 (LIN is 0 there) and the rest
            # refitted, as a non-negative least squares would.
            bad = negative[0] if negative else min(below)[1] if below else None
        if bad is None:
            full = np.zeros(design.shape[1])
            full[active] = coef
            return full, dropped
        active.remove(bad)
        if bad >= k:
            dropped.append(names[bad - k])


def _rank(design: npt.NDArray[np.float64], active: list[int], without: int) -> int:
    return int(np.linalg.matrix_rank(design[:, [j for j in active if j != without]]))


def fit_profile(points: list[Point], base: EngineProfile, request_overhead_ms: float = 0.0) -> Fit:
    """The profile ``base`` with its step-time parameters fitted to ``points`` and the
    per-request overhead ``request_overhead_ms`` (measured, not fitted)."""
    if not points:
        raise ValueError("no measured point to fit")
    knots = sorted({float(p.batched_tokens) for p in points})
    k = len(knots)
    rows = []
    for p in points:
        rows.append(
            np.concatenate(
                [
                    _hat(knots, p.batched_tokens),
                    [
                        1.0 if p.decode_seqs else 0.0,
                        float(p.decode_seqs + len(p.chunks)),
                        float(p.decode_context),
                        attention_units(p.chunks),
                        1.0 if p.first_token else 0.0,
                    ],
                ]
            )
        )
    design = np.array(rows)
    measured = np.array([p.measured_ms for p in points])
    weight = 1.0 / np.maximum(measured, 1e-6)
    n_terms = len(_TERMS)
    present = [j for j in range(k, k + n_terms) if np.any(design[:, j] != 0)]
    unused = [_TERMS[j - k] for j in range(k, k + n_terms) if j not in present]
    cols = list(range(k)) + present
    names = [_TERMS[j - k] for j in present]
    coef_sub, dropped = _solve(design[:, cols] * weight[:, None], measured * weight, k, names)
    coef = np.zeros(k + n_terms)
    coef[cols] = coef_sub
    f, g, a, b, o = (float(coef[k + i]) for i in range(n_terms))
    lin = tuple(float(v) for v in coef[:k])
    slope = max(0.0, (lin[-1] - lin[-2]) / (knots[-1] - knots[-2])) if k >= 2 else 0.0
    layers = base.num_layers
    profile = replace(
        base,
        linear_ops=LinearOpsCurve(tuple(knots), lin, lin[-1] - slope * knots[-1], slope),
        step_overhead_ms=0.0,
        step_ms_per_seq=g,
        request_overhead_ms=request_overhead_ms + o,
        attention_fixed_ms_per_layer=f / layers,
        memory_bandwidth_bytes_per_s=(
            layers * base.kv_bytes_per_token_per_layer * 1e3 / a if a > _TINY else 1e30
        ),
        attention_flops_per_s=4.0 * base.hidden_size * layers * 1e3 / b if b > _TINY else 1e30,
    )
    fixed = tuple(t for t in _TERMS if t in unused or t in dropped)
    return Fit(profile, tuple(knots), lin, o, f, g, a, b, fixed)
