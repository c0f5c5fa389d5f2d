"""``sluicegate predictor …``: the latency predictor's servers and offline training.

- ``train-server`` — :mod:`sluicegate.latency.trainserver`;
- ``predict-server`` — :mod:`sluicegate.latency.predictserver`;
- ``train --trace FILE --out DIR`` — train from a recorded trace
  (:mod:`sluicegate.latency.trace`) through the same stratified window as online training
  (so a long trace keeps the latest 500 samples per bucket) and save the bundle.

Heavy imports happen in the handlers, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sluicegate.cli.common import Subparsers, console, fail, run

if TYPE_CHECKING:
    from sluicegate.latency.model import TrainConfig


def add_parser(sub: Subparsers) -> None:
    """Add the ``predictor`` command group to the top-level subparsers."""
    predictor = sub.add_parser(
        "predictor",
        help="latency predictor servers and offline training",
        description="TTFT/TPOT latency models: the training and prediction servers, and "
        "training from a recorded trace.",
    )
    group = predictor.add_subparsers(dest="predictor_command", metavar="COMMAND", required=True)

    train_server = group.add_parser(
        "train-server",
        help="collect samples, retrain periodically, serve models",
        description="Receive samples (POST /add_training_data_bulk), retrain every "
        "interval, serve /predict and the model files to prediction servers.",
    )
    train_server.add_argument("--host", default="127.0.0.1")
    train_server.add_argument("--port", type=int, default=8000)
    train_server.add_argument(
        "--model-dir",
        default=None,
        metavar="DIR",
        help="where models are saved (and loaded from at start); default: a temporary one",
    )
    train_server.add_argument(
        "--retrain-interval", type=float, default=10.0, metavar="S", help="seconds (default 10)"
    )
    train_server.add_argument(
        "--min-samples", type=int, default=100, help="samples before training (default 100)"
    )
    _model_options(train_server)
    train_server.set_defaults(func=_cmd_train_server)

    predict_server = group.add_parser(
        "predict-server",
        help="serve predictions from a training server's models",
        description="Serve /predict, /predict/bulk and /predict/bulk/strict with the models "
        "of a training server, synced every interval.",
    )
    predict_server.add_argument("--host", default="127.0.0.1")
    predict_server.add_argument("--port", type=int, default=8001)
    predict_server.add_argument(
        "--training-server", required=True, metavar="URL", help="e.g. http://127.0.0.1:8000"
    )
    predict_server.add_argument(
        "--sync-interval", type=float, default=10.0, metavar="S", help="seconds (default 10)"
    )
    predict_server.add_argument(
        "--model-dir", default=None, metavar="DIR", help="local model copy (default: temporary)"
    )
    predict_server.set_defaults(func=_cmd_predict_server)

    train = group.add_parser(
        "train",
        help="train models from a recorded trace",
        description="Train TTFT/TPOT models from a JSON Lines trace of samples (one per "
        "line: the FeatureRow fields plus ttft_ms/tpot_ms) and save them to a directory "
        "that a gateway or prediction server can load.",
    )
    train.add_argument("--trace", required=True, metavar="FILE")
    train.add_argument("--out", required=True, metavar="DIR")
    train.add_argument(
        "--min-samples", type=int, default=1, help="TTFT samples required (default 1)"
    )
    _model_options(train)
    train.set_defaults(func=_cmd_train)


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--objective", choices=["quantile", "mean"], default="quantile")
    parser.add_argument("--alpha", type=float, default=0.9, help="quantile predicted (default 0.9)")
    parser.add_argument(
        "--n-estimators", type=int, default=200, help="trees per model (default 200)"
    )
    parser.add_argument(
        "--train-threads", type=int, default=1, help="XGBoost training threads (default 1)"
    )


def _train_config(args: argparse.Namespace) -> TrainConfig:
    from sluicegate.latency.model import TrainConfig

    return TrainConfig(
        objective=args.objective,
        alpha=args.alpha,
        n_estimators=args.n_estimators,
        nthread=args.train_threads,
    )


def _cmd_train_server(args: argparse.Namespace) -> int:
    from sluicegate.latency.trainserver import TrainServerOptions, serve_training

    try:
        config = _train_config(args)
        if args.retrain_interval <= 0:
            raise ValueError("--retrain-interval must be positive")
        if args.min_samples < 1:
            raise ValueError("--min-samples must be at least 1")
    except ValueError as exc:
        return fail(str(exc))
    options = TrainServerOptions(
        retrain_interval_s=args.retrain_interval,
        min_samples=args.min_samples,
        train=config,
        model_dir=args.model_dir,
    )
    try:
        run(serve_training(options, args.host, args.port))
    except OSError as exc:
        return fail(f"cannot serve on {args.host}:{args.port}: {exc}", status=1)
    return 0


def _cmd_predict_server(args: argparse.Namespace) -> int:
    from sluicegate.latency.predictserver import PredictServerOptions, serve_prediction

    if args.sync_interval <= 0:
        return fail("--sync-interval must be positive")
    if not args.training_server.startswith(("http://", "https://")):
        return fail(f"--training-server must be an http(s) URL, got {args.training_server!r}")
    options = PredictServerOptions(
        training_server=args.training_server,
        sync_interval_s=args.sync_interval,
        model_dir=args.model_dir,
    )
    try:
        run(serve_prediction(options, args.host, args.port))
    except OSError as exc:
        return fail(f"cannot serve on {args.host}:{args.port}: {exc}", status=1)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from sluicegate.latency.model import TrainingData, train_bundle
    from sluicegate.latency.store import SampleStore
    from sluicegate.latency.trace import TraceError, load_trace

    try:
        config = _train_config(args)
    except ValueError as exc:
        return fail(str(exc))
    store = SampleStore()
    try:
        read = load_trace(args.trace, store)
    except (OSError, TraceError) as exc:
        return fail(str(exc))
    bundle = train_bundle(
        TrainingData.snapshot(store), config, 0.0, 1, min_samples=max(1, args.min_samples)
    )
    if bundle is None:
        return fail(
            f"{args.trace}: {store.ttft.train_count} TTFT training samples "
            f"(of {read} read), {max(1, args.min_samples)} needed",
            status=1,
        )
    try:
        bundle.save(args.out)
    except OSError as exc:
        return fail(f"cannot write {args.out}: {exc}", status=1)
    for name, model in (("TTFT", bundle.ttft), ("TPOT", bundle.tpot)):
        if model is None:
            console.print(f"{name}: no samples, no model")
            continue
        console.print(
            f"{name}: {model.samples} training samples, {model.test_samples} held out, "
            f"MAPE {_pct(model.mape)}, coverage {_pct(model.coverage)}"
        )
    console.print(f"read {read} samples ({store.rejected} refused); wrote {args.out}")
    return 0


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
