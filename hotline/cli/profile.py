"""``hotline profile DATASET``: count row accesses over a sample, print per-table skew, write a placement."""

from __future__ import annotations

import argparse

from hotline.cli.args import (
    SubParsers,
    add_budget,
    add_embedding,
    add_force,
    add_interaction,
    add_output,
    add_progress,
    add_sampling,
    add_threads,
    error,
    flags,
    sample_fraction,
)
from hotline.cli.effects import check_flag_effects, unset_flags
from hotline.cli.train import PRESET_FLAGS, apply_preset
from hotline.units import format_size

PRESET_DESTS = {**PRESET_FLAGS, "embedding_dim": "embedding_dim"}
"""TrainConfig fields a ``--preset`` sets -> profile's flags (the training-only ones it lacks are left out)."""


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="count embedding-row accesses over a sample and place the popular rows under an HBM budget",
        description="Count accesses per (table, row) over a sample of a dataset split, rank the rows of all "
        "tables by popularity, and choose the hot rows that fit an HBM budget.",
    )
    parser.add_argument("dataset", metavar="DATASET", help="dataset directory (from `hotline data ...`)")
    add_sampling(parser)
    parser.add_argument("--split", default="train", choices=["train", "val", "test"], help="split to profile")
    parser.add_argument(
        "--heldout",
        default="sample",
        choices=["sample", "val", "none"],
        help="where the figures are measured that the ranking did not see: a disjoint sample of the same split "
        "(default, as many samples as profiled), the validation split, or nowhere",
    )
    parser.add_argument(
        "--heldout-fraction", type=float, default=None, metavar="F", help="share of the split held out"
    )
    add_budget(
        parser, help="device bytes for hot rows, e.g. 256MiB, 2GiB, 1GB or plain bytes (required for --out)"
    )
    add_embedding(parser)
    parser.add_argument(
        "--always-hot", type=int, nargs="+", default=[], metavar="TABLE", help="tables to keep hot whole"
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="predict samples/s of device, hybrid and hotline K=0 / K>=1 at --hbm-budget from the held-out figures",
    )
    parser.add_argument(
        "--hardware",
        default="H200",
        metavar="SPEC",
        help="for --predict: a JSON file from `hotline calibrate`, or a known GPU (H100, H200; default H200)",
    )
    parser.add_argument(
        "--host-hardware", default=None, metavar="FILE", help="for a GPU: its host's `hotline calibrate` JSON"
    )
    parser.add_argument("--arch-mlp-bot", default=None, metavar="A-B-C", help="for --predict: bottom MLP")
    parser.add_argument("--arch-mlp-top", default="512-256-1", metavar="A-B-C", help="for --predict: top MLP")
    add_interaction(parser, what="for --predict: ")
    parser.add_argument(
        "--preset",
        choices=["mlperf-dcnv2"],
        default=None,
        help="the model of `hotline train --preset`: mlperf-dcnv2 sets dim 128, row-wise Adagrad rows, its MLPs "
        "and dcn 3 x 512 for --predict, and the batch 65536 scaled to this machine as train does; an explicit "
        "flag overrides its part",
    )
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=1,
        metavar="N",
        help="for --predict: threads of the look-ahead producer",
    )
    add_output(parser, "--out", "write the placement (.npz)")
    add_output(parser, "--json", "write the summary as JSON")
    add_output(parser, "--curve-csv", "write the budget curve as CSV")
    add_force(parser)
    add_threads(parser, "Numba threads")
    add_progress(parser)
    parser.set_defaults(func=run, declare=declare)
    unset_flags(parser, set(PRESET_DESTS.values()))  # given or not, by value: a --preset fills the unset


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output

    outputs = [Output("--out", args.out), Output("--json", args.json), Output("--curve-csv", args.curve_csv)]
    hardware = [("--hardware", args.hardware if args.predict and args.hardware and _is_file(args.hardware) else None),
                ("--host-hardware", args.host_hardware)]  # fmt: skip
    return outputs, [("DATASET", args.dataset), *hardware]


def _is_file(spec: str) -> bool:
    from pathlib import Path

    return Path(spec).exists()


def _table_text(stats) -> str:
    df = stats.copy()
    fmt = {
        "hot_pct": "{:.2f}".format,
        "coverage": "{:.1%}".format,
        "top1pct_share": "{:.1%}".format,
        "zipf_exponent": "{:.2f}".format,
    }
    for col, f in fmt.items():
        if col in df:
            df[col] = df[col].map(f)
    df = df.rename(
        columns={
            "accessed_rows": "accessed",
            "hot_rows": "hot rows",
            "hot_pct": "hot %",
            "top1pct_share": "top-1% share",
            "zipf_exponent": "zipf s",
        }
    )
    return df.drop(columns=["lookups"]).to_string(index=False)


def _arch(args) -> dict:
    """The model --predict prices (:data:`hotline.costmodel.ARCH_FIELDS`), its flags checked before
    the profile runs: a wrong one is named before the long work."""
    from hotline.models.dlrm import parse_layers

    bottom = parse_layers(args.arch_mlp_bot, "--arch-mlp-bot") if args.arch_mlp_bot else None
    if bottom is not None and bottom[-1] != args.embedding_dim:
        raise ValueError(f"--arch-mlp-bot {args.arch_mlp_bot} must end with the embedding dim "
                         f"{args.embedding_dim} (--embedding-dim)")  # fmt: skip
    if args.dcn_num_layers < 1 or args.dcn_low_rank_dim < 1:
        raise ValueError(f"--dcn-num-layers and --dcn-low-rank-dim must be >= 1, got {args.dcn_num_layers} and "
                         f"{args.dcn_low_rank_dim}")  # fmt: skip
    return {"bottom_mlp": bottom, "top_mlp": parse_layers(args.arch_mlp_top, "--arch-mlp-top"),
            "interaction": args.arch_interaction_op, "dcn_num_layers": args.dcn_num_layers,
            "dcn_low_rank_dim": args.dcn_low_rank_dim}  # fmt: skip


def _model_text(w) -> str:
    """The priced model in one phrase: its MLPs and interaction."""
    inter = w.interaction
    if inter == "dcn":
        inter = f"dcn ({w.dcn_num_layers} cross layers of rank {w.dcn_low_rank_dim})"
    bottom, top = ("-".join(map(str, m)) for m in (w.bottom_mlp, w.top_mlp))
    return f"bottom MLP {bottom}, {inter} interaction, top {top}"


def _prediction_text(prof, args, arch: dict) -> str:
    from hotline import costmodel

    hw = costmodel.load_hardware(args.hardware, args.host_hardware)
    w = costmodel.workload_for(prof, worker_threads=args.worker_threads, **arch)
    stats = costmodel.Stats.from_profile(prof, args.hbm_budget)
    figures = "held-out" if prof.heldout is not None else "IN-SAMPLE (nothing held out: optimistic)"
    return (
        f"predicted on {hw['name']} ({figures} figures: coverage {stats.hot_lookup_share:.1%}, popular "
        f"{stats.popular_sample_share:.1%}, {stats.cold_rows_per_batch:,.0f} cold rows per mini-batch of "
        f"{w.batch_size}); {_model_text(w)}\n"
        + costmodel.prediction_table(costmodel.predict_all(w, stats, hw))
        + "\n"
    )


def _heldout_text(h: dict | None, batch_size: int) -> str:
    if h is None:
        return "held-out: none (nothing was held out: the figures below are in-sample only)"
    return (
        f"held-out (measured on samples the ranking did not see: {h['source']})\n"
        f"  access coverage        {h['access_coverage']:.2%}\n"
        f"  popular-sample share   {h['popular_sample_share']:.2%}"
        f"  (~{h['popular_samples_per_batch']:.1f} of {batch_size} per mini-batch)\n"
        f"  per mini-batch of {batch_size}: unique cold rows {h['unique_cold_rows_per_batch']:.1f} "
        f"({format_size(round(h['bytes_per_batch']))} host->device, over {h['mini_batches']:,} mini-batches)"
    ) + (
        ""
        if "epoch_estimate" not in h
        else f"\n  an epoch of split {h['split']!r} ({h['epoch_estimate']['profiled_share_of_split']:.0%} of it "
        f"profiled, at the in-sample figures) counts: coverage {h['epoch_estimate']['access_coverage']:.2%}, "
        f"popular {h['epoch_estimate']['popular_sample_share']:.2%}"
    )


def run(args: argparse.Namespace) -> int:
    from hotline._io import write_json, write_text
    from hotline.datasets.format import DatasetError
    from hotline.pipeline.threads import set_numba_threads
    from hotline.placement import PlacementError
    from hotline.profiling.profiler import Profiler
    from hotline.training.logs import note_first_compile

    if args.threads:
        set_numba_threads(args.threads)
    try:
        apply_preset(args, PRESET_DESTS, "hotline profile")
        check_flag_effects(args, "profile")  # the --predict flags without it; --dcn-* for another interaction
    except ValueError as e:
        return error("profile", e)
    if (
        args.out is not None or args.json is not None or args.always_hot or args.predict
    ) and args.hbm_budget is None:
        return error(
            "profile", "--out, --json, --always-hot and --predict need --hbm-budget"
        )  # else: nothing written
    try:
        arch = None
        if args.predict:  # a bad hardware description or model is named before the profile, not after it
            from hotline import costmodel

            costmodel.load_hardware(args.hardware, args.host_hardware)
            arch = _arch(args)
        names = ("sample_batches", "mini_batch_size", "seed", "embedding_dim", "optimizer", "split", "heldout",
                 "heldout_fraction")  # fmt: skip
        profiler = Profiler(
            sample_fraction=sample_fraction(args), **flags(args, *names), progress=not args.no_progress
        )
        note_first_compile(("hotline.kernels.profile",), terminal_only=True)
        prof = profiler.profile(args.dataset)
        placement = prof.placement(args.hbm_budget, args.always_hot) if args.hbm_budget is not None else None
        summary = prof.summary(args.hbm_budget, args.always_hot, placement) if placement is not None else None
    except (DatasetError, PlacementError, ValueError, OSError) as e:
        return error("profile", e)

    print(
        f"{args.dataset}: {prof.num_samples:,} samples of split {args.split!r} profiled "
        f"({prof.total_lookups:,} lookups, {prof.num_accessed:,} of {sum(prof.table_sizes):,} rows accessed) "
        f"in {prof.timings['count_s'] + prof.timings['rank_s']:.1f} s"
    )
    if summary is not None:
        B = prof.mini_batch_size
        print(
            f"\nHBM budget {format_size(summary['hbm_budget_bytes'])} at {summary['bytes_per_row']} B/row: "
            f"{summary['hot_rows']:,} hot rows ({format_size(summary['hot_bytes'])})"
        )
        print(_heldout_text(summary.get("heldout"), B))
        print(
            "in-sample (measured on the profiled sample the ranking came from: optimistic)\n"
            f"  access coverage        {summary['access_coverage']:.2%}\n"
            f"  popular-sample share   {summary['popular_sample_share']:.2%}"
            f"  (~{summary['expected_popular_samples_per_batch']:.1f} of {B} per mini-batch)\n"
            f"  per mini-batch of {B}: expected unique cold rows {summary['expected_cold_rows_per_batch']:.1f}"
            f" of {summary['expected_unique_rows_per_batch']:.1f} unique\n"
            f"  host->device bytes per mini-batch: hybrid {format_size(summary['hybrid_bytes_per_batch'])} "
            f"(all lookups), {format_size(round(summary['hybrid_unique_bytes_per_batch']))} (unique rows); "
            f"Hotline {format_size(round(summary['hotline_bytes_per_batch']))} (unique cold rows)\n"
        )
    if args.predict:
        try:
            text = _prediction_text(prof, args, arch)
        except (ValueError, OSError, KeyError) as e:
            return error("profile", e)
        print(text)
    print("per table (in-sample):")
    print(_table_text(prof.table_stats(args.hbm_budget, args.always_hot, placement)))
    curve = prof.curve().to_csv(index=False) if args.curve_csv is not None else None
    del prof  # its rank (4 bytes a row) is not needed to write: the placement file's remaps are as big
    try:  # an unwritable or full output location is the user's to fix: one line, no traceback
        if placement is not None and args.out is not None:
            placement.save(args.claim.path("--out"), force=True)  # claimed
            print(f"placement written to {args.out}")
        if summary is not None and args.json is not None:
            write_json(args.claim.path("--json"), summary)
            print(f"summary written to {args.json}")
        if args.curve_csv is not None:
            write_text(args.claim.path("--curve-csv"), curve)
            print(f"budget curve written to {args.curve_csv}")
    except OSError as e:
        return error("profile", e)
    return 0
