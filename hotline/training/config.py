"""The configuration of a training run: :class:`TrainConfig`, the sections of
:mod:`hotline.training.sections` in one flat dataclass whose fields are the flags of ``hotline train``,
checked when it is made."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from hotline.kinds import (
    COLD_STORES,
    MODES,
    ColdStoreKind,
    Interaction,
    MicroBatches,
    Mode,
    Optimizer,
    Replace,
)
from hotline.models.dlrm import DLRMConfig
from hotline.table_layout import check_optimizer
from hotline.training.sections import (
    APPLIES_TO,
    DataSection,
    ModelSection,
    OptimizerSection,
    PipelineSection,
    PlacementSection,
    RunSection,
    StoreSection,
    check_cold_cache,
    flag_of,
    ignored_message,
)

_KINDS = {
    "mode": Mode,
    "optimizer": Optimizer,
    "interaction": Interaction,
    "cold_store": ColdStoreKind,
    "micro_batches": MicroBatches,
    "replace": Replace,
}
"""The fields whose values are kinds: an enum member given is kept as its string (a checkpoint records
the config's strings, and ``torch.load(weights_only=True)`` refuses an enum class)."""


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
class TrainConfig(
    RunSection, StoreSection, PipelineSection, PlacementSection, DataSection, OptimizerSection, ModelSection
):
    """Everything a training run needs besides the dataset: the fields of every section of
    :mod:`hotline.training.sections` (model, optimizer, data, placement, pipeline, store, run) in one flat
    dataclass, checked when made. A kind (``mode``, ``optimizer``, ``interaction``, ``cold_store``, ...) may be
    given as its :mod:`hotline.kinds` enum member or its string; the config keeps the string."""

    @classmethod
    def named(cls, name: str) -> str:
        """Field ``name`` as a user knows it: its flag of ``hotline train`` (``mini_batch_size (--mini-batch-size)``),
        or its name alone for a library-only field."""
        flag = cls.__dataclass_fields__[name].metadata.get("flag")
        return f"{name} ({flag})" if flag else name

    def __post_init__(self) -> None:
        for name, kind in _KINDS.items():
            value = getattr(self, name)
            if isinstance(value, kind):
                setattr(self, name, value.value)
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {MODES}, got {self.mode!r}")
        for name in ("mini_batch_size", "nepochs", "print_freq", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{self.named(name)} must be positive, got {getattr(self, name)}")
        for name in ("num_batches", "test_freq", "lookahead", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.named(name)} must be >= 0, got {getattr(self, name)}")
        if self.replace not in tuple(Replace) or self.replace_every < 0:
            raise ValueError(
                f"--replace must be off or auto and --replace-every >= 0, got {self.replace!r}, {self.replace_every}"
            )
        self._check_strict()
        if not 0 < self.count_decay <= 1 or not 0 < self.replace_threshold < 1:
            raise ValueError("--count-decay must be in (0, 1] and --replace-threshold in (0, 1)")
        if self.eval_max_samples < 0:
            raise ValueError(f"--eval-max-samples must be >= 0 (0: all samples), got {self.eval_max_samples}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"--seed must be in [0, 2**32), got {self.seed}")
        if self.micro_batches not in tuple(MicroBatches):
            raise ValueError(f"--micro-batches must be auto, split or fused, got {self.micro_batches!r}")
        if (self.checkpoint_every or self.resume or self.resume_if_present) and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every and --resume need --checkpoint-dir")
        if self.threads < 0 or self.worker_threads < 1:
            raise ValueError(
                f"--threads must be >= 0 (0: all cores) and --worker-threads >= 1, got {self.threads} "
                f"and {self.worker_threads}"
            )
        if self.cold_store not in COLD_STORES:
            raise ValueError(f"--cold-store must be memory or disk, got {self.cold_store!r}")
        if self.cold_store == ColdStoreKind.DISK:
            if self.mode == Mode.DEVICE:  # auto prices the disk store (hotline.costmodel.auto)
                raise ValueError(
                    "--cold-store disk keeps the cold rows of --mode hybrid, hotline or auto (not --mode device)"
                )
            if not self.cold_dir:
                raise ValueError("--cold-store disk needs --cold-dir DIR (where its file goes)")
            if not os.path.isdir(self.cold_dir):
                raise ValueError(f"--cold-dir {self.cold_dir} is not a directory")
        if self.cold_io_depth < 1:
            raise ValueError(f"--cold-io-depth must be >= 1, got {self.cold_io_depth}")
        check_cold_cache(self.cold_cache)
        check_cold_cache(self.cold_write_buffer, "--cold-write-buffer")
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

    def _check_strict(self) -> None:
        """Refuses a strict field (:func:`hotline.training.sections.option`) set off its default where its
        setting ignores it, in the CLI's words, from the one table (:data:`APPLIES_TO`)."""
        for name, (on, values) in APPLIES_TO.items():
            f = self.__dataclass_fields__[name]
            if f.metadata["strict"] and getattr(self, on) not in values and getattr(self, name) != f.default:
                raise ValueError(ignored_message(flag_of(name), flag_of(on), values, getattr(self, on)))

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
        return bool(self.replace_every) or self.replace == Replace.AUTO

    @property
    def fused_micro_batches(self) -> bool:
        """Whether hotline steps run one fused pass instead of popular and non-popular micro-batches."""
        if self.micro_batches == MicroBatches.AUTO:
            return self.lookahead > 0
        return self.micro_batches == MicroBatches.FUSED

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
