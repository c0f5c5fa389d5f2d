"""Several classes' boosters as one, so a mixed request costs one booster call per target.

Most of a small booster call is fixed cost (63 of 90 µs for 10 rows and 200 trees,
``docs/benchmarks/latency.md``), so predicting a request whose candidates span two
hardware classes with each class's model would double it. :func:`merge_boosters` builds
one booster whose tree ``i`` is the classes' trees ``i`` under a chain of splits on one
more column, the class code ``k`` (0..K−1): ``code < 0.5`` → class 0's tree, else
``code < 1.5`` → class 1's, and so on. The merged model's base score is class 0's; the
difference of every other class's base score is added to the leaves of its first tree, so
each code predicts what its own model predicts (to float32 rounding; checked on a probe
matrix, else no merged model is used).

It reads and writes XGBoost's JSON model format (``Booster.save_raw("json")``): trees as
arrays of nodes, a leaf's value in ``split_conditions``. A model it does not recognise
(another booster type, vector leaves, categorical splits, different tree counts) is not
merged: callers keep one call per class.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import xgboost as xgb

from sluicegate.latency.features import FEATURE_NAMES
from sluicegate.latency.model import ModelBundle
from sluicegate.latency.predictor import Predictions
from sluicegate.latency.xgbfast import Predict, dense_predictor

log = logging.getLogger("sluicegate.latency")

_NO_PARENT = 2147483647


def _base_score(learner: dict[str, Any]) -> float:
    raw = str(learner["learner_model_param"]["base_score"]).strip("[]")
    return float(raw.split(",")[0])


def _shifted(tree: dict[str, Any], offset: int, delta: float) -> dict[str, list[Any]]:
    """``tree``'s node arrays with node ids moved by ``offset`` and ``delta`` added to
    its leaves."""
    left = tree["left_children"]
    out: dict[str, list[Any]] = {
        "left_children": [c + offset if c >= 0 else -1 for c in left],
        "right_children": [c + offset if c >= 0 else -1 for c in tree["right_children"]],
        "parents": [p + offset if p != _NO_PARENT else _NO_PARENT for p in tree["parents"]],
        "split_conditions": [
            v + delta if c < 0 else v for v, c in zip(tree["split_conditions"], left, strict=True)
        ],
    }
    for name in (
        "split_indices",
        "split_type",
        "default_left",
        "base_weights",
        "loss_changes",
        "sum_hessian",
    ):
        out[name] = list(tree[name])
    return out


def _merge_trees(
    trees: Sequence[dict[str, Any]], deltas: Sequence[float], column: int
) -> dict[str, Any]:
    k = len(trees)
    # Chain nodes 0..k-2 split on the class column; then each class's tree in turn.
    nodes: dict[str, list[Any]] = {
        name: []
        for name in (
            "left_children",
            "right_children",
            "parents",
            "split_conditions",
            "split_indices",
            "split_type",
            "default_left",
            "base_weights",
            "loss_changes",
            "sum_hessian",
        )
    }
    starts = []
    offset = k - 1
    for tree in trees:
        starts.append(offset)
        offset += len(tree["left_children"])
    for j in range(k - 1):
        nodes["left_children"].append(starts[j])
        nodes["right_children"].append(j + 1 if j + 1 < k - 1 else starts[k - 1])
        nodes["parents"].append(_NO_PARENT if j == 0 else j - 1)
        nodes["split_conditions"].append(j + 0.5)
        nodes["split_indices"].append(column)
        nodes["split_type"].append(0)
        nodes["default_left"].append(0)
        nodes["base_weights"].append(0.0)
        nodes["loss_changes"].append(0.0)
        nodes["sum_hessian"].append(0.0)
    for j, (tree, delta) in enumerate(zip(trees, deltas, strict=True)):
        part = _shifted(tree, starts[j], delta)
        part["parents"][0] = j if j < k - 1 else k - 2  # the root hangs under its chain node
        for name, values in part.items():
            nodes[name].extend(values)
    total = len(nodes["left_children"])
    return {
        **nodes,
        "categories": [],
        "categories_nodes": [],
        "categories_segments": [],
        "categories_sizes": [],
        "id": 0,
        "tree_param": {
            "num_deleted": "0",
            "num_feature": str(column + 1),
            "num_nodes": str(total),
            "size_leaf_vector": "1",
        },
    }


def merge_boosters(boosters: Sequence[xgb.Booster], features: int) -> xgb.Booster | None:
    """One booster over ``features + 1`` columns (the last: class code ``k`` for
    ``boosters[k]``), or None when these boosters cannot be merged (logged at DEBUG)."""
    if len(boosters) < 2:
        return None
    try:
        models = [orjson.loads(bytes(b.save_raw("json"))) for b in boosters]
        learners = [m["learner"] for m in models]
        gbs = [learner["gradient_booster"] for learner in learners]
        if any(gb["name"] != "gbtree" for gb in gbs):
            return None
        tree_lists = [gb["model"]["trees"] for gb in gbs]
        if len({len(t) for t in tree_lists}) != 1 or any(
            tree["categories_nodes"] or tree["tree_param"]["size_leaf_vector"] not in ("0", "1")
            for trees in tree_lists
            for tree in trees
        ):
            return None
        bases = [_base_score(learner) for learner in learners]
        merged_trees = []
        for i, group in enumerate(zip(*tree_lists, strict=True)):
            deltas = [b - bases[0] if i == 0 else 0.0 for b in bases]
            tree = _merge_trees(group, deltas, features)
            tree["id"] = i
            merged_trees.append(tree)
        out = models[0]
        learner = out["learner"]
        learner["feature_names"] = []
        learner["feature_types"] = []
        learner["learner_model_param"]["num_feature"] = str(features + 1)
        model = learner["gradient_booster"]["model"]
        model["trees"] = merged_trees
        booster = xgb.Booster()
        booster.load_model(bytearray(orjson.dumps(out)))
        booster.set_param({"nthread": 1})
    except (KeyError, TypeError, ValueError, xgb.core.XGBoostError) as exc:
        log.debug("latency models not merged: %s", exc)
        return None
    return booster if _agrees(booster, boosters, features) else None


def _agrees(merged: xgb.Booster, boosters: Sequence[xgb.Booster], features: int) -> bool:
    rng = np.random.default_rng(0)
    probe = rng.random((64, features), dtype=np.float32) * 1000.0
    for code, booster in enumerate(boosters):
        coded = np.hstack([probe, np.full((64, 1), code, np.float32)])
        want = booster.inplace_predict(probe, validate_features=False)
        got = merged.inplace_predict(coded, validate_features=False)
        if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
            log.debug("merged latency model disagrees with class %d's; not used", code)
            return False
    return True


@dataclass(frozen=True, slots=True)
class MergedModels:
    """The classes' TTFT and TPOT boosters merged (:func:`merge_bundles`)."""

    codes: dict[str | None, int]
    """Class → its code in the last column."""
    ttft: Predict
    tpot: Predict
    ttft_scale: tuple[float, ...]
    """Per code: the class model's calibration factor (``TargetModel.scale``)."""
    tpot_scale: tuple[float, ...]

    def coding(
        self, borrowed: Mapping[str | None, tuple[str | None, float, float]]
    ) -> dict[str | None, tuple[float, float, float]]:
        """(code, TTFT factor, TPOT factor) of every class these models predict: those
        merged, and those ``borrowed`` maps to (donor, TTFT ratio, TPOT ratio)."""
        out = {
            cls: (float(code), self.ttft_scale[code], self.tpot_scale[code])
            for cls, code in self.codes.items()
        }
        for cls, (donor, ttft_ratio, tpot_ratio) in borrowed.items():
            code = self.codes.get(donor)
            if code is not None:
                out[cls] = (
                    float(code),
                    self.ttft_scale[code] * ttft_ratio,
                    self.tpot_scale[code] * tpot_ratio,
                )
        return out

    def predict(self, x: np.ndarray, coded: Sequence[tuple[float, float, float]]) -> Predictions:
        """TTFT/TPOT (ms) of feature matrix ``x`` whose row ``i`` is of the class coded
        ``coded[i]`` (see :meth:`coding`): one booster call per target."""
        info = np.array(coded, dtype=np.float32)
        with_code = np.empty((len(x), x.shape[1] + 1), dtype=np.float32)
        with_code[:, :-1] = x
        with_code[:, -1] = info[:, 0]
        ttft = self.ttft(with_code) * info[:, 1]
        tpot = self.tpot(with_code) * info[:, 2]
        return Predictions(np.maximum(ttft, 0.0, out=ttft), np.maximum(tpot, 0.0, out=tpot))


def merge_bundles(bundles: Mapping[str | None, ModelBundle]) -> MergedModels | None:
    """Merged models of two or more classes' bundles; None when fewer, when one has no
    TPOT model, or when the boosters cannot be merged. Takes ~0.1 s for 200-tree models:
    run it off the event loop."""
    if len(bundles) < 2:
        return None
    tpots = [b.tpot for b in bundles.values()]
    if any(t is None for t in tpots):
        return None
    width = len(FEATURE_NAMES)
    ttft = merge_boosters([b.ttft.booster for b in bundles.values()], width)
    tpot = merge_boosters([t.booster for t in tpots if t is not None], width)
    if ttft is None or tpot is None:
        return None
    probe = np.zeros((2, width + 1), dtype=np.float32)
    return MergedModels(
        {cls: code for code, cls in enumerate(bundles)},
        dense_predictor(ttft, probe),
        dense_predictor(tpot, probe),
        tuple(b.ttft.scale for b in bundles.values()),
        tuple(t.scale for t in tpots if t is not None),
    )
