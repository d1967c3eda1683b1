"""``hotline report METRICS.jsonl [...] --out run.png``: training runs as one picture."""

from __future__ import annotations

import argparse
import sys

from hotline.cli.args import SubParsers, check_new_output, error


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
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hotline.training.report import write_report

    try:
        check_new_output(args.out, args.force, "--out")
        if not args.out.lower().endswith((".png", ".svg", ".pdf")):
            raise ValueError(f"--out {args.out}: expected a .png, .svg or .pdf file name")
        write_report(args.metrics, args.out)
    except (ValueError, OSError) as e:
        return error("report", e)
    print(
        f"wrote {args.out} ({len(args.metrics)} run{'s' if len(args.metrics) > 1 else ''})", file=sys.stderr
    )
    return 0
