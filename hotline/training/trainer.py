"""The training loop of one rank (N = 1 is a plain run): batches in file order, one exact step per global
mini-batch, periodic evaluation, metrics and checkpoints.

On N ranks (``torchrun`` or ``hotline train --nproc N``) every rank runs a :class:`Trainer` with the run's
:class:`~hotline.distributed.comm.Comm`:

- each global mini-batch of B samples is cut into N contiguous shards (rank r: samples [r*B/N, (r+1)*B/N));
- the loss is normalised by the GLOBAL batch size, so the ranks' gradients add up to one process's gradient;
- dense gradients (and the step's loss and counters) are summed by ONE all-reduce of a flat buffer, then every
  rank takes the same dense optimizer step;
- embedding rows: the mode's own business (``hotline.tiers``: the hot tier replicated, the cold store sharded).

With one rank every collective is a no-op and is skipped.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch

from hotline import _io
from hotline._malloc import keep_freed_memory
from hotline.datasets.format import Batch, Dataset, Split
from hotline.distributed.comm import Comm, shard_bounds
from hotline.models.dlrm import DLRM
from hotline.pipeline.threads import bind_device, hold_threads
from hotline.tiers.base import StepStats, TrainMode
from hotline.tiers.sparse_optim import SparseOptimizer
from hotline.training.config import TrainConfig, resolve_device
from hotline.training.dense_sync import all_reduce_dense
from hotline.training.logs import LogLines
from hotline.training.metrics import accuracy, log_loss, roc_auc
from hotline.training.params import check_params, read_params
from hotline.training.preflight import (
    check_all_values,
    check_dense_memory,
    check_ids,
    check_memory,
    check_values,
    finite_json,
    resolve_cold_cache,
)
from hotline.training.window import StepWindow


class Trainer:
    """Trains a DLRM on a dataset directory with one of the training modes, as one rank of ``comm``."""

    def __init__(
        self,
        config: TrainConfig,
        dataset: Dataset | str | os.PathLike,
        comm: Comm | None = None,
        hardware: str | dict | None = None,
    ):
        """``mode='auto'`` is resolved here, after the cheap checks of the config against the dataset, by the
        cost model (:func:`hotline.costmodel.auto.resolve`: rank 0 chooses, every rank takes its choice;
        :attr:`auto_choice` keeps it and :meth:`fit` prints it). ``hardware``: the description it prices (a
        JSON file, a known GPU's name such as ``"H100"``, or a dict; None: this machine, calibrated)."""
        keep_freed_memory()  # a step's large buffers stay mapped between steps (see hotline._malloc)
        self.comm = comm if comm is not None else Comm()
        if self.comm.rank:  # one progress bar and one metrics file: rank 0's
            config = replace(config, progress=False, metrics_path=None)
        if resolve_device(config.device) != config.device:  # made before this rank's LOCAL_RANK was known
            config = replace(config, device=resolve_device(config.device))
        bind_device(config.device)  # the process's CUDA device: nothing implicit lands on GPU 0
        self._restore_threads = hold_threads(config.threads)  # before --mode auto times anything
        try:
            self._start(config, dataset, hardware)
        except BaseException:
            self._restore_threads()
            raise

    def _start(self, config: TrainConfig, dataset, hardware) -> None:
        """The rest of :meth:`__init__`, under the thread counts of ``config.threads``."""
        self.config = config
        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        if self.dataset.num_dense != config.bottom_mlp[0]:
            raise ValueError(
                f"--arch-mlp-bot starts with {config.bottom_mlp[0]} but the dataset has "
                f"{self.dataset.num_dense} dense features"
            )
        self.auto_choice = None
        """``mode='auto'``'s :class:`~hotline.costmodel.choose.AutoChoice` (None for another mode)."""
        self._auto_profile = None  # the profile the choice was priced with: the placement's too
        if config.mode == "auto":
            self._check_data()  # before the choice profiles and times anything
            # the dense model's size, before the choice builds one to time it
            check_dense_memory(config, self.dataset, self.comm.world_size, tables=False)
            from hotline.costmodel.auto import resolve_profiled  # rank 0's choice, taken by every rank

            config, self.auto_choice, self._auto_profile = resolve_profiled(
                config, self.dataset, self.comm, hardware
            )
            self.config = config
        self.config = config = resolve_cold_cache(config, self.dataset, self.comm.world_size)  # auto: bytes
        check_memory(config, self.dataset, self.comm.world_size)  # the tables first: the usual shortfall
        check_dense_memory(config, self.dataset, self.comm.world_size)  # with them, before the model is built
        self.model = DLRM(config.model_config(self.dataset.table_sizes), seed=config.seed).to(config.device)
        self.sparse_opt = SparseOptimizer(config.optimizer, config.learning_rate, dim=config.embedding_dim)
        self.dense_opt = self.sparse_opt.dense_optimizer(self.model.parameters())
        self._lr_schedule = config.lr_schedule
        self.mode = self._build_mode()
        if config.init_params_path:
            self.load_params(read_params(config.init_params_path))
        if config.replaces:  # counted from the first step (a checkpoint restores them)
            from hotline.pipeline.replacement import start_counting

            start_counting(self.mode, config)
        self.step_count = 0
        self.announce: str | None = self.auto_choice.line() if self.auto_choice and not config.quiet else None
        """A line :meth:`fit` prints once its checks pass, before step 1 (``--mode auto``'s choice)."""
        self._executor = None
        self.history: list[dict] = []
        self._metrics_file = None
        self._checkpoints = None

    def _build_mode(self) -> TrainMode:
        from hotline.tiers.build import build_mode
        from hotline.training.placing import placement_for

        cfg = self.config
        placement = None
        prof, self._auto_profile = self._auto_profile, None  # used once, not kept
        if cfg.mode != "device":
            placement = placement_for(cfg, self.dataset, cfg.progress, prof, self.comm)  # rank 0 profiles
        del prof  # its rank (4 bytes a row) freed before the stores are built
        return build_mode(cfg, self.dataset, placement, self.comm)

    def _checkpoint_manager(self):
        """The periodic checkpoint manager, or None."""
        from hotline.training.checkpoint_dir import CheckpointManager

        d = self.config.checkpoint_dir
        return CheckpointManager(d, self.comm) if d else None

    # -- running ---------------------------------------------------------------------------------------
    def train_steps(self) -> int:
        """Total number of steps this run will take."""
        per_epoch = self.dataset.train.num_batches(self.config.mini_batch_size)
        total = per_epoch * self.config.nepochs
        return min(total, self.config.num_batches) if self.config.num_batches else total

    def batches(self, start_step: int = 0):
        """This rank's shards of the training batches in order (epoch by epoch, file order) from step
        ``start_step`` to ``train_steps`` (reads only its own rows)."""
        cfg, split = self.config, self.dataset.train
        B, N, r = cfg.mini_batch_size, self.comm.world_size, self.comm.rank
        per_epoch = split.num_batches(B)
        remaining = self.train_steps() - start_step
        epoch, first = divmod(start_step, per_epoch) if per_epoch else (0, 0)
        for _ in range(epoch, cfg.nepochs):
            for b in range(first, per_epoch):
                if remaining <= 0:
                    return
                remaining -= 1
                start, stop = b * B, min((b + 1) * B, len(split))
                lo, hi = shard_bounds(stop - start, r, N)
                batch = split.batch(start + lo, start + hi, global_size=stop - start)
                check_values(self.dataset.path, split, start + lo, batch.dense, batch.labels)
                yield batch
            first = 0

    def _schedule_lr(self) -> None:
        """Sets the dense and sparse learning rates of the step about to run (``config.lr_schedule``)."""
        if self._lr_schedule.constant:
            return
        lr = self._lr_schedule.lr(self.step_count)
        for group in self.dense_opt.param_groups:
            group["lr"] = lr
        self.mode.optimizer.set_lr(lr)

    def step(self, batch: Batch) -> StepStats:
        """One exact mini-batch step: forward/backward through the mode, then one dense optimizer step."""
        self._schedule_lr()
        self.dense_opt.zero_grad(set_to_none=True)
        return self._dense_step(self.mode.step(self.model, batch), batch)

    def _compute_prepared(self, prep) -> StepStats:
        """The compute of one prepared tiered step: both micro-batches, sparse and dense optimizer steps."""
        self._schedule_lr()
        self.dense_opt.zero_grad(set_to_none=True)
        return self._dense_step(self.mode.compute(self.model, prep), prep.batch)

    def _dense_step(self, stats: StepStats, batch: Batch) -> StepStats:
        """The dense all-reduce (N > 1) and optimizer step that finish a step."""
        if self.comm.world_size > 1:
            t0 = time.perf_counter()
            all_reduce_dense(self.comm, self.model, stats)
            stats.times["dense_allreduce"] = time.perf_counter() - t0
            stats.samples = batch.loss_normaliser
        t1 = time.perf_counter()
        phases = getattr(self.mode, "phases", None)  # device-clock phase timing, when a benchmark asks for it
        timed = phases.phase("dense_update", step=self.step_count) if phases is not None else None
        with timed or contextlib.nullcontext():
            self.dense_opt.step()
        stats.times["dense_update"] = stats.times.get("dense_update", 0.0) + time.perf_counter() - t1
        for k, v in self.comm.take_bytes().items():  # plus what the look-ahead thread sent for this step
            stats.counters[f"bytes_sent_{k}"] = stats.counters.get(f"bytes_sent_{k}", 0.0) + v
        self.step_count += 1
        return stats

    def _check_data(self) -> None:
        """Every split's ids, dense values and labels, read once (before the first step, or before --mode
        auto's choice): a bad one is named with its file and row now, not at its step hours later."""
        if getattr(self, "_data_checked", False):
            return
        check_ids(self.dataset)
        check_all_values(self.dataset)  # a NaN, a 3e38 or a label 2.0, with its file, row and column
        self._data_checked = True

    def fit(self, outputs=None) -> dict:
        """Runs the whole training; returns the summary record (also the last line of ``--metrics``).

        ``outputs``: the run's outputs as :func:`hotline.outputs.claim` judged and locked them (the CLI claims
        them before loading anything); None: claimed here, refusing to replace an existing file unless the
        config's ``force``."""
        own = None
        if outputs is None:
            outputs = own = self._claim_outputs()
        try:
            return self._fit(outputs)
        finally:
            if self._metrics_file is not None:  # a failed run: a file that never got a record stays as it was
                self._metrics_file.abort()
                self._metrics_file = None
            if own is not None:
                own.release()

    def _claim_outputs(self):
        """The config's outputs, judged and locked by rank 0 (a rank started by ``--nproc``: its launcher did)."""
        from hotline import outputs
        from hotline.training.preflight import train_inputs, train_outputs

        declared = train_outputs(self.config, world_size=self.comm.world_size)
        if self.comm.rank or os.environ.get("HOTLINE_LAUNCHED"):
            return outputs.unclaimed(declared)
        return outputs.claim(declared, train_inputs(self.config, self.dataset.path), force=self.config.force)

    def _fit(self, outputs) -> dict:
        from tqdm import tqdm  # imported here: the GPU benchmark image has no tqdm and never calls fit()

        from hotline.outputs import LineFile, records_up_to
        from hotline.tiers.tiered import measured_figures

        cfg = self.config
        self._check_data()
        total = self.train_steps()
        if total == 0:
            raise ValueError(f"the training split of {self.dataset.path} has no rows to train on")
        checkpoints = self._checkpoints = self._checkpoint_manager()
        resume = cfg.resume or cfg.resume_if_present
        resumed = checkpoints.start(self, resume, cfg.resume_if_present) if checkpoints is not None else None
        if resumed is not None:
            print(f"resumed from {checkpoints.latest()} at step {self.step_count}", file=sys.stderr)
        if self.announce and self.comm.rank == 0:  # every check passed: training starts now
            print(self.announce, file=sys.stderr)
        if cfg.metrics_path:  # whole lines only; a resumed run replaces the records of the steps it replays
            keep = records_up_to(self.step_count) if resume else None
            self._metrics_file = LineFile(outputs.path("--metrics", cfg.metrics_path), keep)
        if cfg.dump_init_path:  # the parameters this run's first step starts from (after --resume/--load)
            self.dump_params(outputs.path("--dump-init", cfg.dump_init_path), force=True)  # claimed above
        # no bar without a TTY: a line per report; nothing at all when quiet
        log = LogLines(self.comm.rank == 0 and not cfg.quiet, bar=cfg.progress and not cfg.quiet)
        bar = tqdm(total=total, initial=self.step_count, disable=not log.bar, unit="step", dynamic_ncols=True)
        log.before_first_step()
        window = StepWindow()
        run = StepWindow()  # the whole run's counters: the summary's measured figures
        start = time.perf_counter()
        samples_total = 0
        try:
            pending = None  # the previous step, whose loss is read now: reading it costs no wait for this one
            for stats in self.progress(self.batches(self.step_count)):
                self._check_loss(pending, checkpoints)
                pending = (stats, self.step_count)
                window.add(stats)
                run.add(stats)
                samples_total += stats.samples
                bar.update(1)
                log.after_step(bar, self.step_count)
                reports = self.step_count % cfg.print_freq == 0 or self.step_count == total
                saves = (
                    checkpoints is not None
                    and cfg.checkpoint_every
                    and self.step_count % cfg.checkpoint_every == 0
                )
                if reports or saves or (cfg.test_freq and self.step_count % cfg.test_freq == 0):
                    self._check_loss(pending, checkpoints)  # nothing is reported or saved of a diverged step
                    pending = None
                if reports:
                    rec = window.report(self.step_count)
                    postfix = {"loss": f"{rec['loss']:.4f}", "sps": f"{rec['samples_per_s']:.0f}"}
                    if "overlap_ratio" in rec:
                        postfix["overlap"] = f"{rec['overlap_ratio']:.2f}"
                    bar.set_postfix(postfix)
                    log.report(rec, total)
                    self._emit(rec)
                    window = StepWindow()
                paused = time.perf_counter()
                if saves:
                    self.quiesce()
                    checkpoints.save(self)
                if cfg.test_freq and self.step_count % cfg.test_freq == 0 and self.step_count < total:
                    self._emit({"kind": "eval", "step": self.step_count, **self.evaluate("val")})
                window.start += time.perf_counter() - paused  # a window's ms/step: training steps only
            self._check_loss(pending, checkpoints)
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
            **measured_figures(run.counters, run.samples, run.steps),
            **{f"val_{k}": v for k, v in val.items()},
            **{f"test_{k}": v for k, v in test.items()},
        }
        self._emit(summary)
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None
        if cfg.dump_params_path:
            self.dump_params(outputs.path("--dump-params", cfg.dump_params_path), force=True)
        return summary

    @staticmethod
    def _check_loss(pending, checkpoints) -> None:
        """Raises FloatingPointError if the step's loss is not finite (``pending``: its stats and step)."""
        if pending is None:
            return
        stats, step = pending
        stats.loss_sum = float(stats.loss_sum)
        if not math.isfinite(stats.loss_sum):
            kept = f"; the last good checkpoint is {checkpoints.latest()}" if checkpoints else ""
            raise FloatingPointError(
                f"loss became {stats.loss_sum} at step {step}: training stopped before saving anything of this "
                f"step{kept} (lower --learning-rate?)"
            )

    def progress(self, batches):
        """Runs a step per batch, yielding each step's stats; ``hotline`` mode goes through the pipelined
        executor (look-ahead ``config.lookahead``). Every collective runs in the same order on all ranks."""
        self.comm.take_bytes()  # each step reports only its own traffic
        if self.config.mode != "hotline":
            for batch in batches:
                yield self.step(batch)
            return
        from hotline.pipeline.executor import Executor

        executor = Executor(
            self.mode,
            self._compute_prepared,
            lookahead=self.config.lookahead,
            worker_threads=self.config.worker_threads,
            share_cores=self.config.share_cores,
        )
        self._executor = executor
        try:
            if self.config.replaces:
                from hotline.pipeline.replacement import progress_replacing

                def on_replace(record):
                    self._emit({**record, "step": self.step_count})

                yield from progress_replacing(
                    executor.progress, batches, self.mode, self.config, on_replace, self.step_count
                )
            else:
                yield from executor.progress(batches)
        finally:
            self._executor = None

    def quiesce(self) -> None:
        """Waits until every computed step's rows are back in host memory (before a checkpoint or an export)."""
        if self._executor is not None:
            self._executor.drain()

    def _emit(self, record: dict) -> None:
        self.history.append(record)
        if self._metrics_file:
            self._metrics_file.write_line(finite_json(record))  # strict JSON: NaN is null

    # -- evaluation and export ------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, split: Split, max_samples: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Click probabilities and labels of a split (the first ``max_samples`` if given): each rank scores
        its shard of every eval batch (a collective on N ranks)."""
        from tqdm import tqdm

        self.model.eval()
        N, r = self.comm.world_size, self.comm.rank
        probs, labels = [], []
        n = min(len(split), max_samples) if max_samples else len(split)
        shown = self.config.progress and sys.stderr.isatty() and n > self.config.eval_batch_size
        bar = tqdm(total=n, disable=not shown, unit="sample", desc=f"eval {split.name}", leave=False)
        for start in range(0, n, self.config.eval_batch_size):
            stop = min(start + self.config.eval_batch_size, n)
            lo, hi = shard_bounds(stop - start, r, N)
            b = split.batch(start + lo, start + hi)
            check_values(self.dataset.path, split, start + lo, b.dense, b.labels)
            pooled = self.mode.pooled_eval(b.sparse)
            if len(b):
                dense = torch.from_numpy(b.dense).to(self.config.device)
                local = torch.sigmoid(self.model(dense, pooled)).cpu()
            else:
                local = torch.zeros(0)
            probs.append(torch.cat(self.comm.all_gather_varlen(local, "eval")).numpy())
            labels.append(np.array(split.labels[start:stop]))
            bar.update(stop - start)
        bar.close()
        self.comm.take_bytes()
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

    def dump_params(self, path: str | os.PathLike, force: bool = False) -> None:
        """Every parameter by name (gathered from all ranks) to ``path`` (.npz), written atomically by rank 0.
        An existing file is replaced only with ``force``; a dataset file never (:func:`hotline.outputs.guard`)."""
        if self.comm.rank == 0:
            from hotline.outputs import guard

            path = guard("dump_params path", path, [("dataset", self.dataset.path)], force=force)
        arrays = self.named_arrays()
        if self.comm.rank == 0:
            _io.atomic_write(path, lambda f: np.savez(f, **arrays))
        self.comm.barrier()

    def load_params(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replaces every parameter by name (as :meth:`named_arrays` / ``--dump-params`` name them); the
        sparse optimizer state restarts at zero. Checks every tensor first: a missing, extra or misshapen one
        is a ValueError naming it, and nothing is changed. On N ranks every rank passes the same arrays."""
        expected = {f"model.{k}": tuple(v.shape) for k, v in self.model.named_parameters()}
        for t, n in enumerate(self.dataset.table_sizes):
            expected[f"embedding.table_{t}"] = (n, self.config.embedding_dim)
        check_params(arrays, expected)
        state = {
            k[len("model.") :]: torch.from_numpy(np.asarray(arrays[k], np.float32))
            for k in expected
            if k.startswith("model.")
        }
        with torch.no_grad():
            self.model.load_state_dict(state, strict=True)
        tables = [
            np.ascontiguousarray(arrays[f"embedding.table_{t}"], np.float32)
            for t in range(len(self.dataset.table_sizes))
        ]
        self.mode.load_tables(
            tables, [np.zeros(self.sparse_opt.state_shape(t.shape[0]), np.float32) for t in tables]
        )

    def close(self) -> None:
        """Releases the tiers, the checkpoint directory's lock and the thread counts (``config.threads``)."""
        try:
            if self._checkpoints is not None:
                self._checkpoints.close()  # the checkpoint directory's lock
            self.mode.close()
        finally:
            self._restore_threads()
