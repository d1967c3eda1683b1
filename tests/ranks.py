"""Ranks for tests and benchmarks: ``spawn(N, fn, ...)`` runs ``fn(comm, ...)`` on N fresh processes in one
process group on 127.0.0.1, and ``train_and_dump`` is a spawn target that trains and saves what a test compares.

The package's own launcher (``hotline train --nproc N``, torchrun) is hotline/distributed/launcher.py; this
module only starts ranks for a test. Tests import it as ``ranks`` (pytest puts tests/ on ``sys.path``), and so
do the multi-rank benchmarks (benchmarks/common.py puts tests/ on ``sys.path``)."""

from __future__ import annotations

import os
import socket
import time

import numpy as np

from hotline.distributed.comm import Comm, backend_for
from hotline.distributed.launcher import _init_process_group
from hotline.training.config import TrainConfig


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_device(device: str, local_rank: int) -> str:
    """The device local rank ``local_rank`` computes on: on CUDA its own GPU (modulo the GPUs there are)."""
    import torch

    if torch.device(device).type != "cuda":
        return device
    return f"cuda:{local_rank % max(1, torch.cuda.device_count())}"


def _spawned(rank: int, world_size: int, port: int, threads: int, device: str, fn, args: tuple) -> None:
    import torch.distributed as dist

    from hotline.pipeline.threads import bind_device, configure_threads

    # As torchrun does: a config's "cuda" (or "auto") resolves to this rank's GPU (training.config).
    os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = str(rank), str(world_size)
    configure_threads(threads)
    bind_device(rank_device(device, rank))
    _init_process_group(
        backend_for(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        comm = Comm.from_process_group()
        fn(comm, *args)
        comm.barrier()  # no rank tears the group down while a peer still uses it
    finally:
        dist.destroy_process_group()


def spawn(world_size: int, fn, *args, threads: int = 1, device: str = "cpu") -> None:
    """Runs ``fn(comm, *args)`` on ``world_size`` fresh processes in a process group on 127.0.0.1 (tests,
    benchmarks): gloo for ``device`` cpu; for cuda NCCL, rank r on GPU r (and a gloo group for host tensors).

    ``fn`` must be importable by name (a module-level function); ``threads`` torch/numba threads per rank.
    """
    import torch.multiprocessing as mp

    mp.spawn(
        _spawned, args=(world_size, free_port(), threads, device, fn, args), nprocs=world_size, join=True
    )


# Step counters train_and_dump records per step (summed over ranks), in this order.
MEASURED = ("lookups", "hot_lookups", "popular_samples", "working_set_rows")


def train_and_dump(comm: Comm, jobs: list[tuple[TrainConfig, str, str]]) -> None:
    """Trains each ``(config, dataset, out)`` job in turn (no evaluation); rank 0 writes every parameter and
    the per-step losses and seconds to ``out`` (.npz). A spawn target for tests and benchmarks."""
    from hotline.training.trainer import Trainer

    for config, dataset, out in jobs:
        trainer = Trainer(config, dataset, comm)
        try:
            losses, seconds, sent, stale, seen = [], [], [], [], []
            comm.barrier()
            for stats in trainer.progress(trainer.batches()):
                losses.append(float(stats.loss_sum))
                stale.append(stats.counters.get("stale_rows", 0))
                seen.append([stats.counters.get(k, 0.0) for k in MEASURED])
                seconds.append(time.perf_counter())
                sent.append({k: v for k, v in stats.counters.items() if k.startswith("bytes_sent_")})
            arrays = trainer.named_arrays()
            if comm.rank == 0:
                kinds = sorted({k for s in sent for k in s})
                np.savez(
                    out,
                    losses=np.asarray(losses),
                    stale_rows=np.asarray(stale),
                    measured=np.asarray(seen, dtype=np.float64).reshape(len(seen), len(MEASURED)),
                    measured_kinds=np.asarray(MEASURED),
                    step_end_s=np.asarray(seconds),
                    bytes_kinds=np.asarray(kinds),
                    bytes_sent=np.asarray([[s.get(k, 0.0) for k in kinds] for s in sent]).reshape(
                        len(sent), -1
                    ),
                    replace_steps=np.asarray(
                        [r["step"] for r in trainer.history if r.get("kind") == "replace"], dtype=np.int64
                    ),
                    **arrays,
                )
        finally:
            trainer.close()
