"""bench_scale's baseline and ceiling: the same DLRM with its tables in memory-mapped files, and what bounds a step.

The baseline is what a user would otherwise try when the tables do not fit in memory: hotline's ``device`` mode
(every table one fused tensor, looked up with ``index_select``, the row-wise Adagrad update by torch ops that
find the distinct rows by a sort: :meth:`~hotline.tiers.sparse_optim.SparseOptimizer.step_sorted`) with the
weights and the optimizer state as ``float32`` files mapped into memory (``np.memmap``): the same model, seed,
initial rows, optimizer, learning rate and batches as the run it is compared with; the kernel pages rows in and
writes them back as the memory limit allows. :class:`MappedDeviceMode` trains as ``DeviceMode`` with
``device_updates`` does, bit for bit (``tests/test_scale_baseline.py``).

The ceiling's parts: :func:`random_read_rate` (4 KiB reads at random pages of a file, ``depth`` at a time) and
:func:`dense_step_seconds` (the dense model's forward, backward and optimizer step alone, pooled rows given).
"""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PAGE = 4096

WHAT = (
    "hotline's device mode (same DLRM, seed, initial rows, row-wise Adagrad by torch ops, batches) with the "
    "fused table and its optimizer state as memory-mapped float32 files (np.memmap, madvise MADV_RANDOM), "
    "paged by the kernel"
)


def _drop_page_cache(path: Path) -> None:
    """Asks the kernel to drop ``path``'s clean cached pages (after a flush), so a run starts cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _mapped(path: Path, shape: tuple[int, ...], advice: str = "random") -> np.memmap:
    """A zero-filled float32 file of ``shape`` at ``path``, mapped read-write; ``advice`` "random" tells the
    kernel the pages are read at random (``madvise(MADV_RANDOM)``: a fault reads its page, not a read-ahead
    window around it), "normal" leaves the kernel's default read-ahead."""
    with open(path, "wb") as f:
        f.truncate(int(np.prod(shape)) * 4)
    m = np.memmap(path, np.float32, "r+", shape=shape)
    if advice == "random" and m.size:
        m._mmap.madvise(mmap.MADV_RANDOM)
    return m


def _device_mode():
    from hotline.tiers.device import DeviceMode

    class MappedDeviceMode(DeviceMode):
        """``DeviceMode`` whose fused table and optimizer state live in memory-mapped files in ``directory``
        (``table.f32``, ``state.f32``), written with the initial rows every mode starts from, table by table
        in chunks (never whole in memory); the update runs as torch ops (no per-row scratch)."""

        def __init__(self, layout, dim, optimizer, seed, directory, bags=None):
            import torch

            from hotline.distributed.comm import Comm
            from hotline.tiers.disk_store import table_chunks
            from hotline.tiers.packing import PackRing

            directory = Path(directory)
            directory.mkdir(parents=True, exist_ok=True)
            self.paths = [directory / "table.f32", directory / "state.f32"]
            w = _mapped(self.paths[0], (layout.num_rows, dim))
            for t, n in enumerate(layout.table_sizes):
                lo_t = int(layout.offsets[t])
                for lo, chunk in table_chunks(n, dim, seed, t):
                    w[lo_t + lo : lo_t + lo + chunk.shape[0]] = chunk
            s = _mapped(self.paths[1], optimizer.state_shape(layout.num_rows))
            for m, p in zip((w, s), self.paths):
                m.flush()
                _drop_page_cache(p)
            self.layout, self.bags, self.table_sizes, self.dim = layout, bags, layout.table_sizes, dim
            self.optimizer, self.device, self.comm = optimizer, torch.device("cpu"), Comm()
            self.weight, self.state, self.scratch = torch.from_numpy(w), torch.from_numpy(s), None
            self.device_updates = True  # torch ops, as a user's EmbeddingBag + optimizer would run them
            self.pack_copies = False
            self._packs = PackRing(self.device)
            self.phases = None
            self._steps = 0

        def release(self) -> None:
            """Unmaps the files (kept on disk)."""
            self.weight = self.state = None

        def close(self) -> None:
            """Unmaps and deletes the files."""
            self.release()
            for p in self.paths:
                p.unlink(missing_ok=True)

    return MappedDeviceMode


def mapped_mode(config, dataset, directory):
    """The baseline's mode for ``config`` (a TrainConfig) and ``dataset``, its files in ``directory``."""
    from hotline.table_layout import TableLayout
    from hotline.tiers.sparse_optim import SparseOptimizer

    opt = SparseOptimizer(config.optimizer, config.learning_rate, dim=config.embedding_dim)
    layout = TableLayout(dataset.table_sizes)
    return _device_mode()(layout, config.embedding_dim, opt, config.seed, directory, dataset.bags)


def train_mapped(config, dataset, directory, steps: int, losses: list | None = None) -> dict:
    """Trains the baseline for ``steps`` steps of ``config.mini_batch_size`` from step 0, as
    :meth:`hotline.training.trainer.Trainer.step` does (zero the dense gradients, the mode's step, the dense
    optimizer's step); returns the seconds of the fill, of the first step and of the rest, and the model and
    mode (their files deleted by ``mode.close()``). ``losses`` collects each step's summed loss."""
    from hotline.models.dlrm import DLRM

    t0 = time.perf_counter()
    mode = mapped_mode(config, dataset, directory)
    fill = time.perf_counter() - t0
    model = DLRM(config.model_config(dataset.table_sizes), seed=config.seed)
    dense_opt = mode.optimizer.dense_optimizer(model.parameters())
    B, split = config.mini_batch_size, dataset.train
    times = []
    for s in range(steps):
        t1 = time.perf_counter()
        dense_opt.zero_grad(set_to_none=True)
        stats = mode.step(model, split.batch(s * B, (s + 1) * B))
        dense_opt.step()
        if losses is not None:
            losses.append(float(stats.loss_sum))
        times.append(time.perf_counter() - t1)
    rest = sum(times[1:])
    return {"fill_s": fill, "first_step_s": times[0] if times else 0.0, "steps": steps,
            "samples_per_s": (steps - 1) * B / rest if rest else 0.0, "model": model, "mode": mode}  # fmt: skip


def random_read_rate(path: Path, depth: int, reads: int, seed: int = 0) -> float:
    """4 KiB reads per second at random page-aligned offsets of ``path``, ``depth`` reads in flight (threads
    issuing them through :func:`hotline.kernels.page_io.io_runs`, as the disk store's I/O threads do), with
    ``O_DIRECT`` as the disk store reads (its cached pages dropped first where the file system refuses it)."""
    from hotline.kernels.page_io import io_runs, io_runs_twin
    from hotline.tiers.disk_pages import aligned_bytes

    pages = max(1, path.stat().st_size // PAGE)
    offsets = (np.random.default_rng(seed).integers(0, pages, reads) * PAGE).tolist()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        _drop_page_cache(path)
        fd = os.open(path, os.O_RDONLY)
    buffers = [aligned_bytes(PAGE) for _ in range(max(1, depth))]
    try:
        t0 = time.perf_counter()

        def read(i: int, part: list[int]) -> None:  # each into thread i's page, the GIL released between them
            off = np.asarray(part, np.int64)
            at, size = np.zeros_like(off), np.full_like(off, PAGE)
            failed = io_runs(False, fd, buffers[i], at, off, size)
            if failed >= 0:
                io_runs_twin(False, fd, buffers[i], at[failed:], off[failed:], size[failed:])

        if depth <= 1:
            read(0, offsets)
        else:
            with ThreadPoolExecutor(depth) as pool:
                list(pool.map(lambda i: read(i, offsets[i::depth]), range(depth)))
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    return reads / seconds if seconds else 0.0


def dense_step_seconds(config, dataset, steps: int) -> float:
    """Median seconds of the dense model's forward, backward and optimizer step on the first ``steps``
    training batches, the pooled embeddings given (random, [B, T, D]): the part of a step no placement of
    the rows can remove."""
    import torch

    from hotline.models.dlrm import DLRM
    from hotline.tiers.base import loss_and_backward
    from hotline.tiers.sparse_optim import SparseOptimizer

    model = DLRM(config.model_config(dataset.table_sizes), seed=config.seed)
    opt = SparseOptimizer(config.optimizer, config.learning_rate, dim=config.embedding_dim)
    dense_opt = opt.dense_optimizer(model.parameters())
    B, T, D = config.mini_batch_size, len(dataset.table_sizes), config.embedding_dim
    gen = torch.Generator().manual_seed(0)
    times = []
    for s in range(steps):
        b = dataset.train.batch(s * B, (s + 1) * B)
        pooled = (torch.rand((len(b), T, D), generator=gen) - 0.5).requires_grad_()
        t0 = time.perf_counter()
        dense_opt.zero_grad(set_to_none=True)
        loss_and_backward(model, torch.from_numpy(b.dense), pooled, torch.from_numpy(b.labels), len(b))
        dense_opt.step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) if times else 0.0
