"""``hotline train``: train DLRM on a dataset directory (or the built-in synthetic default)."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train DLRM (on the built-in synthetic default when no dataset is given)",
        description="Train DLRM. Flags keep the reference DLRM's names.",
    )
    p.add_argument("dataset", nargs="?", help="dataset directory (default: the built-in synthetic dataset)")
    p.add_argument(
        "--mode",
        default="device",
        choices=["device", "hybrid", "hotline"],
        help="where embedding rows live (default: device)",
    )
    p.add_argument("--arch-sparse-feature-size", type=int, default=16, help="embedding dim D (default 16)")
    p.add_argument("--arch-mlp-bot", default="13-512-256-64-16", help="bottom MLP sizes")
    p.add_argument("--arch-mlp-top", default="512-256-1", help="top MLP sizes after the interaction")
    p.add_argument("--arch-interaction-op", default="dot", choices=["dot", "cat"])
    p.add_argument("--mini-batch-size", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "rowwise-adagrad"])
    p.add_argument("--nepochs", type=int, default=1)
    p.add_argument("--num-batches", type=int, default=0, help="stop after this many steps (0: all)")
    p.add_argument("--print-freq", type=int, default=256, help="steps between reports")
    p.add_argument("--test-freq", type=int, default=0, help="steps between validations (0: at the end)")
    p.add_argument("--eval-max-samples", type=int, default=0, help="evaluate on at most N samples (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=0, help="torch and numba threads (0: all cores)")
    p.add_argument("--metrics", help="write one JSON record per report to this .jsonl file")
    p.add_argument("--dump-params", help="write every parameter by name to this .npz at the end")
    p.add_argument("--save", help="write a checkpoint here at the end")
    p.add_argument("--load", help="start from this checkpoint")
    p.add_argument("--placement", help="placement .npz for --mode hotline (from `hotline profile`)")
    p.add_argument("--hbm-budget", help="for --mode hotline without --placement: profile first, this budget")
    p.add_argument("--lookahead", type=int, default=2, help="hotline: steps gathered ahead (0: sequential)")
    p.add_argument(
        "--worker-threads", type=int, default=1, help="hotline: numba threads of the look-ahead worker"
    )
    p.add_argument(
        "--micro-batches",
        default="auto",
        choices=["auto", "split", "fused"],
        help="hotline: popular and non-popular passes (split), one pass (fused), or auto: split at "
        "--lookahead 0, fused when the cold rows were gathered ahead",
    )
    p.add_argument("--checkpoint-dir", help="directory for periodic checkpoints (and --resume)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: none)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--nproc",
        type=int,
        default=0,
        help="train on N local ranks (data-parallel, through torch.distributed.run, as torchrun does)",
    )
    p.set_defaults(func=run, train_parser=p)


def run(args: argparse.Namespace) -> int:
    import os

    from hotline.checkpoint import load_checkpoint, save_checkpoint
    from hotline.train import Trainer, configure_threads

    if args.nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from hotline.distributed import run_cli  # N ranks: start them, or be one of them

        return run_cli(args, config_from_args)
    if args.dataset is None:
        from hotline.datasets.synthetic import default_dataset

        dataset = default_dataset()
        print(f"no dataset given: using the built-in synthetic dataset at {dataset}", file=sys.stderr)
    else:
        dataset = args.dataset
    try:
        config = config_from_args(args)  # a bad flag value is a ValueError: one line like the rest
        configure_threads(config.threads)
        trainer = Trainer(config, dataset)
        try:
            if args.load:
                step = load_checkpoint(trainer, args.load)
                print(f"loaded {args.load} (step {step})", file=sys.stderr)
            summary = trainer.fit()
            if args.save:
                save_checkpoint(trainer, args.save)
        finally:
            trainer.close()
    except (ValueError, IndexError, FloatingPointError, OSError) as e:
        # User-caused problems (bad dataset, placement, checkpoint, flags, a diverging loss, a full disk):
        # one clear line, no traceback. DatasetError, PlacementError and CheckpointError are ValueErrors.
        print(f"hotline train: error: {e}", file=sys.stderr)
        return 2 if not isinstance(e, FloatingPointError) else 3
    except KeyboardInterrupt:
        print("hotline train: interrupted", file=sys.stderr)
        return 130
    keys = (
        "mode",
        "steps",
        "samples_per_s",
        "val_auc",
        "val_logloss",
        "val_accuracy",
        "test_auc",
        "test_logloss",
        "test_accuracy",
    )
    print(json.dumps({k: summary[k] for k in keys}))
    return 0


def config_from_args(args: argparse.Namespace):
    """The TrainConfig of parsed ``hotline train`` flags (ValueError naming the flag if one is wrong)."""
    from hotline.model import parse_layers
    from hotline.train import TrainConfig

    hbm_budget = None
    if args.hbm_budget:
        from hotline.units import parse_size

        hbm_budget = parse_size(args.hbm_budget)
    return TrainConfig(
        mode=args.mode,
        embedding_dim=args.arch_sparse_feature_size,
        bottom_mlp=parse_layers(args.arch_mlp_bot, "--arch-mlp-bot"),
        top_mlp=parse_layers(args.arch_mlp_top, "--arch-mlp-top"),
        interaction=args.arch_interaction_op,
        mini_batch_size=args.mini_batch_size,
        learning_rate=args.learning_rate,
        optimizer=args.optimizer,
        nepochs=args.nepochs,
        num_batches=args.num_batches,
        print_freq=args.print_freq,
        test_freq=args.test_freq,
        eval_max_samples=args.eval_max_samples,
        seed=args.seed,
        device=args.device,
        threads=args.threads,
        progress=not args.no_progress,
        metrics_path=args.metrics,
        dump_params_path=args.dump_params,
        placement_path=args.placement,
        hbm_budget=hbm_budget,
        lookahead=args.lookahead,
        worker_threads=args.worker_threads,
        micro_batches=args.micro_batches,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
    )
