"""``hotline data criteo|synthetic``: build dataset directories."""

from __future__ import annotations

import argparse
import importlib


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data", help="build a dataset directory from Criteo files or synthetic data"
    )
    sub = parser.add_subparsers(dest="data_command", metavar="SOURCE")
    sub.required = True
    for name in ("hotline.datasets.criteo", "hotline.datasets.synthetic"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(sub)
