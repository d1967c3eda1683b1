"""The tiered modes, ``hotline`` and the ``hybrid`` baseline, on one rank or N: hot rows on the device, the
rest in a :class:`~hotline.tiers.cold_store.ColdStore`.

- Hot tier: one compact table of all hot rows (fused hot slots of every table) and their optimizer state,
  on the compute device, replicated on every rank (its gradients exchanged, a no-op on one rank).
- Cold tier: a ColdStore holding every row (host memory of this process, or sharded over the ranks).

One exact step (:meth:`TieredMode.prepare`, then :meth:`TieredMode.compute`, then the write-back):
1. dispatch: popular micro-batch, non-popular micro-batch, working set (unique cold rows);
2. fetch the working set's rows and state from the cold store and copy them to the device;
3. forward/backward of the popular micro-batch, then of the non-popular one, with the loss normalised by the
   whole (global) mini-batch so their gradients add up to the mini-batch gradient (``fused``: one pass);
4. ONE sparse update of the hot tier (both micro-batches' hot lookups together: duplicates summed, each row
   updated once) and one of the working rows, then the cold store writes them back (or, sharded, the rows'
   owners apply the update).

``hybrid`` is the same machinery with every row cold and no split: each batch's unique rows are fetched,
updated and written back, with no overlap (the Intel-optimised CPU-GPU DLRM style baseline).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
from torch.profiler import record_function

from hotline.datasets.format import Batch
from hotline.dispatch import Dispatcher, index_for
from hotline.distributed.comm import Comm
from hotline.kernels import sparse_update
from hotline.kernels.gather import assemble_rows
from hotline.models.dlrm import DLRM
from hotline.pipeline.gpu_timing import StreamPhases
from hotline.placement import Placement
from hotline.table_layout import BagLayout, TableLayout, bytes_per_row
from hotline.tiers.base import (
    StepStats,
    TrainMode,
    bag_pool,
    loss_and_backward,
    padded_rows,
    real_positions,
    step_loss,
)
from hotline.tiers.cold_store import ColdStore, staging_tensor
from hotline.tiers.packing import CopyPack
from hotline.tiers.prepared import INDEX_NAMES, PreparedStep, on_stream, refresh_stale
from hotline.tiers.replicated import update_replicas
from hotline.tiers.sparse_optim import SparseOptimizer


def measured_figures(counters: dict, samples: int, steps: int) -> dict:
    """What a tiered run saw, from its summed step counters: hot_lookup_share (lookups that hit a hot row),
    popular_sample_share, cold_rows_per_step (unique cold rows: the working set) and cold_bytes_per_step
    (host-to-device; the write-back moves as many back). Empty for a mode without the counters (device).

    On N ranks popular samples, working-set rows, lookups and hot lookups are summed over the ranks (the
    trainer's all-reduce), so hot_lookup_share is the global batch's; bytes are this rank's own."""
    if "hot_lookups" not in counters or steps <= 0:
        return {}
    return {
        "hot_lookup_share": counters["hot_lookups"] / max(1.0, counters["lookups"]),
        "popular_sample_share": counters["popular_samples"] / max(1, samples),
        "cold_rows_per_step": counters["working_set_rows"] / steps,
        "cold_bytes_per_step": counters["bytes_gathered"] / steps,
    }


class TieredMode(TrainMode):
    """Hot rows on the device, the rest in a cold store; the ``hotline`` and ``hybrid`` modes on 1 or N ranks."""

    def __init__(
        self,
        name: str,
        layout: TableLayout,
        pooling_factor: int | BagLayout,
        dim: int,
        optimizer: SparseOptimizer,
        placement: Placement,
        cold: ColdStore,
        hot_weights: np.ndarray,
        max_batch_size: int,
        device: torch.device | str = "cpu",
        in_flight: int = 1,
        fused: bool = False,
    ):
        if list(placement.table_sizes) != layout.table_sizes:
            raise ValueError("the placement's table sizes do not match the dataset's")
        self.name = name
        self.fused = fused  # one forward/backward over the whole batch (its cold rows are already here)
        self.layout = layout
        self.table_sizes = layout.table_sizes
        self.bags = (
            pooling_factor
            if isinstance(pooling_factor, BagLayout)
            else BagLayout.uniform(layout, pooling_factor)
        )
        self.dim = dim
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.placement = placement
        self.cold = cold
        self.comm: Comm = cold.comm
        self.hot_rows = placement.fused_hot_ids()
        self.hot_w = torch.from_numpy(hot_weights).to(self.device)
        self.hot_s = optimizer.new_state(self.hot_rows.shape[0]).to(self.device)
        index = index_for(self.comm.world_size, getattr(cold, "on_disk", False))
        self.dispatcher = Dispatcher(placement, self.bags, max(1, max_batch_size), max(1, in_flight), index)
        self.fused_remap = self.dispatcher.row_remap
        max_rows = max(1, max_batch_size) * self.bags.num_columns
        pin = self.device.type == "cuda"
        self._staging = [
            (staging_tensor((max_rows, dim), pin), staging_tensor(optimizer.state_shape(max_rows), pin))
            for _ in range(max(1, in_flight))
        ]
        self._next_staging = 0
        # Off the CPU a step's index arrays and dense inputs go in two copies from pinned packs, one per
        # staging slot (tests set it on CPU too, where the "copy" is a view of the pack).
        self.pack_copies = self.device.type == "cuda"
        self.phases: StreamPhases | None = None  # set to time phases on the device's clock (gpu_bench)
        self._packs = [CopyPack(pin) for _ in self._staging]
        # The stale-row refresh's own packs: the step's index pack may still be read by its copy when it runs.
        self._refresh_packs = [CopyPack(pin) for _ in self._staging]
        self._prepared = 0  # steps prepared so far (PreparedStep.seq)
        self._hot_scratch = sparse_update.new_scratch(self.hot_w.shape[0])
        # Off the CPU the sparse updates run as torch ops; their distinct hot rows are found on the host while
        # the batch is prepared, so the device never waits for a torch.unique (tests set it on CPU, too).
        self.device_updates = self.device.type != "cpu"
        self._prep_scratch = sparse_update.new_scratch(self.hot_w.shape[0])

    # -- the two halves of a step (the pipelined executor runs prepare ahead on a worker thread) ----------
    def prepare(self, batch: Batch, step: int = -1, copy_stream=None) -> PreparedStep:
        """Dispatch, fetch the working set into a staging buffer, and copy rows and indices to the device.

        ``step >= 0``: prepared ahead in a look-ahead run (the cold store applies its claim rule);
        ``copy_stream`` is the CUDA side stream the copies go on.
        """
        with record_function("## dispatch ##"):
            t0 = time.perf_counter()
            micro = self.dispatcher.split(batch.sparse, fused=self.fused)
            t1 = time.perf_counter()
        with record_function("## gather ##"):
            slot = self._next_staging
            stage_w, stage_s = self._staging[slot]
            self._next_staging = (slot + 1) % len(self._staging)
            fetch = self.cold.fetch(micro.working_set, stage_w.numpy(), stage_s.numpy(), step)
            t2 = time.perf_counter()
        with record_function("## h2d ##"):
            # Host work first (distinct hot rows, packing), then only the copies inside the device-clock phase.
            nb = self.device.type == "cuda"
            n = micro.working_set.shape[0]
            seq, self._prepared = self._prepared, self._prepared + 1
            arrays = {k: getattr(micro, k) for k in INDEX_NAMES}
            if micro.pop_pos is not None:  # padded bags: where the popular lookups stand among the id slots
                arrays["pop_pos"] = micro.pop_pos
            if self.device_updates:
                hot_ids = np.concatenate([micro.pop_ids, micro.hot_slot])
                arrays["hot_rows"], arrays["hot_inverse"] = sparse_update.distinct(
                    hot_ids, self._prep_scratch
                )
            arrays["dense"], arrays["labels"] = batch.dense, batch.labels
            if self.pack_copies:  # two copies (int64, float32) from pinned packs instead of one per array
                self._packs[slot].load(arrays)
            with on_stream(copy_stream), self._phase("h2d", copy_stream, seq):
                work = torch.from_numpy(fetch.values).to(self.device, non_blocking=nb)
                work_state = torch.from_numpy(fetch.state).to(self.device, non_blocking=nb)
                if self.pack_copies:
                    index = self._packs[slot].send(self.device, nb)
                else:
                    index = {
                        k: torch.from_numpy(a).to(self.device, non_blocking=nb) for k, a in arrays.items()
                    }
                ready = None
                if copy_stream is not None:
                    ready = torch.cuda.Event()
                    ready.record(copy_stream)
            t3 = time.perf_counter()
        row_bytes = bytes_per_row(self.dim, self.optimizer.kind)
        return PreparedStep(
            batch,
            micro,
            fetch,
            work,
            work_state,
            index,
            (stage_w, stage_s),
            ready=ready,
            slot=slot,
            seq=seq,
            times={"dispatch": t1 - t0, "gather": t2 - t1, "h2d": t3 - t2, **fetch.times},
            counters={
                "popular_samples": micro.popular_count,
                "hot_lookups": int(micro.pop_ids.shape[0] + micro.hot_slot.shape[0]),
                "lookups": self.bags.lookups(batch.sparse),
                "working_set_rows": n,
                "bytes_gathered": n * row_bytes,
                **fetch.counters,
            },
        )

    def needs_refresh(self, prep: PreparedStep) -> bool:
        """Whether :meth:`refresh` must run before the step computes."""
        return self.cold.needs_refresh(prep.fetch)

    def _phase(self, name: str, stream=None, step: int | None = None):
        if self.phases is None:
            return contextlib.nullcontext()
        return self.phases.phase(name, stream, step)

    def _compute_stream(self):
        """The compute stream: the current stream of the mode's device, named (not of the current device)."""
        return torch.cuda.current_stream(self.device)

    def _await_copies(self, prep: PreparedStep) -> None:
        """Makes the compute stream wait for the step's side-stream copies (once). Whatever writes the
        working buffer on the compute stream (a refresh, the step) must come after this: a copy landing
        later would overwrite fresh rows with stale ones."""
        if prep.ready is not None:
            stream = self._compute_stream()
            stream.wait_event(prep.ready)
            for t in (prep.work, prep.work_state, *prep.index.values()):
                t.record_stream(stream)
            prep.ready = None

    def refresh(self, prep: PreparedStep, live: dict[int, PreparedStep] | None = None) -> int:
        """Re-reads the stale working rows; returns how many were forwarded. ``live``: the computed steps whose
        rows are not written back yet (by step); see :func:`~hotline.tiers.prepared.refresh_stale`."""
        self._await_copies(prep)
        # on a CPU (unless the tests run the device paths there): straight into the working buffer
        host = self.device.type == "cpu" and not (self.pack_copies or self.device_updates)
        pack = self._refresh_packs[prep.slot] if self.pack_copies else None
        return refresh_stale(prep, live, self.cold, self.device, host, pack)

    def compute(self, model: DLRM, prep: PreparedStep) -> StepStats:
        """Forward/backward of both micro-batches and one sparse update per tier (write-back is separate)."""
        self._await_copies(prep)
        batch, micro, ix = prep.batch, prep.micro, prep.index
        B = batch.sparse.shape[0]
        G = batch.loss_normaliser
        C, D = self.bags.num_columns, self.dim
        dense, labels = ix["dense"], ix["labels"]
        loss = 0.0
        # On CPU, Numba assembles the looked-up rows and reads the gradients in place (no index_put, no gathers
        # of rows.grad, no concatenation); the torch ops below are the device path.
        host = self.device.type == "cpu" and not self.device_updates
        grad_p = grad_n = None
        t0 = time.perf_counter()
        if micro.num_popular:
            with (
                record_function("## popular forward/backward ##"),
                self._phase("popular_compute", step=prep.seq),
            ):
                rows = padded_rows(self.hot_w, ix["pop_ids"], ix.get("pop_pos"), micro.num_popular * C)
                idx = ix["popular_samples"]
                loss += loss_and_backward(model, dense[idx], bag_pool(rows, self.bags), labels[idx], G)
                grad_p = rows.grad if "pop_pos" not in ix else rows.grad.index_select(0, ix["pop_pos"])
        t1 = time.perf_counter()
        prep.reached("cold")  # under look-ahead: the stale rows' refresh, after the popular micro-batch
        t1r = time.perf_counter()
        if micro.num_non_popular:
            with (
                record_function("## non-popular forward/backward ##"),
                self._phase("non_popular_compute", step=prep.seq),
            ):
                alloc = torch.zeros if self.bags.padded else torch.empty  # padding slots stay zero
                rows = alloc((micro.num_non_popular * C, D), dtype=torch.float32, device=self.device)
                if host:
                    assemble_rows(
                        rows.numpy(),
                        self.hot_w.numpy(),
                        micro.hot_pos,
                        micro.hot_slot,
                        prep.work.numpy(),
                        micro.cold_pos,
                        micro.cold_slot,
                    )
                else:
                    rows[ix["hot_pos"]] = self.hot_w.index_select(0, ix["hot_slot"])
                    rows[ix["cold_pos"]] = prep.work.index_select(0, ix["cold_slot"])
                rows.requires_grad_(True)
                idx = ix["non_popular_samples"]
                loss += loss_and_backward(model, dense[idx], bag_pool(rows, self.bags), labels[idx], G)
                grad_n = rows.grad
        t2 = time.perf_counter()
        with record_function("## sparse optimizer ##"), self._phase("sparse_update", step=prep.seq):
            touched = self._hot_update(prep, grad_p, grad_n, host)
            empty = torch.zeros((0, D), dtype=torch.float32, device=self.device)
            touched += self.cold.update(
                prep.fetch,
                self.optimizer,
                prep.work,
                prep.work_state,
                micro.cold_slot,
                grad_n if grad_n is not None else empty,
                micro.cold_pos,
                None if host else (ix["cold_slot"], ix["cold_pos"]),
            )
        prep.reached("updated")  # under look-ahead: the write-back starts, beside the dense all-reduce
        t3 = time.perf_counter()
        times = {
            **prep.times,
            "popular_compute": t1 - t0,
            "non_popular_compute": t2 - t1r,
            "sparse_update": t3 - t2,
        }
        return StepStats(
            loss_sum=step_loss(loss),
            samples=B,
            times=times,
            counters={**prep.counters, "rows_touched": touched},
        )

    def _hot_update(self, prep: PreparedStep, grad_p, grad_n, host: bool) -> int:
        """ONE update of the hot tier from both micro-batches' hot lookups (and, on N ranks, every rank's)."""
        micro, ix, opt = prep.micro, prep.index, self.optimizer
        if self.comm.world_size > 1:
            if not self.hot_rows.shape[0]:
                return 0
            ids = [] if grad_p is None else [ix["pop_ids"]]
            grads = [] if grad_p is None else [grad_p]
            if grad_n is not None:
                ids.append(ix["hot_slot"])
                grads.append(grad_n[ix["hot_pos"]])
            distinct = (ix["hot_rows"], ix["hot_inverse"]) if self.device_updates else None
            return update_replicas(self.comm, opt, self.hot_w, self.hot_s, ids, grads, "hot_allgather",
                                   distinct, self.device_updates, self._hot_scratch, prep.hot_sizes)  # fmt: skip
        if host:
            parts = [] if grad_p is None else [(micro.pop_ids, grad_p.numpy(), None)]
            if grad_n is not None:
                parts.append((micro.hot_slot, grad_n.numpy(), micro.hot_pos))
            return opt.step_parts(self.hot_w, self.hot_s, parts, self._hot_scratch) if parts else 0
        hot_ids = [] if grad_p is None else [ix["pop_ids"]]
        hot_grads = [] if grad_p is None else [grad_p]
        if grad_n is not None:
            hot_ids.append(ix["hot_slot"])
            hot_grads.append(grad_n[ix["hot_pos"]])
        if not hot_ids:
            return 0
        # Device path: torch ops fed with the distinct hot rows found on the host (no torch.unique sync).
        opt.step_coalesced(self.hot_w, self.hot_s, ix["hot_rows"], ix["hot_inverse"], torch.cat(hot_grads))
        return int(ix["hot_rows"].shape[0])

    def start_write_back(self, prep: PreparedStep):
        """Starts copying the updated working rows to host staging; returns what ``finish_write_back`` waits
        for: on CUDA always an event after the step's work on the compute stream (also for a step with no
        cold rows, and for a store that does not write back), so a step counts as written, and its staging
        slot and copy packs are reused, only once the device is done reading them; None on the CPU."""
        if self.device.type != "cuda":
            return None
        n = prep.micro.working_set.shape[0]
        stage_w, stage_s = prep.staging
        stream = self._compute_stream()
        if self.cold.writes_back and n:
            with torch.cuda.stream(stream), self._phase("copy_back", stream, prep.seq):
                stage_w[:n].copy_(prep.work, non_blocking=True)
                if prep.work_state.numel():
                    stage_s[:n].copy_(prep.work_state, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        return done

    def finish_write_back(self, prep: PreparedStep, copied=None) -> None:
        """Stores the step's updated working rows (and state) in the cold store. A store that does not write
        back (the sharded one: the rows' owners applied the update) is only told the step landed; the
        working rows are never read on the host then (on a device they are not host memory)."""
        with record_function("## write-back ##"):
            if copied is not None:
                copied.synchronize()
            if not self.cold.writes_back:
                self.cold.write_back(prep.fetch, np.zeros((0, self.dim), np.float32), np.zeros(0, np.float32))
                return
            n = prep.micro.working_set.shape[0]
            if self.device.type == "cuda":
                w, s = prep.staging[0][:n].numpy(), prep.staging[1][: prep.work_state.shape[0]].numpy()
            else:
                w, s = prep.work.detach().numpy(), prep.work_state.numpy()
            self.cold.write_back(prep.fetch, w, s)

    def step(self, model: DLRM, batch: Batch) -> StepStats:
        prep = self.prepare(batch)
        stats = self.compute(model, prep)
        t0 = time.perf_counter()
        self.finish_write_back(prep, self.start_write_back(prep))
        stats.times["write_back"] = time.perf_counter() - t0
        return stats

    # -- evaluation, export, checkpoints -------------------------------------------------------------------
    @torch.no_grad()
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        all_fused = self.bags.fuse(sparse)
        real = real_positions(all_fused) if self.bags.padded else None
        fused = all_fused if real is None else all_fused[real]
        slots = self.fused_remap[fused]
        cold = np.flatnonzero(slots < 0)
        uniq, inverse = np.unique(fused[cold], return_inverse=True)
        fetched = torch.from_numpy(self.cold.read(uniq))
        rows = torch.empty((fused.shape[0], self.dim), dtype=torch.float32, device=self.device)
        hot = np.flatnonzero(slots >= 0)
        if hot.size:
            rows[torch.from_numpy(hot).to(self.device)] = self.hot_w[
                torch.from_numpy(slots[hot]).to(self.device)
            ]
        if cold.size:
            rows[torch.from_numpy(cold).to(self.device)] = fetched[torch.from_numpy(inverse.reshape(-1))].to(
                self.device
            )
        if real is not None:  # the real lookups' rows into their slots, zero in the padding slots
            full = torch.zeros((all_fused.shape[0], self.dim), dtype=torch.float32, device=self.device)
            rows = full.index_copy_(0, torch.from_numpy(real).to(self.device), rows)
        return bag_pool(rows, self.bags)

    def export_tables(self) -> list[np.ndarray]:
        return self.export_tables_and_state()[0]

    def export_state(self) -> list[np.ndarray]:
        return self.export_tables_and_state()[1]

    def export_tables_and_state(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Both from ONE export of the cold store (on N ranks one all-gather, not two)."""
        w, s = self.cold.export(self.hot_rows, self.hot_w, self.hot_s)
        return self.layout.split(w), self.layout.split_state(s)

    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        w = np.concatenate(tables)
        s = np.concatenate(states) if self.optimizer.state_floats_per_row else np.zeros(0, np.float32)
        self.cold.load(w, s)
        with torch.no_grad():
            self.hot_w.copy_(torch.from_numpy(w[self.hot_rows]))
            if s.size:
                self.hot_s.copy_(torch.from_numpy(s[self.hot_rows]))

    # -- re-placement ---------------------------------------------------------------------------------------
    def replace(self, hot_rows: np.ndarray) -> dict[str, int]:
        """Makes ``hot_rows`` (fused ids) the hot set, between two steps (nothing in flight); see
        :func:`hotline.tiers.rehome.swap_hot_set`. Returns how many rows moved each way."""
        from hotline.tiers.rehome import swap_hot_set

        return swap_hot_set(self, hot_rows)

    def close(self) -> None:
        self.cold.close()

    def shard_state(self) -> dict[str, torch.Tensor]:
        """This rank's checkpoint share: its cold rows (every rank) and the hot tier (rank 0 only)."""
        w, s = self.cold.host.all()
        out = {"cold_w": torch.from_numpy(w), "cold_s": torch.from_numpy(s)}
        if self.comm.rank == 0:
            out.update(hot_w=self.hot_w.detach().cpu().clone(), hot_s=self.hot_s.cpu().clone())
        return out

    def load_shard_state(self, own: dict, rank0: dict) -> None:
        host = self.cold.host
        shape = (host.num_rows, self.dim)
        if tuple(own["cold_w"].shape) != shape or rank0["hot_w"].shape != self.hot_w.shape:
            raise ValueError(
                f"checkpoint shard has {tuple(own['cold_w'].shape)} cold and {tuple(rank0['hot_w'].shape)} hot "
                f"rows, this rank expects {shape} and {tuple(self.hot_w.shape)} "
                f"(same placement and number of ranks?)"
            )
        host.replace_all(own["cold_w"].numpy(), own["cold_s"].numpy())
        with torch.no_grad():
            self.hot_w.copy_(rank0["hot_w"])
            self.hot_s.copy_(rank0["hot_s"])
