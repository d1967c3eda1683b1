"""``hotline export --load CKPT --to torchrec-dlrm OUT``: a checkpoint as torchrec's DLRM (one file, or a
torch.distributed.checkpoint directory: ``--format``)."""

from __future__ import annotations

import argparse
import sys

from hotline.cli.args import SubParsers, add_arch, add_force, error


def add_parser(subparsers: SubParsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="export a checkpoint as torchrec's DLRM (torchrec.models.dlrm.DLRM, or DLRM_DCN for dcn)",
        description="Write a checkpoint's model as torchrec's DLRM (--format); "
        "hotline.training.export.load_torchrec_dlrm(OUT) turns it back into torchrec.models.dlrm.DLRM "
        "(DLRM_DCN for dcn; features cat_0 .. cat_{T-1}, sum pooling).",
    )
    p.add_argument("out", metavar="OUT", help="file (torch-save) or directory (dcp) to write")
    p.add_argument(
        "--load", required=True, metavar="CKPT.pt", help="checkpoint (from `hotline train --save`)"
    )
    p.add_argument("--to", default="torchrec-dlrm", choices=["torchrec-dlrm"], help="target model")
    p.add_argument(
        "--format",
        default="auto",
        choices=["auto", "torch-save", "dcp"],
        help="torch-save: one file (holds the tables twice in memory while it is written); dcp: a "
        "torch.distributed.checkpoint directory, the tables streamed chunk by chunk (dcp.load reads it into "
        "torchrec's DLRM state_dict); auto (default): dcp when two copies of the tables would not fit in the "
        "memory available (the cgroup limit or the machine's, the smaller)",
    )
    add_arch(p, default=False)
    for action in p._actions:
        if action.dest.startswith(("arch_", "dcn_")):
            action.help += " (default: the checkpoint's; older checkpoints: `hotline train`'s)"
    add_force(p)
    p.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`)."""
    from hotline.outputs import Output
    from hotline.training.export_sharded import is_export

    kind = "dir" if is_export(args.out) else "file"  # a sharded export: replaced whole, with --force (run)
    return [Output("OUT", args.out, kind=kind)], [("--load", args.load)]


def run(args: argparse.Namespace) -> int:
    from hotline.cli.evaluate import arch_flags, check_checkpoint_flags

    try:
        check_checkpoint_flags(args, "export")  # before the model is built
        from hotline.training.export import export_torchrec_dlrm
        from hotline.training.export_sharded import is_export

        if is_export(args.out) and not args.force:
            return error(
                "export",
                f"{args.out} is a Hotline export: pass --force to replace it, or choose another name",
            )

        config = export_torchrec_dlrm(
            args.load, args.claim.path("OUT"), arch_flags(args), force=True, format=args.format
        )
    except ImportError as e:
        return error(
            "export", f"torchrec is needed for --to torchrec-dlrm ({e}): see README, torchrec section"
        )
    except (ValueError, OSError) as e:
        return error("export", e)
    kind = "DLRM_DCN" if config.get("interaction") == "dcn" else "DLRM"
    storage = ": a torch.distributed.checkpoint directory" if config["storage"] == "dcp" else ""
    print(
        f"wrote {args.out}: torchrec {kind} of {args.load} (step {config['step']}, {len(config['table_sizes'])} "
        f"tables, dim {config['embedding_dim']}){storage}",
        file=sys.stderr,
    )
    return 0
