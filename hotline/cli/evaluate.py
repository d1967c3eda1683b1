"""``hotline evaluate DATASET --load CKPT``: a checkpoint's AUC, log-loss and accuracy on a split, as JSON."""

from __future__ import annotations

import argparse

from hotline.cli.args import SubParsers, add_arch, add_device, add_progress, add_threads, error


def add_scoring(p: argparse.ArgumentParser, split_default: str) -> None:
    """The flags ``evaluate`` and ``predict`` share: dataset, checkpoint, split, architecture, device."""
    p.add_argument("dataset", metavar="DATASET", help="dataset directory the checkpoint was trained on")
    p.add_argument(
        "--load", required=True, metavar="CKPT.pt", help="checkpoint (from `hotline train --save`)"
    )
    p.add_argument("--split", default=split_default, choices=["val", "test"], help="split to score")
    p.add_argument(
        "--eval-max-samples", type=int, default=0, metavar="N", help="the first N samples only (0: all)"
    )
    add_arch(p, default=False)  # a checkpoint records its architecture; these are for older ones
    for action in p._actions:
        if action.dest.startswith(("arch_", "dcn_")):
            action.help += " (default: the checkpoint's; older checkpoints: `hotline train`'s)"
    p.add_argument(
        "--scratch",
        metavar="DIR",
        help="directory where a disk-store checkpoint's rows are copied while it scores (their records' "
        "size of free disk; the copy is removed at the end) (default: the checkpoint's directory)",
    )
    add_device(p)
    add_threads(p)
    add_progress(p)


def arch_flags(args: argparse.Namespace) -> dict:
    """The ``--arch-*`` flags given, as model-spec fields (None: not given)."""
    from hotline.models.dlrm import parse_layers

    def layers(value, flag):
        return None if value is None else parse_layers(value, flag)

    return {
        "embedding_dim": args.arch_sparse_feature_size,
        "bottom_mlp": layers(args.arch_mlp_bot, "--arch-mlp-bot"),
        "top_mlp": layers(args.arch_mlp_top, "--arch-mlp-top"),
        "interaction": args.arch_interaction_op,
        "dcn_num_layers": args.dcn_num_layers,
        "dcn_low_rank_dim": args.dcn_low_rank_dim,
    }


def check_checkpoint_flags(args: argparse.Namespace, command: str) -> None:
    """Before any model is built: refuses a ``--dcn-*`` flag where the interaction (``--arch-interaction-op``,
    else the checkpoint's) ignores it, from the one table (:data:`hotline.cli.effects.FLAG_EFFECTS`), and
    ``--arch-*`` flags that describe another dense model than the checkpoint holds (a size that could not
    even be allocated among them), naming the flags, in one line."""
    from hotline.cli.effects import check_flag_effects

    payload = _peek(args.load)
    stored = payload.get("model_config") if payload is not None else None
    interaction = args.arch_interaction_op
    if interaction is None and payload is not None:
        interaction = str((stored or {}).get("interaction", "dot"))
        interaction = interaction if interaction == "dcn" else f"{interaction} (the checkpoint's)"
    if interaction is not None:
        check_flag_effects(args, command, {"--arch-interaction-op": interaction})
    if payload is not None:
        _check_dense_size(args, payload)


def _peek(path) -> dict | None:
    """A checkpoint's payload (of N ranks: rank 0's) with its tensors mapped, not read (its architecture and
    their shapes); None where it cannot be read so: its own load then says why, with its checks (digest, safe
    loader). Only a regular file is peeked at: a FIFO would block the read, /dev/null or a link loop is the
    load's to name."""
    import os

    import torch

    from hotline.training.export_sharded import rank_files

    try:
        path = rank_files(path, ValueError)[0]  # of N ranks: rank 0's, which holds the model
    except ValueError:
        return None
    if not os.path.isfile(path):
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 -- any failure is the real load's to name
        return None
    ok = isinstance(payload, dict) and isinstance(payload.get("model"), dict) and "table_sizes" in payload
    return payload if ok else None


def _check_dense_size(args: argparse.Namespace, payload: dict) -> None:
    """ValueError when the dense model of the checkpoint's architecture with the ``--arch-*`` flags has
    another parameter count than the checkpoint's weights: counted, not built."""
    from hotline.models.dlrm import DLRMConfig, dense_parameters
    from hotline.training.inference import model_spec

    spec = model_spec(payload, args.load, arch_flags(args))
    want = dense_parameters(DLRMConfig(table_sizes=[int(n) for n in payload["table_sizes"]], **spec.arch()))
    have = sum(int(t.numel()) for t in payload["model"].values())
    if want != have:
        given = sorted(f for f in ("--arch-sparse-feature-size", "--arch-mlp-bot", "--arch-mlp-top",
                                   "--arch-interaction-op", "--dcn-num-layers", "--dcn-low-rank-dim")
                       if getattr(args, f[2:].replace("-", "_")) is not None)  # fmt: skip
        flags = (
            f"the flag{'s' * (len(given) > 1)} {', '.join(given)}" if given else "the default --arch-* flags"
        )
        raise ValueError(
            f"checkpoint {args.load} does not match this model's architecture: it holds a dense model of {have:,} "
            f"parameters, but {flags} describe{'s' * (len(given) == 1)} one of "
            f"{want:,}: give the --arch-* flags it was trained with"
        )


def scoring_trainer(args: argparse.Namespace):
    """The checkpoint's model on the dataset (ValueError / OSError for a user's mistake)."""
    from hotline.pipeline.threads import configure_threads
    from hotline.training.inference import trainer_from_checkpoint

    if args.eval_max_samples < 0:
        raise ValueError(f"--eval-max-samples must be >= 0, got {args.eval_max_samples}")
    check_checkpoint_flags(args, args.command)  # before the model is built
    configure_threads(args.threads or 0)
    return trainer_from_checkpoint(
        args.dataset,
        args.load,
        flags=arch_flags(args),
        device=args.device,
        eval_max_samples=args.eval_max_samples,
        progress=not args.no_progress,
        scratch_dir=args.claim.path("--scratch") if args.scratch else None,
    )


def add_parser(subparsers: SubParsers) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="score a checkpoint on a split: AUC, log-loss, accuracy as JSON",
        description="Load a checkpoint of `hotline train --save` and print its metrics on a split of the "
        "dataset it was trained on, as one JSON line on stdout.",
    )
    add_scoring(p, "val")
    p.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs and inputs for the output policy (:mod:`hotline.outputs`): the scratch directory, if given."""
    from hotline.outputs import Output

    return [Output("--scratch", args.scratch, kind="dir")], [("DATASET", args.dataset), ("--load", args.load)]


def run(args: argparse.Namespace) -> int:
    from hotline.training.preflight import finite_json

    try:
        trainer = scoring_trainer(args)
        try:
            metrics = trainer.evaluate(args.split)
        finally:
            trainer.close()
    except (ValueError, OSError, IndexError) as e:
        return error("evaluate", e)
    record = {"split": args.split, "checkpoint": str(args.load), "step": trainer.step_count, **metrics}
    print(finite_json(record))  # an empty split's AUC is NaN: null, as train writes it
    return 0
