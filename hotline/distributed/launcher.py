"""Data-parallel Hotline on torch.distributed: one model trained by N ranks, exactly as by one process.

``torchrun --nproc-per-node N -m hotline train ...`` (or ``hotline train --nproc N``, which starts the same
through torch's elastic launcher) runs one :class:`DistributedTrainer` per rank:

- each global mini-batch of B samples is cut into N contiguous shards (rank r: samples [r*B/N, (r+1)*B/N));
- the loss is normalised by the GLOBAL batch size, so the ranks' gradients add up to one process's gradient;
- dense gradients (and the step's loss) are summed by ONE all-reduce of a flat buffer, then every rank takes
  the same dense optimizer step;
- embedding rows: see ``hotline.distributed_tiers`` (hot tier replicated, cold tier sharded by row with
  all-to-all fetches and gradient returns; ``device`` mode replicates everything);
- checkpoints: one file per rank (``<name>.rank000-of-002.pt`` + digest); rank 0's holds the dense model, its
  optimizer and the hot tier, every rank's holds its cold shard; a resume needs the same N.

``hotline`` mode with ``--lookahead`` K > 0 fetches the cold rows of the next K steps on a thread of each rank
(over a second gloo group), and fetches again just before compute the rows an earlier step was still updating
(``hotline.distributed_tiers.LookAhead``): as exact as look-ahead 0.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from hotline.checkpoint import CheckpointError, _sha256, _write_atomic
from hotline.datasets.format import Batch, Split
from hotline.modes import StepStats, TrainMode
from hotline.train import TrainConfig, Trainer

# Step counters that are summed over ranks (in the dense all-reduce); the rest are this rank's own.
SUMMED_COUNTERS = ("popular_samples", "working_set_rows", "stale_rows")


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share [lo, hi) of ``n`` samples: [rank*n/N, (rank+1)*n/N)."""
    return rank * n // world_size, (rank + 1) * n // world_size


class Comm:
    """The collectives of a run (gloo or NCCL), counting the bytes this rank sends per kind of traffic.

    Counted as sent over the wire by a ring algorithm: all-reduce of S bytes, 2(N-1)/N * S; all-gather of a
    (padded) S-byte share, (N-1) * S; all-to-all, the rows addressed to the other ranks. With one rank every
    collective is a local no-op and nothing is counted.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, group=None):
        self.rank = rank
        self.world_size = world_size
        self.group = group  # the process group of the collectives (None: the default group)
        self.bytes_sent: dict[str, float] = defaultdict(float)

    @classmethod
    def from_process_group(cls) -> Comm:
        import torch.distributed as dist

        return cls(dist.get_rank(), dist.get_world_size())

    def new_group(self) -> Comm:
        """A Comm on a new gloo group of the same ranks (a collective: every rank creates it, in the same order).

        Its collectives never interleave with this Comm's, so another thread can use it (the look-ahead
        fetches); with one rank it is a plain Comm. Give it back with :meth:`destroy`.
        """
        if self.world_size == 1:
            return Comm(self.rank, 1)
        import torch.distributed as dist

        return Comm(self.rank, self.world_size, dist.new_group(backend="gloo"))

    def destroy(self) -> None:
        """Destroys this Comm's own group (from :meth:`new_group`; the default group is left alone)."""
        if self.group is not None:
            import torch.distributed as dist

            dist.destroy_process_group(self.group)
            self.group = None

    def take_bytes(self) -> dict[str, float]:
        """Bytes sent since the last call, per kind (and resets the counts)."""
        out, self.bytes_sent = dict(self.bytes_sent), defaultdict(float)
        return out

    def all_reduce_(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """Sums ``t`` over ranks in place."""
        if self.world_size > 1:
            import torch.distributed as dist

            host = t.cpu()  # gloo: collectives on host memory (a no-op copy for CPU tensors)
            dist.all_reduce(host, group=self.group)
            if host is not t:
                t.copy_(host)
            N = self.world_size
            self.bytes_sent[kind] += 2 * (N - 1) / N * t.numel() * t.element_size()
        return t

    def all_gather_varlen(self, t: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every rank's ``t`` (same trailing shape, any number of rows), in rank order."""
        if self.world_size == 1:
            return [t]
        import torch.distributed as dist

        n = torch.tensor([t.shape[0]], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, n, group=self.group)
        sizes = [int(s) for s in sizes]
        padded = torch.zeros((max(sizes), *t.shape[1:]), dtype=t.dtype)
        padded[: t.shape[0]] = t.cpu()
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        self.bytes_sent["control"] += 8 * (self.world_size - 1)
        self.bytes_sent[kind] += (self.world_size - 1) * padded.numel() * padded.element_size()
        return [p[:s].to(t.device) for p, s in zip(parts, sizes)]

    def all_to_all(
        self, t: torch.Tensor, send_counts: np.ndarray, kind: str, recv_counts: np.ndarray | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Sends rows ``t`` grouped by destination (``send_counts[j]`` rows to rank j); returns what arrived
        (grouped by source) and the counts per source (exchanged first unless ``recv_counts`` is given)."""
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if self.world_size == 1:
            return t.clone(), send_counts.copy()
        import torch.distributed as dist

        if recv_counts is None:
            got = torch.empty(self.world_size, dtype=torch.int64)
            dist.all_to_all_single(got, torch.from_numpy(send_counts), group=self.group)
            recv_counts = got.numpy().copy()
            self.bytes_sent["control"] += 8 * (self.world_size - 1)
        device, t = t.device, t.cpu().contiguous()
        out = torch.empty((int(recv_counts.sum()), *t.shape[1:]), dtype=t.dtype)
        dist.all_to_all_single(
            out, t, [int(c) for c in recv_counts], [int(c) for c in send_counts], group=self.group
        )
        row = int(np.prod(t.shape[1:])) * t.element_size()
        self.bytes_sent[kind] += float((send_counts.sum() - send_counts[self.rank]) * row)
        return out.to(device), recv_counts

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def all_ok(self, ok: bool) -> bool:
        """True when ``ok`` holds on every rank (so that all ranks raise together, none waits forever)."""
        flag = torch.tensor([0.0 if ok else 1.0])
        self.all_reduce_(flag, "control")
        return float(flag) == 0.0


@dataclass
class RankShard:
    """This rank's share of one global mini-batch."""

    batch: Batch
    """The rank's contiguous slice of the global batch."""
    global_size: int
    """Samples in the whole global batch (the loss normaliser)."""


class DistributedTrainer(Trainer):
    """A :class:`hotline.train.Trainer` for one rank of a data-parallel run (see the module docstring)."""

    def __init__(self, config: TrainConfig, dataset, comm: Comm | None = None):
        self.comm = comm if comm is not None else Comm.from_process_group()
        if self.comm.rank:  # one progress bar and one metrics file: rank 0's
            config = replace(config, progress=False, metrics_path=None)
        super().__init__(config, dataset)

    def _build_mode(self) -> TrainMode:
        from hotline.distributed_tiers import build_distributed_mode

        return build_distributed_mode(self.comm, self.config, self.dataset, self.sparse_opt)

    def _checkpoint_manager(self):
        d = self.config.checkpoint_dir
        return DistributedCheckpointManager(d, self.comm) if d else None

    # -- training -----------------------------------------------------------------------------------------
    def batches(self, start_step: int = 0):
        """This rank's shards of the global batches, from step ``start_step`` (reads only its own rows)."""
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
                yield RankShard(split.batch(start + lo, start + hi), stop - start)
            first = 0

    def progress(self, batches):
        """One step per shard: with look-ahead 0 every collective on this thread, in the same order on all
        ranks; ``hotline`` mode with look-ahead K > 0 fetches the cold rows of K steps ahead on a thread."""
        self.comm.take_bytes()  # each step reports only its own traffic
        if self.config.mode != "hotline" or self.config.lookahead == 0:
            for shard in batches:
                yield self.step(shard)
            return
        from hotline.distributed_tiers import LookAhead

        ahead = LookAhead(self.mode, self.config.lookahead, self.config.worker_threads)
        for fetched in ahead.progress((s.batch, s.global_size) for s in batches):
            yield self.step(RankShard(fetched.batch, fetched.global_size), fetched)

    def step(self, shard: RankShard, fetched=None) -> StepStats:
        """One global step: this rank's forward/backward and sparse updates, dense all-reduce, dense step
        (``fetched``: the shard's cold rows, fetched ahead)."""
        self.dense_opt.zero_grad(set_to_none=True)
        if fetched is None:
            stats = self.mode.step(self.model, shard.batch, shard.global_size)
        else:
            stats = self.mode.step(self.model, shard.batch, shard.global_size, fetched)
        t0 = time.perf_counter()
        self._all_reduce_dense(stats)
        t1 = time.perf_counter()
        self.dense_opt.step()
        stats.samples = shard.global_size
        stats.times["dense_allreduce"] = t1 - t0
        stats.times["dense_update"] = time.perf_counter() - t1
        for k, v in self.comm.take_bytes().items():  # plus what the look-ahead thread sent for this step
            stats.counters[f"bytes_sent_{k}"] = stats.counters.get(f"bytes_sent_{k}", 0.0) + v
        self.step_count += 1
        return stats

    def _all_reduce_dense(self, stats: StepStats) -> None:
        """Sums the dense gradients and the step's loss and counters over ranks in ONE all-reduce."""
        params = list(self.model.parameters())
        summed = [k for k in SUMMED_COUNTERS if k in stats.counters]
        dev = params[0].device
        flat = torch.cat(
            [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=dev) for p in params]
            + [torch.tensor([stats.loss_sum, *(stats.counters[k] for k in summed)], device=dev)]
        )
        self.comm.all_reduce_(flat, "dense_allreduce")
        at = 0
        for p in params:
            p.grad = flat[at : at + p.numel()].view_as(p).clone()
            at += p.numel()
        stats.loss_sum = float(flat[at])
        for i, k in enumerate(summed):
            stats.counters[k] = float(flat[at + 1 + i])

    # -- evaluation and export (collectives: every rank calls them) ---------------------------------------
    @torch.no_grad()
    def predict(self, split: Split, max_samples: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Click probabilities and labels of a split: each rank scores its shard of every eval batch."""
        self.model.eval()
        N, r = self.comm.world_size, self.comm.rank
        probs, labels = [], []
        n = min(len(split), max_samples) if max_samples else len(split)
        for start in range(0, n, self.config.eval_batch_size):
            stop = min(start + self.config.eval_batch_size, n)
            lo, hi = shard_bounds(stop - start, r, N)
            b = split.batch(start + lo, start + hi)
            pooled = self.mode.pooled_eval(b.sparse)
            if len(b):
                dense = torch.from_numpy(b.dense).to(self.config.device)
                local = torch.sigmoid(self.model(dense, pooled)).cpu()
            else:
                local = torch.zeros(0)
            probs.append(torch.cat(self.comm.all_gather_varlen(local, "eval")).numpy())
            labels.append(np.array(split.labels[start:stop]))
        self.comm.take_bytes()
        self.model.train()
        if not probs:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(probs), np.concatenate(labels)

    def dump_params(self, path: str | os.PathLike) -> None:
        """Every parameter by name (gathered from all ranks), written by rank 0."""
        arrays = self.named_arrays()
        if self.comm.rank == 0:
            np.savez(path, **arrays)
        self.comm.barrier()


# ------------------------------------------------------------------------------------------ checkpoints
DIST_FORMAT = "hotline-distributed-checkpoint/1"
_STEP_NAME = re.compile(r"^step-(\d{9})\.rank(\d{3})-of-(\d{3})\.pt$")


def rank_file(base: str | os.PathLike, rank: int, world_size: int) -> Path:
    """The file of ``rank`` in the checkpoint ``base`` written by ``world_size`` ranks."""
    base = Path(base)
    return base.with_name(f"{base.name}.rank{rank:03d}-of-{world_size:03d}.pt")


def _other_world_sizes(base: Path) -> list[int]:
    pattern = re.compile(re.escape(base.name) + r"\.rank\d{3}-of-(\d{3})\.pt$")
    found = {int(m.group(1)) for p in base.parent.glob(base.name + ".rank*") if (m := pattern.match(p.name))}
    return sorted(found)


def save_distributed(trainer: DistributedTrainer, base: str | os.PathLike) -> Path:
    """Writes this rank's checkpoint file of ``base`` (+ digest, atomically); a collective (ends in a barrier)."""
    comm = trainer.comm
    path = rank_file(base, comm.rank, comm.world_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    placement = getattr(trainer.mode, "placement", None)
    payload = {
        "format": DIST_FORMAT,
        "step": trainer.step_count,
        "mode": trainer.config.mode,
        "world_size": comm.world_size,
        "rank": comm.rank,
        "table_sizes": list(trainer.dataset.table_sizes),
        "dataset_fingerprint": trainer.dataset.fingerprint,
        "num_hot": int(placement.num_hot) if placement is not None else 0,
        "tiers": trainer.mode.shard_state(),
    }
    if comm.rank == 0:
        payload.update(
            model=trainer.model.state_dict(),
            dense_optimizer=trainer.dense_opt.state_dict(),
            torch_rng=torch.get_rng_state(),
        )
    _write_atomic(path, lambda f: torch.save(payload, f))
    digest = _sha256(path)
    _write_atomic(
        path.with_name(path.name + ".sha256"), lambda f: f.write(f"{digest}  {path.name}\n".encode())
    )
    comm.barrier()
    return path


def _read(path: Path) -> dict:
    digest = path.with_name(path.name + ".sha256")
    if not path.is_file() or not digest.is_file():
        raise CheckpointError(f"checkpoint file {path} (or its .sha256) does not exist")
    if _sha256(path) != (digest.read_text().split() or [""])[0]:
        raise CheckpointError(f"checkpoint file {path} is corrupt: its sha256 does not match {digest.name}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or crafted files
        raise CheckpointError(f"checkpoint file {path} cannot be loaded: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != DIST_FORMAT:
        raise CheckpointError(f"{path} is not a distributed Hotline checkpoint ({DIST_FORMAT})")
    return payload


def _load_local(trainer: DistributedTrainer, base: Path) -> tuple[dict, dict]:
    comm = trainer.comm
    N, r = comm.world_size, comm.rank
    own_path = rank_file(base, r, N)
    if not own_path.is_file():
        others = [n for n in _other_world_sizes(base) if n != N]
        if others:
            raise CheckpointError(
                f"checkpoint {base} was written by {others[0]} ranks, this run has {N}: resume it with "
                f"--nproc {others[0]} (a checkpoint's cold shards only load on the same number of ranks)"
            )
        raise CheckpointError(f"checkpoint {base}: no file for rank {r} of {N} ({own_path.name})")
    own = _read(own_path)
    rank0 = own if r == 0 else _read(rank_file(base, 0, N))
    for p in (own, rank0):
        if p["world_size"] != N or p["step"] != own["step"] or p["mode"] != trainer.config.mode:
            raise CheckpointError(
                f"checkpoint {base}: files disagree (world size {p['world_size']}, step {p['step']}, mode "
                f"{p['mode']!r}) with this run ({N} ranks, --mode {trainer.config.mode})"
            )
        if list(p["table_sizes"]) != list(trainer.dataset.table_sizes):
            raise CheckpointError(f"checkpoint {base} was made for other tables: {p['table_sizes'][:4]}...")
        if p["dataset_fingerprint"] != trainer.dataset.fingerprint:
            raise CheckpointError(f"checkpoint {base} was made on dataset {p['dataset_fingerprint']}")
    own_model, theirs = trainer.model.state_dict(), rank0["model"]
    if own_model.keys() != theirs.keys() or any(own_model[k].shape != theirs[k].shape for k in own_model):
        raise CheckpointError(f"checkpoint {base} does not match this model's architecture (--arch-* flags)")
    return own, rank0


def load_distributed(trainer: DistributedTrainer, base: str | os.PathLike) -> int:
    """Restores every rank of ``trainer`` from checkpoint ``base`` (a collective); returns the step."""
    base = Path(base)
    comm = trainer.comm
    error = None
    try:
        own, rank0 = _load_local(trainer, base)
    except CheckpointError as e:
        error = e
    if not comm.all_ok(error is None):
        raise error or CheckpointError(
            f"checkpoint {base}: another rank could not load its file (see its error)"
        )
    try:
        trainer.dense_opt.load_state_dict(rank0["dense_optimizer"])
        trainer.mode.load_shard_state(own["tiers"], rank0["tiers"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {base}: {e}") from e
    trainer.model.load_state_dict(rank0["model"])
    torch.set_rng_state(rank0["torch_rng"])
    trainer.step_count = int(own["step"])
    return trainer.step_count


class DistributedCheckpointManager:
    """Periodic per-rank checkpoints in a shared directory; a step counts when all N ranks' files are there."""

    def __init__(self, directory: str | os.PathLike, comm: Comm, keep: int = 2):
        self.directory = Path(directory)
        self.comm = comm
        self.keep = max(1, keep)

    def _steps(self) -> dict[int, dict[int, set[int]]]:
        """world size -> step -> ranks whose file and digest exist."""
        found: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
        if self.directory.is_dir():
            for p in self.directory.iterdir():
                m = _STEP_NAME.match(p.name)
                if m and p.with_name(p.name + ".sha256").is_file():
                    found[int(m.group(3))][int(m.group(1))].add(int(m.group(2)))
        return found

    def complete(self) -> list[Path]:
        """Bases of the checkpoints complete for this run's number of ranks, oldest first."""
        N = self.comm.world_size
        steps = self._steps().get(N, {})
        return [self.directory / f"step-{s:09d}" for s in sorted(steps) if len(steps[s]) == N]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, trainer: DistributedTrainer) -> Path:
        base = self.directory / f"step-{trainer.step_count:09d}"
        save_distributed(trainer, base)
        r, N = self.comm.rank, self.comm.world_size
        for old in self.complete()[: -self.keep]:  # each rank removes its own old files
            f = rank_file(old, r, N)
            f.with_name(f.name + ".sha256").unlink(missing_ok=True)
            f.unlink(missing_ok=True)
        return base

    def resume(self, trainer: DistributedTrainer) -> int | None:
        """Loads the newest checkpoint complete on all ranks; None when there is none (for any N)."""
        latest = self.latest()
        step = -1 if latest is None else int(latest.name.split("-")[1])
        agreed = self.comm.all_gather_varlen(torch.tensor([step], dtype=torch.int64), "control")
        if len({int(a) for a in agreed}) > 1:
            raise CheckpointError(
                f"ranks see different checkpoints in {self.directory}: it must be one directory shared by all ranks"
            )
        if latest is None:
            others = sorted(n for n in self._steps() if n != self.comm.world_size)
            if others:
                raise CheckpointError(
                    f"{self.directory} holds checkpoints written by {others[0]} ranks, this run has "
                    f"{self.comm.world_size}: resume with --nproc {others[0]}"
                )
            return None
        return load_distributed(trainer, latest)


# ------------------------------------------------------------------------------------ launching workers
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_from_env(backend: str | None = None) -> Comm:
    """Joins the process group torchrun described in the environment (RANK, WORLD_SIZE, MASTER_*)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = backend or "gloo"  # NCCL would need every collective on CUDA tensors: not done yet
        dist.init_process_group(backend)
    return Comm.from_process_group()


def worker_threads(threads: int) -> int:
    """Threads per rank: ``threads`` if given, else this machine's cores shared by the local ranks."""
    if threads:
        return threads
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, (os.cpu_count() or 1) // max(1, local))


def _spawned(rank: int, world_size: int, port: int, threads: int, fn, args: tuple) -> None:
    import torch.distributed as dist

    from hotline.train import configure_threads

    configure_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        fn(Comm.from_process_group(), *args)
        dist.barrier()  # no rank tears the group down while a peer still uses it
    finally:
        dist.destroy_process_group()


def spawn(world_size: int, fn, *args, threads: int = 1) -> None:
    """Runs ``fn(comm, *args)`` on ``world_size`` fresh processes in a gloo group on 127.0.0.1 (tests, benchmarks).

    ``fn`` must be importable by name (a module-level function); ``threads`` torch/numba threads per rank.
    """
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(world_size, free_port(), threads, fn, args), nprocs=world_size, join=True)


def train_and_dump(comm: Comm, jobs: list[tuple[TrainConfig, str, str]]) -> None:
    """Trains each ``(config, dataset, out)`` job in turn (no evaluation); rank 0 writes every parameter and
    the per-step losses and seconds to ``out`` (.npz). A spawn target for tests and benchmarks."""
    for config, dataset, out in jobs:
        trainer = DistributedTrainer(config, dataset, comm)
        try:
            losses, seconds, sent, stale = [], [], [], []
            comm.barrier()
            for stats in trainer.progress(trainer.batches()):
                losses.append(stats.loss_sum)
                stale.append(stats.counters.get("stale_rows", 0))
                seconds.append(time.perf_counter())
                sent.append({k: v for k, v in stats.counters.items() if k.startswith("bytes_sent_")})
            arrays = trainer.named_arrays()
            if comm.rank == 0:
                kinds = sorted({k for s in sent for k in s})
                np.savez(
                    out,
                    losses=np.asarray(losses),
                    stale_rows=np.asarray(stale),
                    step_end_s=np.asarray(seconds),
                    bytes_kinds=np.asarray(kinds),
                    bytes_sent=np.asarray([[s.get(k, 0.0) for k in kinds] for s in sent]).reshape(
                        len(sent), -1
                    ),
                    **arrays,
                )
        finally:
            trainer.close()


def launch(nproc: int, argv: list[str]) -> int:
    """Starts ``python -m hotline <argv>`` on ``nproc`` local ranks through torch's elastic launcher (torchrun)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    launcher_args = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "--module", "hotline", *argv]
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default; we set threads per rank ourselves
    try:
        run(launcher_args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return next((c for c in codes if c and c > 0), 1)
    return 0


def launcher_argv(
    parser: argparse.ArgumentParser, args: argparse.Namespace, drop: tuple[str, ...]
) -> list[str]:
    """The command line that reproduces ``args`` for ``parser`` (without the options in ``drop``)."""
    out: list[str] = []
    positional: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in drop:
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            if value is not None:
                positional.append(str(value))
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                out.append(flag)
        elif value is not None and value != action.default:
            out += [flag, str(value)]
    return positional + out


def run_cli(args: argparse.Namespace, config_from_args) -> int:
    """``hotline train`` with ``--nproc N`` (start N ranks) or under torchrun (be one rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 or "RANK" not in os.environ:
        return _launch_cli(args, config_from_args)
    if args.nproc and args.nproc != world:
        print(
            f"hotline train: error: --nproc {args.nproc} but torchrun started {world} ranks", file=sys.stderr
        )
        return 2
    return _worker_cli(args, config_from_args)


def _launch_cli(args, config_from_args) -> int:
    try:
        config_from_args(args)  # check every flag once, here, before any rank starts
    except ValueError as e:
        print(f"hotline train: error: {e}", file=sys.stderr)
        return 2
    if args.dataset is None:
        from hotline.datasets.synthetic import default_dataset

        args.dataset = str(default_dataset())  # made once here, not raced by the ranks
    return launch(args.nproc, ["train", *launcher_argv(args.train_parser, args, ("nproc", "train_parser"))])


def _worker_cli(args, config_from_args) -> int:
    import json

    from hotline.train import configure_threads

    comm = None
    try:
        config = config_from_args(args)
        comm = init_from_env()
        if args.dataset is None:
            from hotline.datasets.synthetic import default_dataset

            if comm.rank == 0:
                default_dataset()
            comm.barrier()
            args.dataset = str(default_dataset())
        configure_threads(worker_threads(config.threads))
        trainer = DistributedTrainer(config, args.dataset, comm)
        try:
            if args.load:
                step = load_distributed(trainer, args.load)
                if comm.rank == 0:
                    print(f"loaded {args.load} (step {step})", file=sys.stderr)
            summary = trainer.fit()
            if args.save:
                save_distributed(trainer, args.save)
        finally:
            trainer.close()
        # Every rank reaches this point before any tears gloo down: destroying the group while a peer's
        # connection is still live made that peer's gloo thread call std::terminate (seen in CI-like runs).
        comm.barrier()
    except (ValueError, IndexError, FloatingPointError, OSError) as e:
        print(f"hotline train: error (rank {comm.rank if comm else '?'}): {e}", file=sys.stderr)
        return 2 if not isinstance(e, FloatingPointError) else 3
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if comm.rank == 0:
        keys = ("mode", "steps", "samples_per_s", "val_auc", "val_logloss", "test_auc", "test_logloss")
        print(json.dumps({"world_size": comm.world_size, **{k: summary[k] for k in keys}}))
    return 0
