"""The configuration of a training run: one dataclass whose fields are the flags of ``hotline train``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from hotline.models.dlrm import DLRMConfig
from hotline.table_layout import check_optimizer

MODES = ("device", "hybrid", "hotline", "auto")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` (or ``auto``) on a local rank of
    several -> ``cuda:LOCAL_RANK`` modulo the GPUs (each rank its own GPU; NCCL refuses two ranks on one);
    any other name as it is."""
    if device not in ("auto", "cuda"):
        return device
    if not torch.cuda.is_available():
        return "cpu" if device == "auto" else device
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= 1:
        return "cuda"
    return f"cuda:{int(local_rank) % torch.cuda.device_count()}"


@dataclass
class TrainConfig:
    """Everything a training run needs besides the dataset (flags keep the reference DLRM's names)."""

    mode: str = "device"
    """Where embedding rows live: ``device`` (all on the compute device), ``hybrid`` or ``hotline``; ``auto``
    (``hotline train``'s default) is resolved to one of them before training (:mod:`hotline.costmodel.auto`)."""
    embedding_dim: int = 16
    """``--arch-sparse-feature-size``."""
    bottom_mlp: list[int] = field(default_factory=lambda: [13, 512, 256, 64, 16])
    """``--arch-mlp-bot``."""
    top_mlp: list[int] = field(default_factory=lambda: [512, 256, 1])
    """``--arch-mlp-top``."""
    interaction: str = "dot"
    """``--arch-interaction-op``: dot, cat or dcn (DCN-v2's low-rank cross net, torchrec's DLRM_DCN)."""
    dcn_num_layers: int = 3
    """``--dcn-num-layers``: cross layers of the dcn interaction."""
    dcn_low_rank_dim: int = 512
    """``--dcn-low-rank-dim``: rank of each cross layer of the dcn interaction."""
    mini_batch_size: int = 128
    """Samples per mini-batch (one optimizer step each)."""
    learning_rate: float = 0.1
    """Learning rate of dense and sparse optimizers (the schedule's base rate)."""
    lr_warmup_steps: int = 0
    """``--lr-num-warmup-steps``: linear warm-up of both learning rates (hotline.training.schedule)."""
    lr_decay_start_step: int = 0
    """``--lr-decay-start-step``: first step of the quadratic decay."""
    lr_decay_steps: int = 0
    """``--lr-num-decay-steps``: steps the decay lasts (0: none)."""
    optimizer: str = "sgd"
    """``sgd`` or ``rowwise-adagrad`` (dense layers get plain Adagrad with it)."""
    nepochs: int = 1
    """Passes over the training split."""
    num_batches: int = 0
    """Stop after this many steps in total (0: run all epochs)."""
    print_freq: int = 256
    """Steps between progress reports (metrics records)."""
    test_freq: int = 0
    """Steps between validation runs (0: only at the end)."""
    eval_batch_size: int = 16384
    """Samples per evaluation forward pass."""
    eval_max_samples: int = 0
    """Evaluate on at most this many samples of val/test (0: all)."""
    seed: int = 0
    """Seed of model and embedding initialisation."""
    device: str = "cpu"
    """Compute device: cpu, cuda (cuda:N), or auto: cuda when torch sees a GPU, else cpu (resolved here; on
    one of several local ranks cuda and auto mean the rank's own GPU, cuda:LOCAL_RANK)."""
    threads: int = 0
    """torch and numba threads (0: all cores). A :class:`~hotline.training.trainer.Trainer` sets them while it
    lives (its :meth:`close` restores the counts before); with 0 it leaves the process's counts (``hotline
    train`` sets all cores, or each rank's share of them, first)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    quiet: bool = False
    """Print nothing while training: no bar, no log lines (a notebook reads the metrics file instead)."""
    metrics_path: str | None = None
    """``--metrics``: write one JSON record per report to this .jsonl file."""
    force: bool = False
    """``--force``: a library caller of :meth:`Trainer.fit` may replace existing output files (the CLI judges
    its outputs itself; never an input of the run, see :mod:`hotline.outputs`)."""
    dump_params_path: str | None = None
    """``--dump-params``: write every parameter by name to this .npz at the end."""
    init_params_path: str | None = None
    """``--init-params``: start from the parameters in this .npz (names and layout as ``--dump-params``)."""
    dump_init_path: str | None = None
    """``--dump-init``: write every parameter by name to this .npz before the first step."""
    placement_path: str | None = None
    """``--placement``: a Placement .npz for ``--mode hotline``."""
    hbm_budget: int | None = None
    """``--hbm-budget`` in bytes: profile first and place hot rows under it (``--mode hotline``)."""
    lookahead: int = 2
    """``--lookahead``: steps whose cold rows are gathered ahead of compute (hotline mode)."""
    worker_threads: int = 1
    """Numba threads of the look-ahead worker that dispatches and gathers (the rest compute)."""
    share_cores: bool = False
    """``--share-cores``: with look-ahead, torch's threads give up the cores the producer is measured to keep
    busy (:class:`hotline.pipeline.threads.CoreShare`); faster where they share few cores, but torch's
    reductions then run on fewer threads: equal to device mode up to reassociation, not bit-identical."""
    micro_batches: str = "auto"
    """hotline: ``split`` (popular then non-popular forward/backward), ``fused`` (one pass over the batch in
    order, hot rows and working rows together), or ``auto`` (split at look-ahead 0, where the popular
    micro-batch computes while the cold rows are gathered; fused with look-ahead, where they are ready)."""
    replace_every: int = 0
    """``--replace-every``: hotline re-chooses its hot rows from online access counts every N steps (0: never)."""
    replace: str = "off"
    """``--replace auto``: re-choose when the measured hot-lookup share falls ``replace_threshold`` below
    what the placement delivered in its first steps (``off``: only ``replace_every``)."""
    replace_threshold: float = 0.05
    """``--replace-threshold``: the fall in hot-lookup share (absolute, 0.05 = 5 points) that triggers auto."""
    count_decay: float = 0.99
    """``--count-decay``: per-step decay of the online access counts re-placement chooses from."""
    checkpoint_dir: str | None = None
    """``--checkpoint-dir``: where periodic checkpoints go (and ``--resume`` looks)."""
    checkpoint_every: int = 0
    """``--checkpoint-every``: steps between checkpoints (0: none)."""
    resume: bool = False
    """``--resume``: continue from the newest complete checkpoint in ``checkpoint_dir`` (an error if none)."""
    resume_if_present: bool = False
    """``--resume-if-present``: resume if ``checkpoint_dir`` holds a checkpoint, else start (job schedulers)."""
    cold_store: str = "memory"
    """``--cold-store``: where hybrid/hotline keep the cold rows: ``memory`` (host memory) or ``disk`` (a file
    in ``cold_dir``, read and written in place: tables beyond DRAM)."""
    cold_dir: str | None = None
    """``--cold-dir``: the directory of the disk store's file (``--cold-store disk``)."""
    cold_io_depth: int = 32
    """``--cold-io-depth``: I/O threads (reads in flight) of the disk store."""
    cold_cache: int = 0
    """``--cold-cache`` in bytes: the disk store's DRAM tier (its most popular rows kept in memory; 0: none)."""
    cold_direct: bool = True
    """``--no-cold-direct`` sets False: the disk store goes through the OS page cache instead of O_DIRECT."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {MODES}, got {self.mode!r}")
        for name in ("mini_batch_size", "nepochs", "print_freq", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_batches < 0 or self.test_freq < 0 or self.lookahead < 0 or self.checkpoint_every < 0:
            raise ValueError("num_batches, test_freq, lookahead and checkpoint_every must be >= 0")
        if self.replace not in ("off", "auto") or self.replace_every < 0:
            raise ValueError(
                f"--replace must be off or auto and --replace-every >= 0, got {self.replace!r}, {self.replace_every}"
            )
        if (self.replace_every or self.replace == "auto") and self.mode != "hotline":
            raise ValueError(
                "--replace-every and --replace auto re-place the hot rows of --mode hotline only"
            )
        if not 0 < self.count_decay <= 1 or not 0 < self.replace_threshold < 1:
            raise ValueError("--count-decay must be in (0, 1] and --replace-threshold in (0, 1)")
        if self.eval_max_samples < 0:
            raise ValueError(f"--eval-max-samples must be >= 0 (0: all samples), got {self.eval_max_samples}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"--seed must be in [0, 2**32), got {self.seed}")
        if self.micro_batches not in ("auto", "split", "fused"):
            raise ValueError(f"--micro-batches must be auto, split or fused, got {self.micro_batches!r}")
        if (self.checkpoint_every or self.resume or self.resume_if_present) and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every and --resume need --checkpoint-dir")
        if self.threads < 0 or self.worker_threads < 1:
            raise ValueError(
                f"--threads must be >= 0 (0: all cores) and --worker-threads >= 1, got {self.threads} "
                f"and {self.worker_threads}"
            )
        if self.cold_store not in ("memory", "disk"):
            raise ValueError(f"--cold-store must be memory or disk, got {self.cold_store!r}")
        if self.cold_store == "disk":
            if self.mode == "device":  # auto prices the disk store (hotline.costmodel.auto)
                raise ValueError(
                    "--cold-store disk keeps the cold rows of --mode hybrid, hotline or auto (not --mode device)"
                )
            if not self.cold_dir:
                raise ValueError("--cold-store disk needs --cold-dir DIR (where its file goes)")
            if not os.path.isdir(self.cold_dir):
                raise ValueError(f"--cold-dir {self.cold_dir} is not a directory")
        elif self.cold_dir:
            raise ValueError("--cold-dir is the directory of --cold-store disk")
        if self.cold_io_depth < 1 or self.cold_cache < 0:
            raise ValueError(
                f"--cold-io-depth must be >= 1 and --cold-cache >= 0, got {self.cold_io_depth}, {self.cold_cache}"
            )
        from hotline.models.dlrm import check_dcn

        check_dcn(self.dcn_num_layers, self.dcn_low_rank_dim)
        self.device = resolve_device(self.device)
        try:
            device = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"--device {self.device!r} is not a device: {e}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"--device {self.device}: CUDA is not available to this torch ({torch.__version__})"
            )
        check_optimizer(self.optimizer, self.learning_rate, self.embedding_dim)  # the tiers' rule
        _ = self.lr_schedule  # validates the schedule's steps

    @property
    def lr_schedule(self):
        """The learning rate of every step (dense and sparse alike)."""
        from hotline.training.schedule import LRSchedule

        return LRSchedule(
            self.learning_rate, self.lr_warmup_steps, self.lr_decay_start_step, self.lr_decay_steps
        )

    @property
    def replaces(self) -> bool:
        """Whether the hot rows follow the data during the run."""
        return bool(self.replace_every) or self.replace == "auto"

    @property
    def fused_micro_batches(self) -> bool:
        """Whether hotline steps run one fused pass instead of popular and non-popular micro-batches."""
        if self.micro_batches == "auto":
            return self.lookahead > 0
        return self.micro_batches == "fused"

    def model_config(self, table_sizes: list[int]) -> DLRMConfig:
        return DLRMConfig(
            table_sizes=list(table_sizes),
            embedding_dim=self.embedding_dim,
            bottom_mlp=list(self.bottom_mlp),
            top_mlp=list(self.top_mlp),
            interaction=self.interaction,
            dcn_num_layers=self.dcn_num_layers,
            dcn_low_rank_dim=self.dcn_low_rank_dim,
        )
