"""``hotline calibrate --out host.json``: time this host's dispatch, gather, scatter, sparse update, memory copy
and dense compute, and write the hardware description the cost model reads."""

from __future__ import annotations

import argparse
import sys

from hotline.cli.args import SubParsers, add_force, add_output, add_seed, add_threads, error


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="time this host (dispatch, gather, scatter, sparse update, memory copy, dense compute) for the cost model",
        description="Time Hotline's own code paths on this host (well under a minute) and write a hardware "
        "description (JSON) that `hotline profile --predict --hardware FILE` and the cost model read. The CPU "
        "is its own device; for a GPU, pass its name (H100, H200) with --host FILE instead. Run it on an idle "
        "machine: timings taken under load are not the host's figures.",
    )
    add_output(parser, "--out", "write the hardware description here (required)", required=True)
    add_threads(parser, "torch and numba threads the runs will use")
    add_seed(parser, "the timed inputs")
    add_force(parser)
    parser.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output

    return [Output("--out", args.out)], []


def run(args: argparse.Namespace) -> int:
    from hotline._io import write_json
    from hotline.profiling.calibrate import calibrate

    try:
        hw = calibrate(
            args.threads or None, args.seed, progress=lambda s: print(f"timing {s}", file=sys.stderr)
        )
        write_json(args.claim.path("--out"), hw)
    except (OSError, ValueError) as e:
        return error("calibrate", e)
    h, d = hw["host"], hw["device"]
    print(
        f"{hw['name']} in {hw['calibration_s']:.0f} s: dispatch {h['dispatch_ns_per_lookup']['n']:.1f} ns/lookup, "
        f"gather {h['gather_gbps']['n']:.1f} GB/s, scatter {h['scatter_gbps']['n']:.1f} GB/s, memcpy "
        f"{h['memcpy_gbps']:.1f} GB/s, dense {d['dense_gflops']:.0f} GFLOP/s (fit error up to "
        f"{d['dense_fit_max_rel_error']:.0%})\nwritten to {args.out}"
    )
    return 0
