"""``hotline data criteo|synthetic``: build dataset directories."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from hotline.cli.args import SubParsers, add_force, add_progress, add_seed, error, flags


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "data", help="build a dataset directory from Criteo files or synthetic data"
    )
    sub = parser.add_subparsers(dest="data_command", metavar="SOURCE")
    sub.required = True
    _add_criteo(sub)
    _add_synthetic(sub)


def _add_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="dataset directory to write (new or empty; an existing Hotline dataset only with --force)",
    )
    add_force(parser, "--overwrite")  # --overwrite: its name before every command took --force


def _declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output

    outputs = [Output("--out", args.out, kind="dataset"), Output("--raw-tsv", getattr(args, "raw_tsv", None))]
    day_files = [("--day-files", getattr(args, "day_files", None))]
    return outputs, [*(("RAW", raw) for raw in getattr(args, "raw", None) or []), *day_files]


def _build(command: str, errors: tuple, make):
    """Runs ``make()`` (which writes a dataset and returns its path): ``(Dataset, seconds)``, or the exit
    status 2 after one error line for the ``errors`` a user can cause (OSError: unreadable input, a full or
    unwritable output)."""
    from hotline.datasets.format import Dataset
    from hotline.training.logs import note_first_compile

    kernels = (
        ("hotline.kernels.criteo_parse",) if command == "data criteo" else ("hotline.kernels.synthetic",)
    )
    note_first_compile(kernels, terminal_only=True)
    t0 = time.perf_counter()
    previous = signal.signal(
        signal.SIGTERM, _terminated
    )  # a SIGTERM unwinds: the writer removes its temp dir
    try:
        path = make()
    except errors as e:
        return error(command, e)
    finally:
        signal.signal(signal.SIGTERM, previous)
    seconds = time.perf_counter() - t0
    return Dataset(path), seconds


def _terminated(signum, frame) -> None:
    """SIGTERM while a dataset is written: unwind like Ctrl-C (the temporary directory goes), exit 143."""
    print("hotline data: terminated", file=sys.stderr)
    raise SystemExit(128 + signum)


def _rate(rows: int, seconds: float) -> str:
    return f"{rows:,} rows in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} rows/s)"


# -- criteo -----------------------------------------------------------------------------------------------
def _add_criteo(sub: SubParsers) -> None:
    from hotline.datasets.criteo_raw import LAYOUTS, ON_BAD_LINE

    parser = sub.add_parser(
        "criteo",
        help="preprocess raw Criteo Kaggle / Terabyte files into a dataset directory",
        description=(
            "Preprocess raw Criteo files (Kaggle train.txt or Terabyte day_0 .. day_23, plain or .gz) like "
            "the reference DLRM: log(x+1) dense features, categories mapped to contiguous ids per table."
        ),
    )
    parser.add_argument("raw", nargs="*", metavar="RAW", help="raw Criteo files (train.txt, or day_N files)")
    _add_out(parser)
    days = parser.add_argument_group(
        "Criteo 1TB day files (torchrec / MLPerf preprocessed form, instead of RAW)"
    )
    days.add_argument("--day-files", default=None, metavar="DIR",
                      help="read day_N_dense.npy, day_N_labels.npy and day_N_sparse.npy (or the multi-hot "
                           "day_N_sparse_multi_hot.npz) memory-mapped; days 0..D-2 train, day D-1 split val/test")  # fmt: skip
    days.add_argument("--table-sizes", type=_int_list, default=None, metavar="N1,N2,...",
                      help="rows per table, ids taken modulo them (default: MLPerf's 26, 40M at most)")  # fmt: skip
    days.add_argument("--max-rows-per-table", type=int, default=None, metavar="N",
                      help="cap every table at N rows (ids modulo the capped size)")  # fmt: skip
    days.add_argument("--multi-hot", choices=("auto", "yes", "no"), default="auto",
                      help="read the .npz multi-hot bags (auto: when day_0 has them)")  # fmt: skip
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="kaggle: 7 equal days, last split into test/val; terabyte: last file split; "
        "auto: kaggle for one file, terabyte for several (default)",
    )
    parser.add_argument(
        "--max-ind-range",
        type=int,
        default=None,
        metavar="N",
        help="take raw category values modulo N before mapping (as dlrm)",
    )
    parser.add_argument(
        "--min-count",
        type=int,
        default=1,
        metavar="T",
        help="values seen fewer than T times share id 0; frequent ones get 1..K (default 1: off)",
    )
    parser.add_argument(
        "--on-bad-line",
        choices=ON_BAD_LINE,
        default="error",
        help="error (default): stop at the first bad line; skip: drop bad lines and count them",
    )
    add_progress(parser)
    parser.set_defaults(func=_run_criteo, declare=_declare)


def _run_criteo(args: argparse.Namespace) -> int:
    """Runs ``hotline data criteo`` and prints a summary; returns the exit status."""
    from hotline.cli.effects import check_flag_effects
    from hotline.datasets.criteo import CriteoFormatError, preprocess

    try:  # the day-file flags with raw files, and the raw files' flags with days
        check_flag_effects(args, "data criteo")
    except ValueError as e:
        return error("data criteo", e)
    if args.day_files is not None:
        return _run_criteo_days(args)
    if not args.raw:
        return error("data criteo", "give raw Criteo files (RAW ...) or --day-files DIR")

    if args.max_ind_range is not None and not 1 <= args.max_ind_range < 2**63:
        return error("data criteo", f"--max-ind-range must be in [1, 2**63) (raw category values are taken "
                                    f"modulo it), got {args.max_ind_range}")  # fmt: skip
    if args.min_count < 1:
        return error("data criteo", f"--min-count must be >= 1, got {args.min_count}")

    built = _build("data criteo", (CriteoFormatError, OSError, ValueError), lambda: preprocess(
        args.raw, args.claim.path("--out"), **flags(args, "layout", "max_ind_range", "min_count", "on_bad_line"),
        overwrite=args.force, progress=not args.no_progress))  # fmt: skip
    if isinstance(built, int):
        return built
    ds, seconds = built
    out = args.out  # as given (the dataset is written at its link target, if it is one)
    rows = sum(len(ds.split(s)) for s in ("train", "val", "test"))
    print(f"wrote {out} ({ds.meta['source']['layout']} layout)")
    print(f"  rows: train {len(ds.train):,}  val {len(ds.val):,}  test {len(ds.test):,}")
    print(f"  table sizes: {ds.table_sizes}  (total {ds.total_rows:,} rows)")
    bad = ds.meta.get("bad_lines", {})
    print("  bad lines skipped: " + (", ".join(f"{k} {v:,}" for k, v in bad.items()) if bad else "none"))
    print(f"  {_rate(rows, seconds)}")
    return 0


def _run_criteo_days(args: argparse.Namespace) -> int:
    """``hotline data criteo --day-files DIR``: the torchrec / MLPerf day files, not tokenised again."""
    from hotline.datasets.criteo_days import DayFileError, convert_days
    from hotline.datasets.mlperf import MLPERF_TABLE_SIZES

    if args.raw:
        return error("data criteo", "give either raw Criteo files or --day-files, not both")
    sizes = list(args.table_sizes or MLPERF_TABLE_SIZES)
    if args.max_rows_per_table is not None:
        if not 1 <= args.max_rows_per_table < 2**31:
            return error(
                "data criteo", f"--max-rows-per-table must be in [1, 2**31), got {args.max_rows_per_table}"
            )
        sizes = [min(s, args.max_rows_per_table) for s in sizes]
    built = _build("data criteo", (DayFileError, OSError, ValueError), lambda: convert_days(
        args.day_files, args.claim.path("--out"), sizes, multi_hot=args.multi_hot, overwrite=args.force,
        progress=not args.no_progress))  # fmt: skip
    if isinstance(built, int):
        return built
    ds, seconds = built
    print(f"wrote {args.out} ({ds.meta['source']['days']} day files, "
          f"{'multi-hot' if ds.meta['source']['multi_hot'] else 'one-hot'})")  # fmt: skip
    print(f"  rows: train {len(ds.train):,}  val {len(ds.val):,}  test {len(ds.test):,}")
    print(f"  bag sizes: {ds.bag_sizes}  table sizes: {ds.table_sizes}")
    print(f"  {_rate(len(ds.train) + len(ds.val) + len(ds.test), seconds)}")
    return 0


# -- synthetic --------------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _zipf_arg(text: str) -> float | list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or comma-separated numbers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected a number or comma-separated numbers, got nothing")
    return values[0] if len(values) == 1 and "," not in text else values


def _add_synthetic(sub: SubParsers) -> None:
    from hotline.datasets.synthetic import DEFAULT_ZIPF

    p = sub.add_parser(
        "synthetic",
        help="generate Criteo-like skewed data with labels from a planted model",
        description="Generate Criteo-like data: Zipf-skewed ids per table, 13 dense counts, labels from a "
        "planted model whose validation AUC is recorded in meta.json. Deterministic for a seed.",
    )
    _add_out(p)
    p.add_argument(
        "--rows",
        type=int,
        required=True,
        metavar="N",
        help="total rows N (Criteo Kaggle layout: train 6/7, then test and val 1/14 each)",
    )
    add_seed(p, "the data and the planted model")
    p.add_argument("--table-sizes", type=_int_list, default=None, metavar="N1,N2,...",
                   help="rows per table (default: the 26 Criteo Kaggle cardinalities)")  # fmt: skip
    p.add_argument("--max-rows-per-table", type=int, default=None, metavar="N",
                   help="cap every table at N rows (as dlrm's --max-ind-range)")  # fmt: skip
    p.add_argument(
        "--zipf",
        type=_zipf_arg,
        default=DEFAULT_ZIPF,
        metavar="S[,S2,...]",
        help=f"Zipf exponent of every table, or a comma list with one per table (default {DEFAULT_ZIPF})",
    )
    p.add_argument("--pooling-factor", type=int, default=1, metavar="L",
                   help="ids per bag, as dlrm's --num-indices-per-lookup (default 1: one-hot)")  # fmt: skip
    p.add_argument("--preset", choices=("mlperf-dcnv2",), default=None,
                   help="MLPerf DLRM-DCNv2's shape: its 26 table sizes (capped by --max-rows-per-table) and "
                        "multi-hot bag sizes (214 ids per sample); --table-sizes / --bag-sizes override")  # fmt: skip
    p.add_argument("--bag-sizes", type=_int_list, default=None, metavar="L1,L2,...",
                   help="ids per bag of each table (multi-hot of per-table sizes)")  # fmt: skip
    p.add_argument("--variable-bags", action="store_true",
                   help="each bag holds a uniform 1..L_t of its L_t ids (per sample and table), padded with -1")  # fmt: skip
    p.add_argument("--drift-days", type=int, default=1, metavar="D",
                   help="cut the rows into D days; each day moves popular ranks to new rows (1: no drift)")  # fmt: skip
    p.add_argument("--drift-rate", type=float, default=0.0, metavar="R",
                   help="share of each table's most popular ranks (its top 1 percent) that move to cold rows every day")  # fmt: skip
    p.add_argument("--raw-tsv", default=None, metavar="FILE",
                   help="also write the rows as raw Criteo text: label, 13 ints, 26 hex (one-hot)")  # fmt: skip
    add_progress(p)
    p.set_defaults(func=_run_synthetic, declare=_declare)


def _run_synthetic(args: argparse.Namespace) -> int:
    """Runs ``hotline data synthetic`` and prints a short summary; returns the exit status."""
    from hotline.datasets.format import SPLITS
    from hotline.datasets.synthetic import generate

    if args.max_rows_per_table is not None and not 1 <= args.max_rows_per_table < 2**31:
        return error(
            "data synthetic", f"--max-rows-per-table must be in [1, 2**31), got {args.max_rows_per_table}"
        )
    if not 0 <= args.seed < 2**32:
        return error("data synthetic", f"--seed must be in [0, 2**32), got {args.seed}")
    if args.rows < 1:  # a dataset of no rows was written, exit 0, for train to refuse later
        return error(
            "data synthetic", f"--rows must be >= 1 (a dataset needs rows to train on), got {args.rows}"
        )
    if args.preset is not None:
        from hotline.datasets.mlperf import MLPERF_BAG_SIZES, MLPERF_TABLE_SIZES

        args.table_sizes = args.table_sizes or list(MLPERF_TABLE_SIZES)
        args.bag_sizes = args.bag_sizes or list(MLPERF_BAG_SIZES)
    names = ("seed", "table_sizes", "max_rows_per_table", "zipf", "pooling_factor", "drift_days", "drift_rate",
             "bag_sizes", "variable_bags")  # fmt: skip
    built = _build("data synthetic", (ValueError, OSError), lambda: generate(
        args.claim.path("--out"), args.rows, **flags(args, *names), raw_tsv=args.claim.path("--raw-tsv"),
        overwrite=args.force, progress=not args.no_progress))  # fmt: skip
    if isinstance(built, int):
        return built
    ds, seconds = built
    path = args.out  # as given
    info = ds.meta["synthetic"]
    splits = ", ".join(f"{name} {len(ds.split(name)):,}" for name in SPLITS)
    bags = (
        f"pooling factor {ds.pooling_factor}"
        if ds.uniform
        else (
            f"bag sizes {ds.bag_sizes} ({ds.lookups_per_sample} per sample{', variable, padded' if ds.padded else ''})"
        )
    )
    print(f"wrote {path}: {splits} rows; {ds.num_tables} tables, {ds.total_rows:,} embedding rows, {bags}")
    print(
        f"click rate {info['click_rate']:.3f}; planted-model val AUC {info['planted_val_auc']} (the ceiling)"
    )
    print(_rate(args.rows, seconds))
    if args.raw_tsv:
        print(f"raw Criteo TSV: {args.raw_tsv}")
    return 0
