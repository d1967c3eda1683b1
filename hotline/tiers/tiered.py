"""Tiered embeddings and the two modes built on them: ``hotline`` and the ``hybrid`` baseline.

- Hot tier: one compact table of all hot rows (fused hot slots of every table) and their optimizer state,
  on the compute device.
- Cold tier: every row of every table in host memory (fused row ids; pinned when CUDA is present) with its
  optimizer state. Rows that are hot have stale copies here; the hot tier is authoritative for them.

One exact step (``TieredMode.prepare`` then ``TieredMode.compute``):
1. dispatch: popular micro-batch, non-popular micro-batch, working set (unique cold rows);
2. gather the working set's rows and state into a staging buffer (Numba threads) and copy it to the device;
3. forward/backward of the popular micro-batch, then of the non-popular one, with the loss normalised by the
   whole mini-batch so their gradients add up to the mini-batch gradient;
4. ONE sparse update of the hot tier (both micro-batches' hot lookups together: duplicates summed, each row
   updated once) and one of the working buffer, then write the updated working rows back to the cold tier.

``hybrid`` is the same machinery with every row cold and no split: each batch's unique rows are gathered,
updated and written back, with no overlap (the Intel-optimised CPU-GPU DLRM style baseline).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.profiler import record_function

from hotline.datasets.format import Batch, Dataset
from hotline.dispatcher import Dispatcher, MicroBatches
from hotline.kernels import sparse_update
from hotline.kernels.gather import assemble_rows, gather_rows, scatter_rows
from hotline.model import DLRM
from hotline.modes import (
    StepStats,
    TrainMode,
    check_ids,
    initial_tables,
    loss_and_backward,
    sum_pool,
    table_offsets,
)
from hotline.placement import Placement
from hotline.sparse_optim import SparseOptimizer


@contextlib.contextmanager
def _on_stream(stream):
    if stream is None:
        yield
    else:
        with torch.cuda.stream(stream):
            yield


def _host_tensor(array: np.ndarray, pin: bool) -> torch.Tensor:
    t = torch.from_numpy(array)
    return t.pin_memory() if pin else t


class ColdTier:
    """Every row of every table (fused ids) and its optimizer state in host memory."""

    def __init__(self, weights: np.ndarray, optimizer: SparseOptimizer, pin: bool):
        self.weight = _host_tensor(weights, pin)
        self.state = _host_tensor(optimizer.new_state(weights.shape[0]).numpy(), pin)
        self.w = self.weight.numpy()  # numpy views for the Numba kernels (same memory)
        self.s = self.state.numpy()

    def gather(self, rows: np.ndarray, out_w: np.ndarray, out_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Copies rows and their state into staging buffers; returns the filled views."""
        w = gather_rows(self.w, rows, out_w)
        s = gather_rows(self.s, rows, out_s) if self.s.size else out_s[:0]
        return w, s

    def write_back(self, rows: np.ndarray, w: np.ndarray, s: np.ndarray) -> None:
        scatter_rows(self.w, rows, w)
        if self.s.size:
            scatter_rows(self.s, rows, s)


@dataclass
class PreparedStep:
    """A batch after dispatch and gather: what the compute of one step needs, already on the device."""

    batch: Batch
    micro: MicroBatches
    work: torch.Tensor
    """[U, D] working rows on the device (updated in place by the step)."""
    work_state: torch.Tensor
    """[U] their optimizer state (empty for SGD)."""
    index: dict[str, torch.Tensor]
    """The micro-batches' index arrays and dense inputs as device tensors (copied with the rows)."""
    staging: tuple[torch.Tensor, torch.Tensor]
    """The host staging buffers the rows came through (reused for the write-back)."""
    step: int = -1
    """Position of the step in the run (set by the pipelined executor)."""
    stale: np.ndarray | None = None
    """Working-buffer slots an earlier, unfinished step may update: refreshed just before compute."""
    ready: object | None = None
    """A CUDA event recorded after the copies (None on CPU)."""
    times: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)


_INDEX_NAMES = (
    "popular_samples",
    "non_popular_samples",
    "pop_ids",
    "hot_pos",
    "hot_slot",
    "cold_pos",
    "cold_slot",
)


class TieredMode(TrainMode):
    """Hot rows on the device, the rest in host memory; the ``hotline`` and ``hybrid`` modes."""

    def __init__(
        self,
        name: str,
        table_sizes: list[int],
        pooling_factor: int,
        dim: int,
        optimizer: SparseOptimizer,
        seed: int,
        placement: Placement,
        max_batch_size: int,
        device: torch.device | str = "cpu",
        in_flight: int = 1,
        fused: bool = False,
    ):
        if list(placement.table_sizes) != list(table_sizes):
            raise ValueError("the placement's table sizes do not match the dataset's")
        self.name = name
        self.fused = fused  # one forward/backward over the whole batch (its cold rows are already here)
        self.table_sizes = list(table_sizes)
        self.L = int(pooling_factor)
        self.dim = dim
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.placement = placement
        self.offsets = table_offsets(self.table_sizes)
        pin = self.device.type == "cuda"
        self.cold = ColdTier(initial_tables(self.table_sizes, dim, seed), optimizer, pin)
        self.hot_rows = placement.fused_hot_ids()
        self.hot_w = torch.from_numpy(self.cold.w[self.hot_rows]).to(self.device)
        self.hot_s = torch.from_numpy(
            self.cold.s[self.hot_rows] if self.cold.s.size else self.cold.s[:0].copy()
        )
        self.hot_s = self.hot_s.to(self.device)
        self.dispatcher = Dispatcher(placement, self.L, max_batch_size, in_flight=in_flight)
        self.fused_remap = self.dispatcher.remap
        max_rows = max_batch_size * len(self.table_sizes) * self.L
        state_cols = self.cold.s.size > 0
        self._staging = [
            (
                _host_tensor(np.empty((max_rows, dim), np.float32), pin),
                _host_tensor(np.empty(max_rows if state_cols else 0, np.float32), pin),
            )
            for _ in range(max(1, in_flight))
        ]
        self._next_staging = 0
        self._hot_scratch = sparse_update.new_scratch(self.hot_w.shape[0])
        # Off the CPU the sparse updates run as torch ops; their distinct hot rows are found on the host while
        # the batch is prepared, so the device never waits for a torch.unique (tests set it on CPU, too).
        self.device_updates = self.device.type != "cpu"
        self._prep_scratch = sparse_update.new_scratch(self.hot_w.shape[0])
        self._work_scratch = sparse_update.new_scratch(max_rows)

    # -- the two halves of a step (the pipelined executor runs prepare ahead on a worker thread) ----------
    def prepare(self, batch: Batch, claim=None, copy_stream=None) -> PreparedStep:
        """Dispatch, gather the working set into a staging buffer, and copy rows and indices to the device.

        ``claim(working_set) -> stale slots`` is the executor's hook for look-ahead (called between dispatch and
        gather); ``copy_stream`` is the CUDA side stream the copies go on.
        """
        with record_function("## dispatch ##"):
            t0 = time.perf_counter()
            micro = self.dispatcher.split(batch.sparse, fused=self.fused)
            stale = claim(micro.working_set) if claim is not None else None
            t1 = time.perf_counter()
        with record_function("## gather ##"):
            stage_w, stage_s = self._staging[self._next_staging]
            self._next_staging = (self._next_staging + 1) % len(self._staging)
            n = micro.working_set.shape[0]
            self.cold.gather(micro.working_set, stage_w.numpy(), stage_s.numpy())
            t2 = time.perf_counter()
        with record_function("## h2d ##"), _on_stream(copy_stream):
            nb = self.device.type == "cuda"
            work = stage_w[:n].to(self.device, non_blocking=nb)
            work_state = stage_s[: n if self.cold.s.size else 0].to(self.device, non_blocking=nb)
            index = {
                k: torch.from_numpy(getattr(micro, k)).to(self.device, non_blocking=nb) for k in _INDEX_NAMES
            }
            if self.device_updates:
                hot_ids = np.concatenate([micro.pop_ids, micro.hot_slot])
                hot_rows, hot_inverse = sparse_update.distinct(hot_ids, self._prep_scratch)
                index["hot_rows"] = torch.from_numpy(hot_rows).to(self.device, non_blocking=nb)
                index["hot_inverse"] = torch.from_numpy(hot_inverse).to(self.device, non_blocking=nb)
            index["dense"] = torch.from_numpy(batch.dense).to(self.device, non_blocking=nb)
            index["labels"] = torch.from_numpy(batch.labels).to(self.device, non_blocking=nb)
            ready = None
            if copy_stream is not None:
                ready = torch.cuda.Event()
                ready.record(copy_stream)
            t3 = time.perf_counter()
        row_bytes = 4 * (self.dim + (1 if self.cold.s.size else 0))
        return PreparedStep(
            batch,
            micro,
            work,
            work_state,
            index,
            (stage_w, stage_s),
            stale=stale,
            ready=ready,
            times={"dispatch": t1 - t0, "gather": t2 - t1, "h2d": t3 - t2},
            counters={
                "popular_samples": micro.popular_count,
                "working_set_rows": n,
                "bytes_gathered": n * row_bytes,
            },
        )

    def refresh(self, prep: PreparedStep) -> None:
        """Re-reads the stale working rows from the cold tier (after the earlier steps' write-backs landed)."""
        slots = prep.stale
        if slots is None or not slots.size:
            return
        rows = prep.micro.working_set[slots]
        idx = torch.from_numpy(slots).to(self.device)
        with torch.no_grad():
            prep.work.index_copy_(0, idx, torch.from_numpy(self.cold.w[rows]).to(self.device))
            if self.cold.s.size:
                prep.work_state.index_copy_(0, idx, torch.from_numpy(self.cold.s[rows]).to(self.device))

    def compute(self, model: DLRM, prep: PreparedStep) -> StepStats:
        """Forward/backward of both micro-batches and one sparse update per tier (write-back is separate)."""
        if prep.ready is not None:
            torch.cuda.current_stream().wait_event(prep.ready)
            for t in (prep.work, prep.work_state, *prep.index.values()):
                t.record_stream(torch.cuda.current_stream())
        batch, micro, ix = prep.batch, prep.micro, prep.index
        B, T, L = batch.sparse.shape
        C, D = T * L, self.dim
        dense, labels = ix["dense"], ix["labels"]
        loss = 0.0
        # On CPU, Numba assembles the looked-up rows and reads the gradients in place (no index_put, no gathers
        # of rows.grad, no concatenation); the torch ops below are the device path.
        host = self.device.type == "cpu" and not self.device_updates
        grad_p = grad_n = None
        t0 = time.perf_counter()
        if micro.num_popular:
            with record_function("## popular forward/backward ##"):
                rows = self.hot_w.index_select(0, ix["pop_ids"]).requires_grad_(True)
                idx = ix["popular_samples"]
                loss += loss_and_backward(model, dense[idx], sum_pool(rows, T, L), labels[idx], B)
                grad_p = rows.grad
        t1 = time.perf_counter()
        if micro.num_non_popular:
            with record_function("## non-popular forward/backward ##"):
                rows = torch.empty((micro.num_non_popular * C, D), dtype=torch.float32, device=self.device)
                if host:
                    assemble_rows(rows.numpy(), self.hot_w.numpy(), micro.hot_pos, micro.hot_slot,
                                  prep.work.numpy(), micro.cold_pos, micro.cold_slot)  # fmt: skip
                else:
                    rows[ix["hot_pos"]] = self.hot_w.index_select(0, ix["hot_slot"])
                    rows[ix["cold_pos"]] = prep.work.index_select(0, ix["cold_slot"])
                rows.requires_grad_(True)
                idx = ix["non_popular_samples"]
                loss += loss_and_backward(model, dense[idx], sum_pool(rows, T, L), labels[idx], B)
                grad_n = rows.grad
        t2 = time.perf_counter()
        with record_function("## sparse optimizer ##"):
            touched = self._sparse_updates(prep, grad_p, grad_n, host)
        t3 = time.perf_counter()
        return StepStats(
            loss_sum=float(loss),
            samples=B,
            times={
                **prep.times,
                "popular_compute": t1 - t0,
                "non_popular_compute": t2 - t1,
                "sparse_update": t3 - t2,
            },
            counters={**prep.counters, "rows_touched": touched},
        )

    def _sparse_updates(self, prep: PreparedStep, grad_p, grad_n, host: bool) -> int:
        """One update of the hot tier (both micro-batches' hot lookups) and one of the working buffer."""
        micro, ix, opt = prep.micro, prep.index, self.optimizer
        touched = 0
        if host:
            parts = [] if grad_p is None else [(micro.pop_ids, grad_p.numpy(), None)]
            if grad_n is not None:
                parts.append((micro.hot_slot, grad_n.numpy(), micro.hot_pos))
            if parts:
                touched += opt.step_parts(self.hot_w, self.hot_s, parts, self._hot_scratch)
            if grad_n is not None and micro.cold_slot.shape[0]:
                parts = [(micro.cold_slot, grad_n.numpy(), micro.cold_pos)]
                touched += opt.step_parts(prep.work, prep.work_state, parts, self._work_scratch)
            return touched
        hot_ids = [] if grad_p is None else [ix["pop_ids"]]
        hot_grads = [] if grad_p is None else [grad_p]
        if grad_n is not None:
            hot_ids.append(ix["hot_slot"])
            hot_grads.append(grad_n[ix["hot_pos"]])
        cold_grads = grad_n[ix["cold_pos"]] if grad_n is not None else None
        # Device path: torch ops fed with the distinct hot rows found on the host (no torch.unique sync).
        if hot_ids:
            opt.step_coalesced(
                self.hot_w, self.hot_s, ix["hot_rows"], ix["hot_inverse"], torch.cat(hot_grads)
            )
            touched += int(ix["hot_rows"].shape[0])
        if cold_grads is not None and cold_grads.shape[0]:
            n = prep.work.shape[0]
            opt.step_coalesced(prep.work, prep.work_state, None, ix["cold_slot"], cold_grads, num_rows=n)
            touched += n
        return touched

    def start_write_back(self, prep: PreparedStep):
        """Starts copying the updated working rows to host staging; returns what ``finish_write_back`` needs."""
        n = prep.micro.working_set.shape[0]
        stage_w, stage_s = prep.staging
        if self.device.type == "cuda" and n:
            stage_w[:n].copy_(prep.work, non_blocking=True)
            if self.cold.s.size:
                stage_s[:n].copy_(prep.work_state, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return done
        return None

    def finish_write_back(self, prep: PreparedStep, copied=None) -> None:
        """Stores the step's updated working rows (and state) in the cold tier."""
        ws = prep.micro.working_set
        if not ws.shape[0]:
            return
        with record_function("## write-back ##"):
            if copied is not None:
                copied.synchronize()
            n = ws.shape[0]
            w = prep.staging[0][:n].numpy() if self.device.type == "cuda" else prep.work.detach().numpy()
            s = prep.staging[1][: n if self.cold.s.size else 0]
            s = s.numpy() if self.device.type == "cuda" else prep.work_state.numpy()
            self.cold.write_back(ws, w, s)

    def step(self, model: DLRM, batch: Batch) -> StepStats:
        prep = self.prepare(batch)
        stats = self.compute(model, prep)
        t0 = time.perf_counter()
        self.finish_write_back(prep, self.start_write_back(prep))
        stats.times["write_back"] = time.perf_counter() - t0
        return stats

    # -- evaluation and export ---------------------------------------------------------------------------
    @torch.no_grad()
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        check_ids(sparse, self.table_sizes)
        B, T, L = sparse.shape
        fused = (sparse.astype(np.int64) + self.offsets[None, :, None]).reshape(-1)
        rows = torch.from_numpy(self.cold.w[fused]).to(self.device)
        slots = self.fused_remap[fused]
        hot = np.flatnonzero(slots >= 0)
        if hot.size:
            rows[torch.from_numpy(hot).to(self.device)] = self.hot_w[
                torch.from_numpy(slots[hot]).to(self.device)
            ]
        return sum_pool(rows, T, L)

    def _merged(self, cold: np.ndarray, hot: torch.Tensor) -> np.ndarray:
        out = cold.copy()
        if self.hot_rows.size and out.size:
            out[self.hot_rows] = hot.detach().cpu().numpy()
        return out

    def export_tables(self) -> list[np.ndarray]:
        w = self._merged(self.cold.w, self.hot_w)
        return [w[o : o + n] for o, n in zip(self.offsets, self.table_sizes)]

    def export_state(self) -> list[np.ndarray]:
        if not self.cold.s.size:
            return [np.zeros(0, np.float32) for _ in self.table_sizes]
        s = self._merged(self.cold.s, self.hot_s)
        return [s[o : o + n] for o, n in zip(self.offsets, self.table_sizes)]

    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        self.cold.w[:] = np.concatenate(tables)
        with torch.no_grad():
            self.hot_w.copy_(torch.from_numpy(self.cold.w[self.hot_rows]))
            if self.cold.s.size:
                self.cold.s[:] = np.concatenate(states)
                self.hot_s.copy_(torch.from_numpy(self.cold.s[self.hot_rows]))


def placement_for(config, dataset: Dataset, progress: bool = True) -> Placement:
    """The placement a TrainConfig asks for: all-cold for ``hybrid``; for ``hotline`` loaded from
    ``--placement`` or profiled under ``--hbm-budget``. Checked against the dataset and the embedding dim."""
    if config.mode == "hybrid":
        return Placement.all_cold(
            dataset.table_sizes, dataset_fingerprint=dataset.fingerprint, embedding_dim=config.embedding_dim
        )
    if config.placement_path:
        placement = Placement.load(config.placement_path, dataset=dataset)
    elif config.hbm_budget is not None:
        from hotline.profiler import profile

        prof = profile(
            dataset,
            embedding_dim=config.embedding_dim,
            optimizer=config.optimizer,
            mini_batch_size=config.mini_batch_size,
            seed=config.seed,
            progress=progress,
        )
        placement = prof.placement(config.hbm_budget)
    else:
        raise ValueError(
            "--mode hotline needs --placement FILE (from `hotline profile`) or --hbm-budget SIZE"
        )
    if placement.embedding_dim != config.embedding_dim:
        raise ValueError(
            f"the placement was made for embedding dim {placement.embedding_dim}, the model uses "
            f"{config.embedding_dim} (--arch-sparse-feature-size)"
        )
    return placement


def build_tiered_mode(config, dataset: Dataset, optimizer: SparseOptimizer) -> TieredMode:
    """The ``hybrid`` or ``hotline`` mode for a TrainConfig (``hotline`` loads or computes its placement)."""
    placement = placement_for(config, dataset, progress=config.progress)
    in_flight = 1 if config.mode == "hybrid" else config.lookahead + 3
    return TieredMode(
        config.mode,
        dataset.table_sizes,
        dataset.pooling_factor,
        config.embedding_dim,
        optimizer,
        config.seed,
        placement,
        config.mini_batch_size,
        config.device,
        in_flight=in_flight,
        fused=config.fused_micro_batches,
    )
