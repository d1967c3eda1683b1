"""``hotline data criteo|synthetic``: build dataset directories."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from hotline.datasets import criteo, synthetic

    parser = subparsers.add_parser("data", help="build a dataset directory from Criteo files or synthetic data")
    sub = parser.add_subparsers(dest="data_command", metavar="SOURCE")
    sub.required = True
    criteo.add_parser(sub)
    synthetic.add_parser(sub)
