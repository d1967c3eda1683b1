"""``hotline train``: train DLRM on a dataset directory (or the built-in synthetic default), on one process,
on N local ranks (``--nproc N``, through torch's elastic launcher), or as one rank under ``torchrun``.

Every rank builds its TrainConfig through :func:`config_from_args` and runs the same :func:`_train`, so the
single-process and the distributed runs take the same flags and print the same summary."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, fields

from hotline.cli.args import (
    SubParsers,
    add_field,
    error,
    field_dest,
    field_value,
    ignore_further_interrupts,
    section_field,
    show_traceback,
)
from hotline.cli.effects import MODE_FLAGS, check_mode_flags, flag_given, ignored_preset_dests
from hotline.kinds import ColdStoreKind, Mode
from hotline.training.presets import PRESETS

SUMMARY_KEYS = (
    "mode",
    "steps",
    "samples_per_s",
    "val_auc",
    "val_logloss",
    "val_accuracy",
    "test_auc",
    "test_logloss",
    "test_accuracy",
)


def add_parser(subparsers: SubParsers) -> None:
    """``hotline train``: one argument group per section of the config (:data:`SECTIONS`), each field's flag
    made from its metadata, plus the flags that are not config fields (:data:`EXTRA_FLAGS`)."""
    from hotline.training.sections import SECTIONS, applies_text

    p = subparsers.add_parser(
        "train",
        help="train DLRM (on the built-in synthetic default when no dataset is given)",
        description="Train DLRM. Flags keep the reference DLRM's names.",
    )
    p.add_argument(
        "dataset",
        nargs="?",
        metavar="DATASET",
        help="dataset directory (default: the built-in synthetic dataset)",
    )
    unset = {e.dest for e in MODE_FLAGS.values()} | set(PRESET_FLAGS.values())
    for name, section in SECTIONS.items():
        group = p.add_argument_group(name, (section.__doc__ or "").splitlines()[0])
        for f in fields(section):
            if f.metadata["flag"] is not None:
                # A flag of another mode, or one a preset yields to: unset (None) unless given, its default
                # named in its help (MODE_FLAGS refuses it given where it has no effect).
                add_field(group, f, unset=field_dest(f) in unset, show_default=True)
        for flag, kw in EXTRA_FLAGS.get(name, {}).items():
            if flag in MODE_FLAGS:  # its help names the setting it has an effect with, from the one table
                kw = {
                    **kw,
                    "help": f"{applies_text(MODE_FLAGS[flag].on, MODE_FLAGS[flag].values)}: {kw['help']}",
                }
            group.add_argument(flag, **kw)
    p.set_defaults(func=run, declare=declare, train_parser=p)


EXTRA_FLAGS = {
    "model": {
        "--preset": dict(choices=sorted(PRESETS), default=None,
                         help="mlperf-dcnv2: MLPerf DLRM-DCNv2 (dim 128, 13-512-256-128, 1024-1024-512-256-1, dcn 3 x "
                              "512, row-wise Adagrad at 0.005, its LR schedule, batch 65536 scaled to the machine); "
                              "an explicit flag overrides its part"),
    },
    "placement": {
        "--hardware": dict(metavar="FILE|GPU",
                           help="price with this `hotline calibrate` JSON or known GPU (default: the GPU "
                                "torch names, or this CPU calibrated once, under a minute, and cached in $HOTLINE_CACHE "
                                "or ~/.cache/hotline)"),
        "--save-placement": dict(metavar="FILE",
                                 help="write the placement in force at the end (.npz, as `hotline profile --out`)"),
    },
    "run": {
        "--save": dict(metavar="CKPT.pt", help="write a checkpoint here at the end"),
        "--load": dict(metavar="CKPT.pt", help="start from this checkpoint"),
        "--nproc": dict(type=int, default=None, metavar="N",
                        help="train on N local ranks (data-parallel, through torch.distributed.run, as torchrun does; "
                             "unset: one process)"),
    },
}  # fmt: skip
"""The flags of ``hotline train`` that are not config fields, by the section whose group shows them."""

# TrainConfig fields a preset may set -> the flag that overrides them (as argparse dests).
PRESET_FLAGS = {
    name: field_dest(section_field(name))
    for name in ("embedding_dim", "bottom_mlp", "top_mlp", "interaction", "dcn_num_layers", "dcn_low_rank_dim",
                 "optimizer", "learning_rate", "lr_warmup_steps", "lr_decay_start_step", "lr_decay_steps",
                 "mini_batch_size")
}  # fmt: skip


def apply_preset(args: argparse.Namespace, dests: dict | None = None, command: str = "hotline train") -> None:
    """Writes ``--preset``'s values into ``args`` for every part no flag gave (each such flag is unset, None,
    unless given), records them in ``args.preset_filled`` (so that :func:`hotline.cli.effects.flag_given`
    does not judge them given), then forgets the preset (so the ranks of ``--nproc`` get the resolved flags).
    The preset's batch is scaled to the machine: see :func:`hotline.training.presets.scaled_batch_size`.
    ``dests`` (field -> argparse dest; a field whose dest ``args`` lacks is not set): another command's
    (``hotline profile``), default train's."""
    from dataclasses import fields

    from hotline.training.config import TrainConfig
    from hotline.training.presets import machine_memory, preset_values, scaled_batch_size

    if not args.preset:
        return
    dests = PRESET_FLAGS if dests is None else dests
    given = {dest for dest in dests.values() if flag_given(args, dest)}
    filled = set()
    values = preset_values(args.preset, {f.name for f in fields(TrainConfig)})
    for field_name, value in values.items():
        dest = dests[field_name]
        if dest in given or not hasattr(args, dest):
            continue
        if field_name == "mini_batch_size":
            from hotline.training.config import resolve_device

            lookups = _lookups_per_sample(args)
            dim_dest = dests["embedding_dim"]
            dim = getattr(args, dim_dest) if dim_dest in given else values["embedding_dim"]
            device = resolve_device(getattr(args, "device", "auto"))
            value = scaled_batch_size(value, lookups, dim, machine_memory(device))
            if os.environ.get("RANK", "0") == "0":
                print(f"{command}: --preset {args.preset}: mini-batch {value} (MLPerf's 65536 scaled to this "
                      f"machine's memory; --mini-batch-size overrides)", file=sys.stderr)  # fmt: skip
        elif isinstance(value, list):
            value = "-".join(map(str, value))
        setattr(args, dest, value)
        filled.add(dest)
    args.preset_filled = filled
    args.preset = None


def _lookups_per_sample(args: argparse.Namespace) -> int:
    """Id columns per sample of the dataset to train on (MLPerf's 214 when it cannot be read yet)."""
    from hotline.datasets.format import Dataset, DatasetError
    from hotline.datasets.mlperf import MLPERF_BAG_SIZES

    try:
        return Dataset(args.dataset).lookups_per_sample if args.dataset else 26
    except (DatasetError, OSError):
        return sum(MLPERF_BAG_SIZES)


def config_from_args(args: argparse.Namespace):
    """The TrainConfig of parsed ``hotline train`` flags (ValueError naming the flag if one is wrong); made
    once per parse (the output policy reads it first)."""
    if getattr(args, "train_config", None) is None:
        args.train_config = _config_from_args(args)
    return args.train_config


def _config_from_args(args: argparse.Namespace):
    from hotline.training.config import TrainConfig

    apply_preset(args)
    if args.mode == Mode.AUTO and (args.placement or args.hbm_budget):
        args.mode = Mode.HOTLINE.value  # the hot rows are given: nothing left to choose but hotline
    check_mode_flags(args)
    warn = not os.environ.get("HOTLINE_LAUNCHED") and os.environ.get("RANK", "0") == "0"  # once per run
    if warn and args.threads and args.threads > (os.cpu_count() or 1):
        print(f"hotline train: warning: --threads {args.threads} is more than the {os.cpu_count()} cores",
              file=sys.stderr)  # fmt: skip
    given = {}  # every field with a flag; an unset flag (None) leaves the config's default
    for f in fields(TrainConfig):
        if f.metadata["flag"] is not None and (value := field_value(args, f)) is not MISSING:
            given[f.name] = value
    return TrainConfig(**given)


def run(args: argparse.Namespace) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    under_torchrun = world > 1 and "RANK" in os.environ
    if under_torchrun and args.nproc and args.nproc != world:
        return error("train", f"--nproc {args.nproc} but torchrun started {world} ranks")
    try:
        apply_preset(args)
    except ValueError as e:
        return error("train", e)
    if (args.nproc or 1) > 1 and not under_torchrun:
        return _launch(args)
    if under_torchrun:
        from hotline.distributed.launcher import die_with_launcher

        die_with_launcher()  # a rank of --nproc N never outlives its launcher (kill -9 included)
    return _train(args, distributed=under_torchrun)


def _launch(args: argparse.Namespace) -> int:
    """Starts ``args.nproc`` ranks of this same command (flags checked once, here, before any rank starts)."""
    from hotline.distributed.launcher import launch

    try:
        config = config_from_args(args)
        if args.dataset is None:
            from hotline.datasets.default import default_dataset

            args.dataset = str(default_dataset())  # made once here, not raced by the ranks
        if config.mode == Mode.AUTO:  # chosen once, here: every rank trains the same configuration
            from hotline.datasets.format import Dataset

            check_start_files(args)  # before the choice times the model

            choice = _choose(config, Dataset(args.dataset), args)
            args.mode, args.hardware = choice.mode, None
            # A flag the chosen mode ignores stays unset: the ranks refuse one given (MODE_FLAGS).
            args.lookahead = choice.lookahead if choice.mode == Mode.HOTLINE else None
            args.hbm_budget = str(choice.hbm_budget) if choice.hbm_budget else None
            if choice.mode == Mode.DEVICE:  # nothing is cold (choice_fields)
                args.cold_store, args.cold_dir = ColdStoreKind.MEMORY.value, None
                args.cold_cache = args.cold_write_buffer = args.cold_io_depth = args.no_cold_direct = None
                args.no_cold_lazy = None
    except ValueError as e:
        return error("train", e)
    return launch(args.nproc, rank_argv(args))


def rank_argv(args: argparse.Namespace) -> list[str]:
    """The command line of every rank of ``--nproc``: the resolved flags, less what a preset filled that the
    settings ignore."""
    from hotline.distributed.launcher import launcher_argv

    drop = ("nproc", "train_parser", *sorted(ignored_preset_dests(args, "train")))
    return ["train", *launcher_argv(args.train_parser, args, drop)]


def declare(args: argparse.Namespace):
    """The run's outputs and inputs, for the output policy (:mod:`hotline.outputs`): every rank's --save."""
    from hotline.training.preflight import train_inputs, train_outputs

    config = config_from_args(args)
    world_size = args.nproc or int(os.environ.get("WORLD_SIZE", "1"))
    outputs = train_outputs(config, args.save, args.save_placement, world_size)
    return outputs, train_inputs(config, args.dataset, args.load)


def _train(args: argparse.Namespace, distributed: bool) -> int:
    """One process's run: the whole training, or this rank's part of it."""
    from hotline.distributed.comm import Comm
    from hotline.distributed.launcher import EXIT_TRANSIENT, StartError
    from hotline.pipeline.threads import configure_threads
    from hotline.training.checkpoint import load_checkpoint, save_checkpoint
    from hotline.training.preflight import finite_json
    from hotline.training.trainer import Trainer

    comm = None
    claim = args.claim  # the outputs, judged and locked before anything is loaded (hotline.cli.main)
    try:
        config = config_from_args(args)  # a bad flag value is a ValueError: one line like the rest
        if distributed:
            from hotline.distributed.launcher import init_from_env, worker_threads

            comm = init_from_env(config.device)  # NCCL on CUDA, gloo on the CPU
            configure_threads(worker_threads(config.threads))
        else:
            comm = Comm()
            configure_threads(config.threads)
        dataset = _dataset(args, comm)
        check_start_files(args)  # before --mode auto times the model
        # --mode auto: the library chooses (rank 0, taken by every rank); fit() prints the choice when
        # training starts, after every check of the run's inputs
        trainer = Trainer(config, dataset, comm, hardware=args.hardware)
        choice = trainer.auto_choice
        if comm.rank == 0:
            _report_tier(trainer)
        try:
            if args.load:
                step = load_checkpoint(trainer, args.load)
                if comm.rank == 0:
                    print(f"loaded {args.load} (step {step})", file=sys.stderr)
            summary = trainer.fit(claim)
            if trainer.config.cold_store == ColdStoreKind.DISK:  # as run: --mode auto may choose device mode
                _report_disk(trainer)
            if args.save:
                save_checkpoint(trainer, claim.path("--save") if comm.world_size == 1 else args.save)
            if args.save_placement and comm.rank == 0:
                # --mode hotline (MODE_FLAGS); claimed before the run
                trainer.mode.placement.save(claim.path("--save-placement"), force=True)
        finally:
            trainer.close()
        # Every rank reaches this point before any tears gloo down: destroying the group while a peer's
        # connection is still live made that peer's gloo thread call std::terminate (seen in CI-like runs).
        comm.barrier()
    except StartError as e:  # gloo could not connect the ranks: one line; --nproc tries a transient one again
        rank, retried = os.environ.get("RANK", "?"), e.transient and os.environ.get("HOTLINE_LAUNCHED")
        note = " (transient: the launcher starts the ranks again)" if retried else ""
        print(
            f"hotline train: {f'rank {rank}' if retried else f'error (rank {rank})'}: {e}{note}",
            file=sys.stderr,
        )
        return EXIT_TRANSIENT if retried else 2
    except (ValueError, IndexError, FloatingPointError, OSError) as e:
        # User-caused problems (bad dataset, placement, checkpoint, flags, a diverging loss, a full disk):
        # one clear line, no traceback. DatasetError, PlacementError and CheckpointError are ValueErrors.
        where = f" (rank {comm.rank if comm else '?'})" if distributed else ""
        show_traceback()
        print(f"hotline train: error{where}: {e}", file=sys.stderr)
        return 2 if not isinstance(e, FloatingPointError) else 3
    except KeyboardInterrupt:
        ignore_further_interrupts()
        if not os.environ.get("HOTLINE_LAUNCHED"):  # under --nproc, the launcher prints the one line
            print("hotline train: interrupted", file=sys.stderr)
        return 130
    finally:
        if distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    if comm.rank == 0:
        record = {k: summary[k] for k in SUMMARY_KEYS}
        record["world_size"] = comm.world_size  # every run prints the same keys, 1 rank or N
        if choice is not None:  # what --mode auto chose and predicted, beside what the run measured
            record["auto"] = choice.record(summary["samples_per_s"])
        print(finite_json(record))
    return 0


def check_start_files(args: argparse.Namespace) -> None:
    """``--load``'s checkpoint and ``--init-params``' arrays, looked into (not read) before any long work (``--mode
    auto``'s timing, the model built): a missing file, a directory, a FIFO, or a file of another kind (a
    metrics file, a checkpoint given as parameters) is a ValueError in the words of its real load."""
    from hotline._paths import check_file

    if args.load:
        from hotline.training.checkpoint import CheckpointError

        check_file(args.load, "checkpoint", CheckpointError)  # a directory, a FIFO, /dev/null: named
        _peek_checkpoint(args.load)
    if args.init_params:
        check_file(args.init_params, "--init-params")
        _peek_params(args.init_params)


def _peek_checkpoint(path: str) -> None:
    """A checkpoint's payload with its tensors mapped, not read: one that cannot be mapped is loaded as the
    run would (its digest, the safe loader), which names what is wrong; one of another format is refused."""
    import torch

    from hotline.training.checkpoint import CHECKPOINT_FORMAT, CheckpointError, read_checkpoint

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 -- the real load names it (or loads an older, unmappable file)
        read_checkpoint(path)
        return
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a Hotline checkpoint (format {CHECKPOINT_FORMAT})")


def _peek_params(path: str) -> None:
    """``--init-params``' file: an .npz archive of .npy arrays (its directory read, not the arrays)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            others = [n for n in z.namelist() if not n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"--init-params {path}: not a readable parameter .npz ({e})") from None
    if others:
        raise ValueError(
            f"--init-params {path}: not a parameter .npz: it holds {others[:2]}, not only .npy arrays (a "
            f"checkpoint? --load takes those)"
        )


def _report_disk(trainer) -> None:
    """One line of a disk-backed run: its file, I/O mode, bytes of rows and state, and the peak resident
    memory of this process (Linux ru_maxrss is in KiB)."""
    import resource

    from hotline.units import format_size

    f = trainer.mode.cold.host.file
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"cold store {f.path} ({f.mode}): {format_size(f.num_rows * f.record)} of rows and optimizer state "
          f"on disk; peak RSS {format_size(rss)}", file=sys.stderr)  # fmt: skip


def _report_tier(trainer) -> None:
    """One line where ``--cold-cache auto`` sized the DRAM tier: its rows and bytes, and the memory it was sized
    from (the limit that binds)."""
    from hotline.training.preflight import tier_sizing
    from hotline.units import format_size

    sized = tier_sizing(trainer.config)
    f = getattr(getattr(getattr(trainer.mode, "cold", None), "host", None), "file", None)
    if sized is None or f is None:
        return
    print(f"hotline train: --cold-cache auto: a DRAM tier of {f.cache_rows:,} rows "
          f"({format_size(f.cache_rows * f.record)}), sized from {sized}", file=sys.stderr)  # fmt: skip


def _choose(config, dataset, args: argparse.Namespace):
    """``--nproc``'s ``--mode auto``: the library's choice (:func:`hotline.costmodel.auto.resolve`), made once
    by the launcher and printed, so that every rank it starts trains the same flags."""
    from hotline.costmodel.auto import resolve
    from hotline.training.preflight import check_dense_memory

    check_dense_memory(config, dataset, tables=False)  # before the choice builds the model to time it
    _, choice = resolve(config, dataset, None, args.hardware)
    print(choice.line(), file=sys.stderr)
    return choice


def _dataset(args: argparse.Namespace, comm):
    """The dataset directory to train on: the flag's, or the built-in default (made by rank 0 alone)."""
    if args.dataset is not None:
        return args.dataset
    from hotline.datasets.default import default_dataset

    if comm.rank == 0:
        path = default_dataset()
        print(f"no dataset given: using the built-in synthetic dataset at {path}", file=sys.stderr)
    comm.barrier()
    return default_dataset()
