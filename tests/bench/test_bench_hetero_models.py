"""The per-class / class-feature / pool comparison: on two classes that differ only in
speed, the hardware-blind pool model is the worst on both, and the report renders."""

from __future__ import annotations

from dataclasses import replace

from sluicegate.bench.hetero_models import DESIGNS, Split, compare, render
from sluicegate.bench.latency_speed.synthetic import synthetic_samples
from sluicegate.latency.features import Sample
from sluicegate.latency.model import TrainConfig


def tagged(seed: int, cls: str, factor: float) -> Split:
    """Synthetic rows with noiseless latencies ``factor`` times a known function."""
    items = [
        replace(
            s,
            ttft_ms=factor * (10.0 + 0.05 * s.row.effective_input_tokens),
            tpot_ms=factor * (5.0 + 0.2 * s.row.num_request_running),
            hardware_class=cls,
        )
        for s in synthetic_samples(1500, seed=seed)
    ]
    train: list[Sample] = items[:1000]
    return Split(train, items[1000:])


def test_the_pool_model_is_worst_when_classes_differ_in_speed() -> None:
    splits = {"fast": [tagged(1, "fast", 1.0)], "slow": [tagged(2, "slow", 3.0)]}
    result = compare(splits, TrainConfig(objective="mean", n_estimators=60, learning_rate=0.15))
    for cls in splits:
        for target in ("ttft", "tpot"):
            per_class = result[("per-class", cls, target)]
            pool = result[("pool", cls, target)]
            assert per_class is not None
            assert pool is not None
            assert pool > per_class
    text = render([result], {"fast": (1000, 500), "slow": (1000, 500)}, "cmd", 1.0)
    assert all(f"`{d}` MAPE" in text for d in DESIGNS)
    assert "| slow | 1000 / 500 | TTFT |" in text
