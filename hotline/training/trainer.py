"""The training loop: batches in file order, one exact step per mini-batch, periodic evaluation and metrics."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hotline.datasets.format import Dataset, Split
from hotline.metrics import accuracy, log_loss, roc_auc
from hotline.model import DLRM, DLRMConfig
from hotline.modes import DeviceMode, StepStats, TrainMode
from hotline.sparse_optim import SparseOptimizer

MODES = ("device", "hybrid", "hotline")


@dataclass
class TrainConfig:
    """Everything a training run needs besides the dataset (flags keep the reference DLRM's names)."""

    mode: str = "device"
    """Where embedding rows live: ``device`` (all on the compute device), ``hybrid`` or ``hotline``."""
    embedding_dim: int = 16
    """``--arch-sparse-feature-size``."""
    bottom_mlp: list[int] = field(default_factory=lambda: [13, 512, 256, 64, 16])
    """``--arch-mlp-bot``."""
    top_mlp: list[int] = field(default_factory=lambda: [512, 256, 1])
    """``--arch-mlp-top``."""
    interaction: str = "dot"
    """``--arch-interaction-op``: dot or cat."""
    mini_batch_size: int = 128
    """Samples per mini-batch (one optimizer step each)."""
    learning_rate: float = 0.1
    """Learning rate of dense and sparse optimizers."""
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
    """Compute device: cpu or cuda."""
    threads: int = 0
    """torch and numba threads (0: all cores)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    metrics_path: str | None = None
    """``--metrics``: write one JSON record per report to this .jsonl file."""
    dump_params_path: str | None = None
    """``--dump-params``: write every parameter by name to this .npz at the end."""
    placement_path: str | None = None
    """``--placement``: a Placement .npz for ``--mode hotline``."""
    hbm_budget: int | None = None
    """``--hbm-budget`` in bytes: profile first and place hot rows under it (``--mode hotline``)."""
    lookahead: int = 2
    """``--lookahead``: steps whose cold rows are gathered ahead of compute (hotline mode)."""
    worker_threads: int = 1
    """Numba threads of the look-ahead worker that dispatches and gathers (the rest compute)."""
    micro_batches: str = "auto"
    """hotline: ``split`` (popular then non-popular forward/backward), ``fused`` (one pass over the batch in
    order, hot rows and working rows together), or ``auto`` (split at look-ahead 0, where the popular
    micro-batch computes while the cold rows are gathered; fused with look-ahead, where they are ready)."""
    checkpoint_dir: str | None = None
    """``--checkpoint-dir``: where periodic checkpoints go (and ``--resume`` looks)."""
    checkpoint_every: int = 0
    """``--checkpoint-every``: steps between checkpoints (0: none)."""
    resume: bool = False
    """``--resume``: continue from the newest complete checkpoint in ``checkpoint_dir``."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {MODES}, got {self.mode!r}")
        for name in ("mini_batch_size", "nepochs", "print_freq", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_batches < 0 or self.test_freq < 0 or self.lookahead < 0 or self.checkpoint_every < 0:
            raise ValueError("num_batches, test_freq, lookahead and checkpoint_every must be >= 0")
        if self.micro_batches not in ("auto", "split", "fused"):
            raise ValueError(f"--micro-batches must be auto, split or fused, got {self.micro_batches!r}")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every and --resume need --checkpoint-dir")
        if self.threads < 0 or self.worker_threads < 1:
            raise ValueError(
                f"--threads must be >= 0 (0: all cores) and --worker-threads >= 1, got {self.threads} "
                f"and {self.worker_threads}"
            )
        try:
            device = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"--device {self.device!r} is not a device: {e}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"--device {self.device}: CUDA is not available to this torch ({torch.__version__})"
            )
        SparseOptimizer(self.optimizer, self.learning_rate)  # validates optimizer and learning rate

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
        )


def configure_threads(threads: int) -> int:
    """Sets torch's and numba's thread counts on purpose (they share the cores, one after the other)."""
    import numba

    n = threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return n


def build_mode(config: TrainConfig, dataset: Dataset) -> TrainMode:
    """The TrainMode object for ``config.mode``."""
    opt = SparseOptimizer(config.optimizer, config.learning_rate)
    if config.mode == "device":
        return DeviceMode(dataset.table_sizes, config.embedding_dim, opt, config.seed, config.device)
    from hotline.tiers import build_tiered_mode  # the hybrid and hotline modes

    return build_tiered_mode(config, dataset, opt)


class Trainer:
    """Trains a DLRM on a dataset directory with one of the training modes."""

    def __init__(self, config: TrainConfig, dataset: Dataset | str | os.PathLike):
        self.config = config
        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        if self.dataset.num_dense != config.bottom_mlp[0]:
            raise ValueError(
                f"--arch-mlp-bot starts with {config.bottom_mlp[0]} but the dataset has "
                f"{self.dataset.num_dense} dense features"
            )
        self.model = DLRM(config.model_config(self.dataset.table_sizes), seed=config.seed).to(config.device)
        self.sparse_opt = SparseOptimizer(config.optimizer, config.learning_rate)
        self.dense_opt = self.sparse_opt.dense_optimizer(self.model.parameters())
        self.mode = self._build_mode()
        self.step_count = 0
        self._executor = None
        self.history: list[dict] = []
        self._metrics_file = None

    def _build_mode(self) -> TrainMode:
        """The training mode (a hook: the distributed trainer builds sharded modes)."""
        return build_mode(self.config, self.dataset)

    def _checkpoint_manager(self):
        """The periodic checkpoint manager, or None (a hook: distributed runs write one file per rank)."""
        from hotline.checkpoint import CheckpointManager

        return CheckpointManager(self.config.checkpoint_dir) if self.config.checkpoint_dir else None

    # -- running ---------------------------------------------------------------------------------------
    def train_steps(self) -> int:
        """Total number of steps this run will take."""
        per_epoch = self.dataset.train.num_batches(self.config.mini_batch_size)
        total = per_epoch * self.config.nepochs
        return min(total, self.config.num_batches) if self.config.num_batches else total

    def batches(self, start_step: int = 0):
        """The training batches in order (epoch by epoch, file order) from step ``start_step`` to ``train_steps``."""
        per_epoch = self.dataset.train.num_batches(self.config.mini_batch_size)
        remaining = self.train_steps() - start_step
        epoch, first = divmod(start_step, per_epoch) if per_epoch else (0, 0)
        for _ in range(epoch, self.config.nepochs):
            for batch in self.dataset.train.batches(self.config.mini_batch_size, start_batch=first):
                if remaining <= 0:
                    return
                remaining -= 1
                yield batch
            first = 0

    def step(self, batch) -> StepStats:
        """One exact mini-batch step: forward/backward through the mode, then one dense optimizer step."""
        self.dense_opt.zero_grad(set_to_none=True)
        stats = self.mode.step(self.model, batch)
        t0 = time.perf_counter()
        self.dense_opt.step()
        stats.times["dense_update"] = stats.times.get("dense_update", 0.0) + time.perf_counter() - t0
        self.step_count += 1
        return stats

    def fit(self) -> dict:
        """Runs the whole training; returns the summary record (also the last line of ``--metrics``)."""
        from tqdm import tqdm  # imported here: the GPU benchmark image has no tqdm and never calls fit()

        cfg = self.config
        total = self.train_steps()
        if total == 0:
            raise ValueError(f"the training split of {self.dataset.path} has no rows to train on")
        checkpoints = self._checkpoint_manager()
        if cfg.resume and checkpoints is not None and checkpoints.resume(self) is not None:
            print(f"resumed from {checkpoints.latest()} at step {self.step_count}", file=sys.stderr)
        if cfg.metrics_path:
            Path(cfg.metrics_path).parent.mkdir(parents=True, exist_ok=True)
            self._metrics_file = open(cfg.metrics_path, "a" if self.step_count else "w")
        bar = tqdm(
            total=total, initial=self.step_count, disable=not cfg.progress, unit="step", dynamic_ncols=True
        )
        window = _Window()
        start = time.perf_counter()
        samples_total = 0
        try:
            for stats in self.progress(self.batches(self.step_count)):
                window.add(stats)
                samples_total += stats.samples
                bar.update(1)
                if not math.isfinite(stats.loss_sum):
                    kept = f"; the last good checkpoint is {checkpoints.latest()}" if checkpoints else ""
                    raise FloatingPointError(
                        f"loss became {stats.loss_sum} at step {self.step_count}: training stopped before saving "
                        f"anything of this step{kept} (lower --learning-rate?)"
                    )
                if self.step_count % cfg.print_freq == 0 or self.step_count == total:
                    rec = window.report(self.step_count)
                    postfix = {"loss": f"{rec['loss']:.4f}", "sps": f"{rec['samples_per_s']:.0f}"}
                    if "overlap_ratio" in rec:
                        postfix["overlap"] = f"{rec['overlap_ratio']:.2f}"
                    bar.set_postfix(postfix)
                    self._emit(rec)
                    window = _Window()
                if (
                    checkpoints is not None
                    and cfg.checkpoint_every
                    and self.step_count % cfg.checkpoint_every == 0
                ):
                    self.quiesce()
                    checkpoints.save(self)
                if cfg.test_freq and self.step_count % cfg.test_freq == 0 and self.step_count < total:
                    self._emit({"kind": "eval", "step": self.step_count, **self.evaluate("val")})
        finally:
            bar.close()
        elapsed = time.perf_counter() - start
        val = self.evaluate("val")
        test = self.evaluate("test")
        summary = {
            "kind": "summary",
            "mode": cfg.mode,
            "steps": self.step_count,
            "samples": samples_total,
            "train_seconds": elapsed,
            "samples_per_s": samples_total / elapsed if elapsed > 0 else 0.0,
            **{f"val_{k}": v for k, v in val.items()},
            **{f"test_{k}": v for k, v in test.items()},
        }
        self._emit(summary)
        if self._metrics_file:
            self._metrics_file.close()
            self._metrics_file = None
        if cfg.dump_params_path:
            self.dump_params(cfg.dump_params_path)
        return summary

    def progress(self, batches):
        """Runs a step per batch, yielding each step's stats; ``hotline`` mode goes through the pipelined
        executor (look-ahead ``config.lookahead``)."""
        if self.config.mode != "hotline":
            for batch in batches:
                yield self.step(batch)
            return
        from hotline.executor import Executor

        executor = Executor(
            self.mode,
            self._compute_prepared,
            lookahead=self.config.lookahead,
            worker_threads=self.config.worker_threads,
        )
        self._executor = executor
        try:
            yield from executor.progress(batches)
        finally:
            self._executor = None

    def quiesce(self) -> None:
        """Waits until every computed step's rows are back in host memory (before a checkpoint or an export)."""
        if self._executor is not None:
            self._executor.drain()

    def _compute_prepared(self, prep) -> StepStats:
        """The compute of one prepared hotline step: both micro-batches, sparse and dense optimizer steps."""
        self.dense_opt.zero_grad(set_to_none=True)
        stats = self.mode.compute(self.model, prep)
        t0 = time.perf_counter()
        self.dense_opt.step()
        stats.times["dense_update"] = time.perf_counter() - t0
        self.step_count += 1
        return stats

    def _emit(self, record: dict) -> None:
        self.history.append(record)
        if self._metrics_file:
            self._metrics_file.write(json.dumps(record) + "\n")
            self._metrics_file.flush()

    # -- evaluation and export ------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, split: Split, max_samples: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Click probabilities and labels of a split (the first ``max_samples`` if given)."""
        self.model.eval()
        probs, labels = [], []
        n = min(len(split), max_samples) if max_samples else len(split)
        for start in range(0, n, self.config.eval_batch_size):
            b = split.batch(start, min(start + self.config.eval_batch_size, n))
            dense = torch.from_numpy(b.dense).to(self.config.device)
            logits = self.model(dense, self.mode.pooled_eval(b.sparse))
            probs.append(torch.sigmoid(logits).cpu().numpy())
            labels.append(b.labels)
        self.model.train()
        if not probs:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(probs), np.concatenate(labels)

    def evaluate(self, split_name: str) -> dict:
        """log-loss, AUC and accuracy on a split (NaN where the split is empty)."""
        probs, labels = self.predict(self.dataset.split(split_name), self.config.eval_max_samples)
        if probs.size == 0:
            return {"auc": float("nan"), "logloss": float("nan"), "accuracy": float("nan"), "samples": 0}
        return {
            "auc": roc_auc(labels, probs),
            "logloss": log_loss(labels, probs),
            "accuracy": accuracy(labels, probs),
            "samples": int(probs.size),
        }

    def named_arrays(self) -> dict[str, np.ndarray]:
        """Every parameter by name; embedding tables in original row order as ``embedding.table_{t}``."""
        out = {f"model.{k}": v.detach().cpu().numpy() for k, v in self.model.named_parameters()}
        for t, w in enumerate(self.mode.export_tables()):
            out[f"embedding.table_{t}"] = w
        return out

    def dump_params(self, path: str | os.PathLike) -> None:
        np.savez(path, **self.named_arrays())

    def close(self) -> None:
        self.mode.close()


class _Window:
    """Accumulates step stats between two reports."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.loss = 0.0
        self.samples = 0
        self.steps = 0
        self.times: dict[str, float] = {}
        self.counters: dict[str, float] = {}

    def add(self, s: StepStats) -> None:
        self.loss += s.loss_sum
        self.samples += s.samples
        self.steps += 1
        for k, v in s.times.items():
            self.times[k] = self.times.get(k, 0.0) + v
        for k, v in s.counters.items():
            self.counters[k] = self.counters.get(k, 0.0) + v

    def report(self, step: int) -> dict:
        from hotline.executor import overlap_ratio

        elapsed = time.perf_counter() - self.start
        rec = {
            "kind": "train",
            "step": step,
            "loss": self.loss / max(self.samples, 1),
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
            "time_s": {k: round(v, 6) for k, v in self.times.items()},
            **{k: v for k, v in self.counters.items()},
        }
        if "popular_samples" in self.counters:
            rec["popular_sample_share"] = self.counters["popular_samples"] / max(self.samples, 1)
        if "stall" in self.times:
            rec["overlap_ratio"] = overlap_ratio(self.times)
        return rec
