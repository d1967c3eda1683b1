"""The sections of a training run's configuration, one dataclass per concern (as torchtitan's job config).

:class:`~hotline.training.config.TrainConfig` combines them by inheritance into one flat dataclass, so every
field reads ``config.lookahead`` and every call ``TrainConfig(lookahead=4)``. Each field's
``metadata["help"]`` is its one-line description and its ``--help`` text; ``metadata["flag"]`` names its flag
of ``hotline train`` (None: a library-only field); ``metadata["applies_to"]`` says with which setting it has
an effect (:data:`APPLIES_TO`, the one table of it: ``hotline train`` refuses a flag given elsewhere and
prefixes its help with that setting, :func:`applies_text`). ``hotline train --help`` shows one argument group per
section, in the order of :data:`SECTIONS` (:func:`hotline.cli.args.add_field` turns a field into a flag).

Importing this module imports no torch: the CLI builds its parser from it and ``hotline --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from hotline.kinds import (
    DEFAULT_LOOKAHEAD,
    ColdStoreKind,
    Interaction,
    MicroBatches,
    Mode,
    Optimizer,
    Replace,
)

HOTLINE = (Mode.HOTLINE.value, Mode.AUTO.value)
"""The modes a flag of hotline mode has an effect with: ``--mode auto`` takes them and they apply when it
chooses hotline (``--placement`` and ``--hbm-budget`` choose it)."""


def option(
    default: Any = MISSING,
    help: str = "",
    flag: str | None = None,
    *,
    factory: Any = MISSING,
    metavar: str | None = None,
    choices: type | None = None,
    cli_default: Any = MISSING,
    parse: str | None = None,
    negate: bool = False,
    shared: bool = False,
    applies_to: tuple[str, tuple[str, ...]] | None = None,
    strict: bool = False,
) -> Any:
    """A config field and its flag. ``choices``: the StrEnum of its values; ``cli_default``: the flag's default
    where it differs from the library's (``--mode auto``); ``parse``: how the flag's text becomes the value
    (``layers``: ``13-512-256``, ``size``: ``256MiB``); ``negate``: a ``--no-X`` switch that sets the field
    False; ``shared``: a flag every command shares, added by :mod:`hotline.cli.args` (``--threads``);
    ``applies_to``: (field, its values) with which the field has an effect (None: with any), the help's
    prefix; ``strict``: the config, too, refuses the field set off its default where it has none (the CLI
    refuses every such flag given there; the config tolerates the rest, which ``--mode auto`` may carry into
    another mode)."""
    meta = {"help": help, "flag": flag, "metavar": metavar, "choices": choices, "parse": parse}
    meta.update(negate=negate, shared=shared, cli_default=cli_default, applies_to=applies_to, strict=strict)
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def cli_default(f) -> Any:
    """The default ``hotline train`` shows for field ``f`` (its flag's own, else the library's)."""
    if f.metadata.get("cli_default", MISSING) is not MISSING:
        return f.metadata["cli_default"]
    value = f.default_factory() if f.default is MISSING else f.default
    return "-".join(map(str, value)) if isinstance(value, list) else value


@dataclass
class ModelSection:
    """The DLRM architecture and its initialisation (flags keep the reference DLRM's names)."""

    embedding_dim: int = option(16, "embedding dimension D", "--arch-sparse-feature-size", metavar="D")
    bottom_mlp: list[int] = option(
        help="bottom MLP sizes (dense in ... D)",
        flag="--arch-mlp-bot",
        factory=lambda: [13, 512, 256, 64, 16],
        metavar="SIZES",
        parse="layers",
    )
    top_mlp: list[int] = option(
        help="top MLP sizes after the interaction (... 1)",
        flag="--arch-mlp-top",
        factory=lambda: [512, 256, 1],
        metavar="SIZES",
        parse="layers",
    )
    interaction: str = option(
        Interaction.DOT.value,
        "feature interaction: dot (DLRM), cat, or dcn (DCN-v2 low-rank cross net, torchrec's DLRM_DCN)",
        "--arch-interaction-op",
        choices=Interaction,
    )
    dcn_num_layers: int = option(
        3, "cross layers", "--dcn-num-layers", metavar="N", applies_to=("interaction", (Interaction.DCN,))
    )
    dcn_low_rank_dim: int = option(
        512,
        "rank of each cross layer",
        "--dcn-low-rank-dim",
        metavar="R",
        applies_to=("interaction", (Interaction.DCN,)),
    )
    seed: int = option(0, "seed of the model and embedding initialisation", "--seed", metavar="N")


@dataclass
class OptimizerSection:
    """The sparse and dense optimizers and the learning-rate schedule.

    The schedule is the reference DLRM's (:mod:`hotline.training.schedule`)."""

    optimizer: str = option(
        Optimizer.SGD.value,
        "sparse optimizer (FBGEMM's: rowwise-adagrad = EXACT_ROWWISE_ADAGRAD, adagrad = ADAGRAD, adam = ADAM "
        "with row-wise bias correction); dense layers get SGD, Adagrad (both Adagrads) or Adam to match",
        "--optimizer",
        choices=Optimizer,
    )
    learning_rate: float = option(0.1, "dense and sparse learning rate", "--learning-rate", metavar="LR")
    lr_warmup_steps: int = option(
        0,
        "dense and sparse learning rate ramps up linearly over the first W steps (dlrm's schedule)",
        "--lr-num-warmup-steps",
        metavar="W",
    )
    lr_decay_start_step: int = option(
        0, "the learning rate's quadratic decay starts at step S", "--lr-decay-start-step", metavar="S"
    )
    lr_decay_steps: int = option(
        0, "and decays over N steps (0: no decay)", "--lr-num-decay-steps", metavar="N"
    )


@dataclass
class DataSection:
    """How the dataset is read: batches, epochs, evaluation."""

    mini_batch_size: int = option(128, "samples per optimizer step", "--mini-batch-size", metavar="B")
    nepochs: int = option(1, "passes over the training split", "--nepochs", metavar="N")
    num_batches: int = option(0, "stop after N steps (0: all)", "--num-batches", metavar="N")
    test_freq: int = option(0, "steps between validations (0: at the end only)", "--test-freq", metavar="N")
    eval_max_samples: int = option(
        0, "evaluate on at most N samples (0: all)", "--eval-max-samples", metavar="N"
    )
    eval_batch_size: int = option(16384, "samples per evaluation forward pass")


@dataclass
class PlacementSection:
    """Where the embedding rows live, and how the hot rows are chosen and re-chosen."""

    mode: str = option(
        Mode.DEVICE.value,
        "where embedding rows live: all on the device, all in host memory, or hot/cold (hotline); auto: "
        "the mode, hot budget and look-ahead the cost model predicts fastest on this hardware (printed)",
        "--mode",
        choices=Mode,
        cli_default=Mode.AUTO.value,
    )
    """The library's default is ``device``; ``auto`` (``hotline train``'s) is resolved to one of the others
    before training (:mod:`hotline.costmodel.auto`)."""
    placement_path: str | None = option(
        None,
        "the hot rows (from `hotline profile`)",
        "--placement",
        metavar="FILE.npz",
        applies_to=("mode", HOTLINE),
    )
    hbm_budget: int | None = option(
        None,
        "profile first and place the hot rows under this budget (256MiB) where no --placement is given",
        "--hbm-budget",
        metavar="SIZE",
        parse="size",
        applies_to=("mode", HOTLINE),
    )
    """In bytes (the flag takes a size such as ``256MiB``)."""
    replace_every: int = option(
        0,
        "re-choose the hot rows from online access counts every N steps (0: never)",
        "--replace-every",
        metavar="N",
        applies_to=("mode", (Mode.HOTLINE,)),
        strict=True,
    )
    replace: str = option(
        Replace.OFF.value,
        "auto re-chooses the hot rows when the hot-lookup share falls --replace-threshold below what the "
        "placement delivered",
        "--replace",
        choices=Replace,
        applies_to=("mode", (Mode.HOTLINE,)),
        strict=True,
    )
    replace_threshold: float = option(
        0.05,
        "fall in hot-lookup share that triggers --replace auto (absolute: 0.05 is 5 points)",
        "--replace-threshold",
        metavar="P",
        applies_to=("mode", HOTLINE),
    )
    count_decay: float = option(
        0.99,
        "per-step decay of the online access counts",
        "--count-decay",
        metavar="D",
        applies_to=("mode", HOTLINE),
    )


@dataclass
class PipelineSection:
    """The look-ahead pipeline of hotline mode: cold rows gathered while earlier steps compute.

    See :mod:`hotline.pipeline.executor`."""

    lookahead: int = option(
        DEFAULT_LOOKAHEAD,
        "steps gathered ahead (0: sequential)",
        "--lookahead",
        metavar="K",
        applies_to=("mode", HOTLINE),
    )
    worker_threads: int = option(
        1,
        "numba threads of the look-ahead worker",
        "--worker-threads",
        metavar="N",
        applies_to=("mode", HOTLINE),
    )
    share_cores: bool = option(
        False,
        "torch gives the look-ahead's producer the cores it is measured to keep busy (faster on few cores; "
        "equal to device mode up to reassociation instead of bit-identical)",
        "--share-cores",
    )
    """:class:`hotline.pipeline.threads.CoreShare`: torch's reductions then run on fewer threads."""
    micro_batches: str = option(
        MicroBatches.AUTO.value,
        "popular and non-popular passes (split), one pass (fused), or auto: split at "
        "--lookahead 0, fused when the cold rows were gathered ahead",
        "--micro-batches",
        choices=MicroBatches,
        applies_to=("mode", HOTLINE),
    )


@dataclass
class StoreSection:
    """The cold store of hybrid and hotline: host memory, or a file on local disk."""

    cold_store: str = option(
        ColdStoreKind.MEMORY.value,
        "where the cold rows of hybrid and hotline live: host memory, or a file on local disk (tables beyond "
        "DRAM; --mode auto prices the store given)",
        "--cold-store",
        choices=ColdStoreKind,
    )
    cold_dir: str | None = option(
        None,
        "the directory of its file",
        "--cold-dir",
        metavar="DIR",
        applies_to=("cold_store", (ColdStoreKind.DISK,)),
        strict=True,
    )
    cold_io_depth: int = option(
        32,
        "reads in flight (I/O threads)",
        "--cold-io-depth",
        metavar="N",
        applies_to=("cold_store", (ColdStoreKind.DISK,)),
    )
    cold_cache: int | str = option(
        0,
        "DRAM for its most popular rows (2GiB; auto: what memory leaves; 0: none)",
        "--cold-cache",
        metavar="SIZE",
        parse="size-or-auto",
        applies_to=("cold_store", (ColdStoreKind.DISK,)),
    )
    """In bytes (the flag takes a size such as ``2GiB``), or ``"auto"``: the Trainer sizes it to the memory the
    run may take less what else it holds (:func:`hotline.training.preflight.resolve_cold_cache`)."""
    cold_write_buffer: int | str = option(
        "auto",
        "memory for written rows swept to the file in order (auto; 0: written in place)",
        "--cold-write-buffer",
        metavar="SIZE",
        parse="size-or-auto",
        applies_to=("cold_store", (ColdStoreKind.DISK,)),
    )
    """In bytes, or ``"auto"`` (:func:`hotline.tiers.held_rows.write_buffer_bytes`): a step's written rows are
    held there and swept to the file in file order when it is full (:mod:`hotline.tiers.held_rows`)."""
    cold_direct: bool = option(
        True,
        "through the OS page cache instead of O_DIRECT",
        "--no-cold-direct",
        negate=True,
        applies_to=("cold_store", (ColdStoreKind.DISK,)),
    )
    cold_lazy: bool = option(
        True,
        "write every row's initial values at start-up instead of drawing each when first read",
        "--no-cold-lazy",
        negate=True,
        applies_to=("cold_store", (ColdStoreKind.DISK,)),
    )
    """Either way every row starts from the same initial values (:mod:`hotline.tiers.pending_rows`)."""


@dataclass
class RunSection:
    """The run itself: device, threads, reports, files in and out, checkpoints."""

    device: str = option(
        "cpu",
        "compute device: auto (cuda when available, else cpu), cpu, cuda, cuda:1",
        "--device",
        metavar="DEVICE",
        cli_default="auto",
    )
    """Resolved when the config is made (:func:`hotline.training.config.resolve_device`): on one of several
    local ranks ``cuda`` and ``auto`` mean the rank's own GPU, ``cuda:LOCAL_RANK``."""
    threads: int = option(0, "torch and numba threads (0: all cores)", "--threads", shared=True)
    """A :class:`~hotline.training.trainer.Trainer` sets them while it lives (its :meth:`close` restores the
    counts before); with 0 it leaves the process's counts (``hotline train`` sets all cores, or each rank's
    share of them, first)."""
    print_freq: int = option(
        256, "steps between reports (metrics records, log lines)", "--print-freq", metavar="N"
    )
    progress: bool = option(
        True, "no progress bar: a log line every --print-freq steps instead", "--no-progress", negate=True
    )
    quiet: bool = option(False, "print nothing while training: no bar, no log lines (read the metrics file)")
    metrics_path: str | None = option(
        None, "write one JSON record per report to this file", "--metrics", metavar="FILE.jsonl"
    )
    dump_params_path: str | None = option(
        None, "write every parameter by name to this file at the end", "--dump-params", metavar="FILE.npz"
    )
    init_params_path: str | None = option(
        None,
        "start from these parameters (names and layout as --dump-params)",
        "--init-params",
        metavar="FILE.npz",
    )
    dump_init_path: str | None = option(
        None,
        "write every parameter by name to this file before the first step",
        "--dump-init",
        metavar="FILE.npz",
    )
    checkpoint_dir: str | None = option(
        None, "directory for periodic checkpoints (and --resume)", "--checkpoint-dir", metavar="DIR"
    )
    checkpoint_every: int = option(
        0, "steps between checkpoints (0: none)", "--checkpoint-every", metavar="N"
    )
    resume: bool = option(False, "continue from the newest complete checkpoint", "--resume")
    resume_if_present: bool = option(
        False,
        "resume if --checkpoint-dir holds a checkpoint of this run, else start (for job schedulers)",
        "--resume-if-present",
    )
    force: bool = option(False, "replace outputs that exist", "--force", shared=True)
    """A library caller of :meth:`Trainer.fit` may replace existing output files (the CLI judges its outputs
    itself; never an input of the run, see :mod:`hotline.outputs`)."""


SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "optimizer": OptimizerSection,
    "data": DataSection,
    "placement": PlacementSection,
    "pipeline": PipelineSection,
    "store": StoreSection,
    "run": RunSection,
}
"""The sections by name, in the order ``hotline train --help`` shows them."""


def section_field(name: str):
    """The field ``name`` of one of the sections."""
    for section in SECTIONS.values():
        for f in fields(section):
            if f.name == name:
                return f
    raise KeyError(name)


APPLIES_TO: dict[str, tuple[str, tuple[str, ...]]] = {
    f.name: (on, tuple(str(v) for v in values))
    for section in SECTIONS.values()
    for f in fields(section)
    if f.metadata["applies_to"] is not None
    for on, values in [f.metadata["applies_to"]]
}
"""The one table of which field has an effect with which setting: field -> (the deciding field, its values).
``hotline train`` refuses each one's flag given elsewhere (:data:`hotline.cli.effects.MODE_FLAGS`, read from
here) and prefixes its help with the setting; the config refuses the strict ones set off their default."""


def flag_of(name: str) -> str:
    """The ``hotline train`` flag of field ``name``."""
    return section_field(name).metadata["flag"]


def applies_text(on_flag: str, values: tuple[str, ...]) -> str:
    """The setting a flag has an effect with, as its help's prefix says it: ``--mode hotline or auto``."""
    return f"{on_flag} {' or '.join(values)}"


def ignored_message(flag: str, on_flag: str, values: tuple[str, ...], setting: object) -> str:
    """The one sentence for a flag given where its setting ignores it (the CLI's and the config's)."""
    return (
        f"{flag} has an effect with {applies_text(on_flag, values)} only; {on_flag} {setting} would ignore it"
    )


def check_cold_cache(value, flag: str = "--cold-cache") -> None:
    """Raises ValueError (one line) unless ``value`` is a size flag's (``--cold-cache``, ``--cold-write-buffer``):
    bytes >= 0 or ``"auto"``."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return
    raise ValueError(f"{flag} must be a size >= 0 (bytes, e.g. 2GiB) or auto, got {value!r}")
