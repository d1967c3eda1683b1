"""``hotline calibrate --out host.json``: time this host's dispatch, gather, scatter, sparse update, memory copy
and dense compute, and write the hardware description the cost model reads."""

from __future__ import annotations

import argparse
import sys

from hotline.cli.args import SubParsers, add_force, add_output, add_seed, add_threads, error
from hotline.cli.effects import check_flag_effects


def _penalty(step: dict, name: str) -> str:
    """A priced overlap penalty, with what was measured where that differs (a gain within the noise)."""
    priced = step[f"{name}_penalty"]
    got = step.get("penalties_measured", {}).get(name)
    if not got or got["pooled"] == priced:
        return f"{priced:.2f}"
    se = "" if got["se"] is None else f" +- {got['se']:.2f}"
    return f"{priced:.2f} (measured {got['pooled']:.2f}{se}: a gain within the noise is priced as none)"


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="time this host (dispatch, gather, scatter, sparse update, memory copy, dense compute) for the cost model",
        description="Time Hotline's own code paths on this host (well under a minute) and write a hardware "
        "description (JSON) that `hotline profile --predict --hardware FILE` and the cost model read. The CPU "
        "is its own device; for a GPU, pass its name (H100, H200) with --host FILE instead. Run it on an idle "
        "machine: timings taken under load are not the host's figures.",
    )
    add_output(parser, "--out", "write the hardware description here", required=True)
    parser.add_argument("--disk", metavar="DIR", help="also measure the disk store's disk in DIR: random 4 KiB "
                        "reads/s at depth 1 and --disk-depth, page writes/s, sequential write rate (O_DIRECT), and a step's reads "
                        "and write-backs as the store issues them (fixed + per page; how they overlap)")  # fmt: skip
    parser.add_argument("--disk-depth", type=int, default=32, metavar="N", help="the disk store's I/O depth")
    parser.add_argument("--disk-record-bytes", type=int, default=256, metavar="B",
                        help="the run's record on disk, a row and its optimizer state (table_layout.bytes_per_row: "
                        "dim 64 with SGD is 256): the step-shaped reads and write-backs the cost model prices "
                        "use it")  # fmt: skip
    parser.add_argument("--disk-only", action="store_true",
                        help="measure only the disk (--disk), adding it to --out if that is a hardware description")  # fmt: skip
    add_threads(parser, "torch and numba threads the runs will use")
    add_seed(parser, "the timed inputs")
    add_force(parser)
    parser.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output

    # --disk-only adds the disk's figures to an existing hardware description: it continues that file.
    return [
        Output("--out", args.out, continues="document" if args.disk_only else None),
        Output("--disk", args.disk, kind="dir"),
    ], []


def _document(out) -> dict:
    """The hardware description ``--disk-only`` adds its disk section to: ``out``'s when it is one (a JSON
    object with a Hotline format tag), else a new one (a file of another kind is there only with --force,
    which replaces it: said on stderr)."""
    import json

    if not out.exists():
        return {"format": "hotline-hardware"}
    try:
        hw = json.loads(out.read_text())
    except (OSError, ValueError):
        hw = None
    if isinstance(hw, dict) and str(hw.get("format", "")).startswith("hotline-"):
        return hw
    print(
        f"hotline calibrate: {out} is not a Hotline hardware description: --force replaces it",
        file=sys.stderr,
    )
    return {"format": "hotline-hardware"}


def run(args: argparse.Namespace) -> int:
    from hotline._io import write_json
    from hotline.costmodel.calibrate import calibrate

    if args.disk_only and not args.disk:
        return error("calibrate", "--disk-only needs --disk DIR")
    check_flag_effects(args, "calibrate")  # --disk-depth and --disk-record-bytes without --disk
    if args.disk_depth < 1:
        return error("calibrate", f"--disk-depth must be >= 1, got {args.disk_depth}")
    if args.disk_record_bytes < 4 or args.disk_record_bytes % 4:
        return error(
            "calibrate", f"--disk-record-bytes must be a positive multiple of 4, got {args.disk_record_bytes}"
        )
    out = args.claim.path("--out")
    try:
        if args.disk_only:
            hw = _document(out)
        else:
            hw = calibrate(
                args.threads or None, args.seed, progress=lambda s: print(f"timing {s}", file=sys.stderr)
            )
        if args.disk:
            from hotline.costmodel.disk_calibrate import calibrate_disk

            print(f"timing the disk in {args.disk}", file=sys.stderr)
            hw["disk"] = calibrate_disk(
                args.disk, args.disk_depth, seed=args.seed, record_bytes=args.disk_record_bytes
            )
        write_json(out, hw)
    except (OSError, ValueError) as e:
        return error("calibrate", e)
    if "disk" in hw:
        from hotline.costmodel.disk_overlap import beside_penalties

        k = hw["disk"]
        print(
            f"disk ({k['io_mode']}): random 4 KiB reads {k['read_iops']['1']:,.0f}/s at depth 1, "
            f"{k['read_iops']['depth']:,.0f}/s at depth {k['depth']}; page writes {k['write_iops']:,.0f}/s; "
            f"sequential writes {k['seq_write_mbps']:,.0f} MB/s"
        )
        t = k["step"]
        print(
            f"a step's I/O ({t['record_bytes']}-byte records): reads {t['read']['fixed_us'] / 1e3:,.2f} ms + "
            f"{t['read']['us_per_call']:,.1f} us/request + {t['read']['us_per_page']:,.1f} us/page, write-backs "
            f"{t['write']['fixed_us'] / 1e3:,.2f} ms + {t['write']['us_per_call']:,.1f} us/request + "
            f"{t['write']['us_per_page']:,.1f} us/page; overlap penalty of reads beside write-backs "
            f"{_penalty(t, 'read_write')}, of the I/O beside compute {beside_penalties(t, _penalty)}"
        )
        if "held" in t:  # held writes (--cold-write-buffer): the put, and the sweep that writes them in order
            put, sweep = t["held"]["put"], t["held"]["sweep"]
            print(
                f"held writes: put {put['fixed_us'] / 1e3:,.2f} ms + {put['us_per_row']:,.2f} us/row; sweep "
                f"{sweep['us_per_span'] / 1e3:,.2f} ms/span + {sweep['mbps']:,.0f} MB/s of the file (read and written)"
            )
    if args.disk_only:
        print(f"written to {args.out}")
        return 0
    h, d = hw["host"], hw["device"]
    print(
        f"{hw['name']} in {hw['calibration_s']:.0f} s: dispatch {h['dispatch_ns_per_lookup']['n']:.1f} ns/lookup, "
        f"gather {h['gather_gbps']['n']:.1f} GB/s, scatter {h['scatter_gbps']['n']:.1f} GB/s, memcpy "
        f"{h['memcpy_gbps']:.1f} GB/s, dense {d['dense_gflops']:.0f} GFLOP/s (fit error up to "
        f"{d['dense_fit_max_rel_error']:.0%})\nwritten to {args.out}"
    )
    return 0
