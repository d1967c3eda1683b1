"""``hotline predict DATASET --load CKPT --out FILE``: per-sample click probability and label of a split."""

from __future__ import annotations

import argparse
import sys

from hotline.cli.args import SubParsers, add_force, error
from hotline.cli.evaluate import add_scoring, scoring_trainer


def add_parser(subparsers: SubParsers) -> None:
    p = subparsers.add_parser(
        "predict",
        help="write a checkpoint's per-sample probabilities and labels (Parquet or .npy)",
        description="Score every sample of a split with a checkpoint and write row, probability and label per "
        "sample: Parquet for FILE.parquet, a structured numpy array for FILE.npy.",
    )
    add_scoring(p, "test")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.parquet or FILE.npy to write")
    add_force(p)
    p.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output

    outs = [Output("--out", args.out), Output("--scratch", args.scratch, kind="dir")]
    return outs, [("DATASET", args.dataset), ("--load", args.load)]


def run(args: argparse.Namespace) -> int:
    from hotline.training.inference import write_predictions

    try:
        if not args.out.lower().endswith((".parquet", ".npy")):
            raise ValueError(f"--out {args.out}: expected a .parquet or .npy file name")
        trainer = scoring_trainer(args)
        try:
            probs, labels = trainer.predict(trainer.dataset.split(args.split), args.eval_max_samples)
        finally:
            trainer.close()
        write_predictions(args.claim.path("--out"), probs, labels, force=True)  # claimed
    except (ValueError, OSError, IndexError) as e:
        return error("predict", e)
    print(f"wrote {args.out}: {len(probs):,} predictions of split '{args.split}'", file=sys.stderr)
    return 0
