"""``hotline report METRICS.jsonl [...] --out run.png``: training runs as one picture."""

from __future__ import annotations

import argparse
import sys

from hotline.cli.args import SubParsers, add_force, error


def add_parser(subparsers: SubParsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="plot training runs from their --metrics files (loss, AUC, phases, hit rate, overlap)",
        description="Draw loss and validation AUC against step, the hit rate / popular-sample share / overlap "
        "over time, and each run's time per step split by phase, for one or several `hotline train --metrics` "
        "files side by side (e.g. hybrid vs hotline).",
    )
    p.add_argument("metrics", nargs="+", metavar="METRICS.jsonl", help="--metrics files of `hotline train`")
    p.add_argument("--out", required=True, metavar="FILE.png", help="image to write (.png, .svg or .pdf)")
    add_force(p)
    p.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output

    return [Output("--out", args.out)], [("METRICS.jsonl", m) for m in args.metrics]


def run(args: argparse.Namespace) -> int:
    from hotline.training.report import write_report

    try:
        write_report(args.metrics, args.out, force=True)  # claimed; the name given sets the format
    except (ValueError, OSError) as e:
        return error("report", e)
    print(
        f"wrote {args.out} ({len(args.metrics)} run{'s' if len(args.metrics) > 1 else ''})", file=sys.stderr
    )
    return 0
