"""Checks before the first training step: the run's outputs (judged by :mod:`hotline.outputs`), the input
data in range, the ids in their tables, the run within memory.

A run that would fail after hours (an unwritable ``--dump-params``, a ``--checkpoint-dir`` below a file, an
output that would replace a user's file) fails before any step, with one clear line naming the flag.
"""

from __future__ import annotations

import json
import math
import os
import weakref
from pathlib import Path

import numpy as np

from hotline.kinds import staging_slots
from hotline.table_layout import bytes_per_row


def train_outputs(config, save=None, save_placement=None, world_size: int = 1) -> list:
    """The outputs of a training run, for :func:`hotline.outputs.claim`: ``--metrics`` (continued by a
    resumed run), ``--dump-init``, ``--dump-params``, ``--save-placement``, ``--save`` (every rank's file and
    its digest), ``--checkpoint-dir`` (a directory checkpoints are added to), ``--cold-dir`` and every rank's
    disk store files in it (:func:`hotline.tiers.disk_file.store_outputs`: never through a link, replaced only
    when provably the store's own)."""
    from hotline._io import digest_path
    from hotline.outputs import Output
    from hotline.training.checkpoint import rank_file

    resumes = bool(config.resume or config.resume_if_present)
    outs = [
        Output("--metrics", config.metrics_path, continues="records" if resumes else None),
        Output("--dump-init", config.dump_init_path),
        Output("--dump-params", config.dump_params_path),
        Output("--save-placement", save_placement),
        Output("--checkpoint-dir", config.checkpoint_dir, kind="dir"),
        Output("--cold-dir", config.cold_dir, kind="dir"),
    ]
    if config.cold_dir:
        from hotline.tiers.disk_store import cold_file
        from hotline.tiers.store_files import store_outputs

        for r in range(world_size):
            flag = "--cold-dir" if world_size == 1 else f"--cold-dir (rank {r})"
            outs += store_outputs(cold_file(config.cold_dir, r, world_size), flag)
    if save is not None:
        for r in range(world_size):
            label = "--save" if r == 0 else f"--save (rank {r})"
            f = rank_file(save, r, world_size)
            outs += [Output(label, f), Output(f"{label} (its digest)", digest_path(f))]
            if config.cold_store == "disk":  # the store's rows stream into a file beside it
                from hotline.training.checkpoint_rows import rows_path

                outs.append(Output(f"{label} (its rows)", rows_path(f)))
    return outs


def train_inputs(config, dataset=None, load=None) -> list[tuple[str, object]]:
    """The inputs of a training run: what no output may be or lie inside."""
    return [
        ("DATASET", dataset),
        ("--load", load),
        ("--init-params", config.init_params_path),
        ("--placement", config.placement_path),
    ]


DENSE_LIMIT = 1e6
"""The largest magnitude a dense feature may have. Hotline's readers write log(x+1) of the raw counts (at most
about 44 for a 64-bit count); a value near float32's limit (3e38) overflows the first layer to infinity, and
the run would end much later in a NaN loss blamed on the learning rate."""


def check_values(dataset_path, split, start: int, dense: np.ndarray, labels: np.ndarray) -> None:
    """Raises DatasetError naming the file, row (and column) of the first bad value of rows ``start..`` of
    ``split``: a dense feature or label that is NaN or infinite, a dense feature beyond +-:data:`DENSE_LIMIT`,
    or a label outside [0, 1] (click labels are 0 or 1; soft labels between them are accepted)."""
    from hotline.datasets.format import DatasetError

    rules = (
        ("dense", dense, ~np.isfinite(dense), "the input data must be finite (regenerate or clean the dataset)"),
        ("labels", labels, ~np.isfinite(labels), "the input data must be finite (regenerate or clean the dataset)"),
        ("dense", dense, np.abs(dense) > DENSE_LIMIT,
         f"dense features must lie within [-{DENSE_LIMIT:g}, {DENSE_LIMIT:g}] (Hotline's readers write log(x+1) "
         "of the raw values): rescale the data"),
        ("labels", labels, (labels < 0) | (labels > 1),
         "labels must lie in [0, 1] (click labels are 0 or 1; soft labels between them are accepted)"),
    )  # fmt: skip
    for kind, a, bad, expected in rules:
        if bad.any():
            where = np.argwhere(bad)[0]
            row = start + int(where[0])
            column = f", column {int(where[1])}" if a.ndim > 1 else ""
            name = Path(dataset_path) / f"{split.name}_{kind}.npy"
            raise DatasetError(
                f"{name}, row {row}{column}: the value is {float(a[tuple(where)])}; {expected}"
            )


def finite_json(record) -> str:
    """``record`` as strict JSON: NaN and infinities (an empty split's AUC) become null."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(record), allow_nan=False)


_CHUNK_ROWS = 1 << 18


def check_all_values(dataset) -> None:
    """:func:`check_values` over every row of every split, in chunks, before the first step: a bad value in
    the validation split is named now, not after hours of training."""
    for name in ("train", "val", "test"):
        split = dataset.split(name)
        for lo in range(0, len(split), _CHUNK_ROWS):
            hi = min(lo + _CHUNK_ROWS, len(split))
            check_values(
                dataset.path, split, lo, np.asarray(split.dense[lo:hi]), np.asarray(split.labels[lo:hi])
            )


def check_ids(dataset) -> None:
    """Raises IndexError naming the split's file, the sample, the table and the id if any id of any split is
    outside its table (read once, in chunks, before the first step: not found by a dispatch hours later)."""
    bags = dataset.bags
    for name in ("train", "val", "test"):
        sparse = dataset.split(name).sparse
        for lo in range(0, sparse.shape[0], _CHUNK_ROWS):
            chunk = bags.flat(np.asarray(sparse[lo : lo + _CHUNK_ROWS]))
            if not chunk.size:
                continue
            low = -1 if bags.padded else 0  # padding (-1) is a valid slot of a padded dataset
            if chunk.min() >= low and (chunk.max(axis=0) < bags.col_size).all():
                continue
            try:
                bags.check(chunk, first_sample=lo)
            except IndexError as e:
                raise IndexError(f"{Path(dataset.path) / f'{name}_sparse.npy'}, {e}") from None


def memory_needed(config, dataset, world_size: int = 1) -> int:
    """Host bytes a run allocates up front: the embedding rows and their optimizer state (this rank's share of
    the cold tier on N ranks, plus the replicated hot tier), the staging and dispatch buffers of the
    look-ahead ring, sized from the batch (the batch is clipped to the training split)."""
    rows, row_bytes = dataset.total_rows, bytes_per_row(config.embedding_dim, config.optimizer)
    batch = max(1, min(config.mini_batch_size, len(dataset.train)))
    if config.mode == "device":
        return rows * row_bytes + rows * 4  # the table, its state, the update's scratch
    lookups = -(-batch // world_size) * dataset.lookups_per_sample
    ring = staging_slots(config.mode, config.lookahead)
    tables = -(-rows // world_size) * row_bytes
    if getattr(config, "cold_store", "memory") == "disk":  # rows on disk: index arrays, hot rows, DRAM tier
        hot = config.hbm_budget or 0
        cache = 0 if config.cold_cache == "auto" else config.cold_cache  # auto: what the rest leaves
        per_row = per_row_structures(config, dataset, world_size)
        from hotline.tiers.held_rows import write_buffer_bytes

        held = write_buffer_bytes(config, dataset.total_rows, world_size)
        tables = per_row + cache + held + hot + hot // row_bytes * HOT_TABLE_BYTES
    buffers = ring * lookups * (row_bytes + 8 * 8)  # staging rows, dispatch index arrays (int64)
    return tables + buffers


HOST_BYTES_PER_ROW = 4
"""Host bytes per row of a disk-store run's structures that grow with the row count, at most: each row's int32
place in the file (where the order is mostly one ascending run, as the profile's is, only the rows outside it:
:func:`hotline.tiers.disk_pages.positions_of`). The dispatcher finds hot slots by a table of the hot rows
(:data:`HOT_TABLE_BYTES`), the file order stays on disk, the claim book holds the rows in flight only; measured
in ``tests/test_host_bytes.py``."""


def positions_bytes(config, dataset, world_size: int = 1) -> int:
    """Host bytes of a disk store's file positions on one rank, at most (:func:`hotline.tiers.disk_pages.\
positions_of`): 8 bytes for each row outside the file's ascending run (the rows the profile's sample counted and
the hot rows) where they are under a quarter of the rows, else :data:`HOST_BYTES_PER_ROW` a row."""
    from hotline.profiling.profiler import Profiler

    rows = -(-dataset.total_rows // world_size)
    sample = Profiler(mini_batch_size=config.mini_batch_size).sample_size(len(dataset.train))
    hot = (config.hbm_budget or 0) // bytes_per_row(config.embedding_dim, config.optimizer)
    kept = min(rows, sample * dataset.lookups_per_sample + hot)
    return 8 * kept if 4 * kept < rows else HOST_BYTES_PER_ROW * rows


def per_row_structures(config, dataset, world_size: int = 1) -> int:
    """Host bytes of a disk store's structures that grow with the row count on one rank, at most: its file
    positions (:func:`positions_bytes`), the bitmap of the rows written since a checkpoint, which a
    checkpoint or a load starts (:class:`~hotline.tiers.written_rows.WrittenRows`, a bit a row), that of
    the rows not written yet (:class:`~hotline.tiers.pending_rows.PendingRows`, a bit a row), that of the rows
    whose writes are held (:class:`~hotline.tiers.held_rows.HeldRows`, a bit a row), and the stamp of each
    page's last write (4 bytes a 4 KiB page)."""
    rows = -(-dataset.total_rows // world_size)
    pages = -(-rows * bytes_per_row(config.embedding_dim, config.optimizer) // 4096)
    return positions_bytes(config, dataset, world_size) + 3 * -(-rows // 8) + 4 * pages


HOT_TABLE_BYTES = 32
"""Host bytes per hot row, at most, of the dispatcher's hot table on the disk store
(:func:`hotline.kernels.dispatch.new_hot_table`)."""


def resolve_cold_cache(config, dataset, world_size: int = 1, memory=None, local_ranks: int | None = None):
    """``config`` with ``--cold-cache auto`` made bytes (else as it is): what :func:`check_memory` lets the run
    take, less what else it holds. What it may take: :func:`usable_memory` of the memory available now
    (``memory``: a HostMemory or bytes; by default :func:`~hotline.training.host_memory.host_memory`, the
    smaller of the machine's ``MemAvailable`` and the room under the cgroup limit), whose margin is the fixed
    allowance (torch's runtime, a step's activations, the page cache the data is read through). What else it
    holds: :func:`memory_needed` without the tier (the hot budget and its hot table, the per-row structures,
    the look-ahead buffers) and the dense model (:func:`dense_model_bytes`). The ranks of one machine
    (``local_ranks``, by default ``LOCAL_WORLD_SIZE``) share what it may take. Never below 0; 0 for the memory
    store (no DRAM tier)."""
    from dataclasses import replace

    from hotline.training.host_memory import HostMemory, host_memory

    if config.cold_cache != "auto":
        return config
    if getattr(config, "cold_store", "memory") != "disk":
        return replace(config, cold_cache=0)
    memory = host_memory() if memory is None else memory
    available = memory.available if isinstance(memory, HostMemory) else memory
    if available is None:
        raise MemoryShortfall(
            "--cold-cache auto sizes the DRAM tier by the available memory, which this system does not say: "
            "give --cold-cache a size"
        )
    rest = memory_needed(replace(config, cold_cache=0), dataset, world_size)
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if local_ranks is None else local_ranks)
    room = usable_memory(available) // local
    cache = room - rest - sum(dense_model_bytes(config, dataset)) - AUTO_CACHE_SLACK
    sized = replace(config, cold_cache=max(0, cache))
    from hotline.units import format_size

    source = memory.describe() if isinstance(memory, HostMemory) else "given"
    _SIZED[id(sized)] = f"{format_size(available)} available ({source})" + (
        f", shared by {local} ranks" if local > 1 else ""
    )
    weakref.finalize(sized, _SIZED.pop, id(sized), None)
    return sized


_SIZED: dict[int, str] = {}
"""What :func:`resolve_cold_cache` sized each config's DRAM tier from, by the config's id while it lives."""


def tier_sizing(config) -> str | None:
    """The memory ``--cold-cache auto`` sized ``config``'s DRAM tier from, in words (what
    :func:`resolve_cold_cache` read), or None where the size was given."""
    return _SIZED.get(id(config))


AUTO_CACHE_SLACK = 64 << 20
"""Bytes ``--cold-cache auto`` leaves besides the margin: the available memory moves between its reading and the
preflight's (:func:`check_memory` reads it again), which must still pass."""


def available_memory() -> int | None:
    """Bytes a new allocation can get now: the smaller of the machine's ``MemAvailable`` and the room left under
    the process's cgroup memory limit (:func:`hotline.training.host_memory.host_memory`), or None."""
    from hotline.training.host_memory import host_memory

    return host_memory().available


MEMORY_MARGIN = 0.10
"""Share of the available memory a run leaves free: :func:`memory_needed` counts only what a run allocates up
front, not torch's runtime, the model, a step's activations, the profile's counts or the page cache the
dataset is read through (a 26 GB disk-store run peaked at 2.2 GiB resident beside 0.75 GiB of its index
arrays)."""

MEMORY_HEADROOM = 512 << 20
"""Bytes a run leaves free besides :data:`MEMORY_MARGIN`: torch's own runtime on a small machine."""

COLD_DISK_FLAGS = "--cold-store disk --cold-dir DIR"
"""The flags that keep the cold rows out of host memory (a directory on local disk; Hotline makes its own file
there and never replaces one it did not make)."""


class MemoryShortfall(MemoryError, ValueError):
    """A run that cannot fit in this machine's memory, found before any long work: a MemoryError (what it is)
    and a ValueError (bad input a user can change: one line, no traceback)."""


def usable_memory(available: int) -> int:
    """Bytes of ``available`` memory a run may take: less :data:`MEMORY_MARGIN` and :data:`MEMORY_HEADROOM`."""
    return max(0, int((1.0 - MEMORY_MARGIN) * available) - MEMORY_HEADROOM)


def memory_advice(config) -> str:
    """What to change when a run does not fit: the disk store for rows held in host memory (the memory store,
    or device mode on the CPU), else the parts of the run that live in memory."""
    if getattr(config, "cold_store", "memory") == "disk":
        return "use a smaller --cold-cache, --hbm-budget or --mini-batch-size, or a machine with more memory"
    modes = " (--mode hybrid or hotline)" if config.mode == "device" else ""
    return (
        f"keep the cold rows on disk with {COLD_DISK_FLAGS}{modes} (DIR on local disk), or use a smaller "
        "--mini-batch-size or --lookahead, more machines, or one with more memory"
    )


def check_memory(config, dataset, world_size: int = 1, available=None) -> None:
    """Raises :class:`MemoryShortfall` with the figures when the run cannot fit in the memory it may allocate,
    less :func:`usable_memory`'s margin. ``available``: bytes, or a
    :class:`~hotline.training.host_memory.HostMemory`; by default both figures are read now, the machine's
    ``MemAvailable`` (what a new allocation can get without swapping, not the physical memory other processes
    hold part of) and the room under the process's cgroup memory limit (v2 or v1), and the smaller one binds."""
    from hotline.training.host_memory import HostMemory, host_memory
    from hotline.units import format_size

    memory = host_memory() if available is None else available
    if isinstance(memory, HostMemory):
        available = memory.available
        source = memory.describe() if memory.cgroup is not None else "MemAvailable; no cgroup memory limit"
        change = ", or raise the cgroup's memory limit" if memory.limited_by_cgroup else ""
    else:
        available, source, change = memory, "MemAvailable", ""
    need = memory_needed(config, dataset, world_size)
    if available is None or need <= usable_memory(available):
        return
    tables = -(-dataset.total_rows // world_size) * bytes_per_row(config.embedding_dim, config.optimizer)
    what = "look-ahead buffers, the rows' index arrays and the DRAM tier (the rows are on disk)"
    if getattr(config, "cold_store", "memory") != "disk":
        what = f"{format_size(tables)} of embedding rows and optimizer state, and look-ahead buffers"
    raise MemoryShortfall(
        f"this run needs about {format_size(need)} of host memory up front ({what}), more than the "
        f"{format_size(usable_memory(available))} it may take of the {format_size(available)} available "
        f"({source}, less {MEMORY_MARGIN:.0%} and {format_size(MEMORY_HEADROOM)} for torch and the steps): "
        f"{memory_advice(config)}{change}"
    )


DENSE_STATE_FLOATS = {"sgd": 0, "adagrad": 1, "rowwise-adagrad": 1, "adam": 2}
"""Floats of dense optimizer state per parameter (the dense layers use Adagrad for both Adagrads)."""


def dense_model_bytes(config, dataset) -> tuple[int, int]:
    """Host bytes of the dense model, counted before it is built: its parameters with their gradients and
    optimizer state, and one batch's activations (the batch clipped to the training split)."""
    from hotline.models.dlrm import dense_activations, dense_parameters

    model = config.model_config(dataset.table_sizes)
    params = dense_parameters(model) * 4 * (2 + DENSE_STATE_FLOATS.get(config.optimizer, 2))
    batch = max(1, min(config.mini_batch_size, len(dataset.train)))
    return params, batch * dense_activations(model) * 4


def check_dense_memory(
    config, dataset, world_size: int = 1, tables: bool = True, available: int | None = None
):
    """Raises :class:`MemoryShortfall` with the figures, before the model is built, when the dense model (its
    parameters, gradients, optimizer state and a batch's activations) does not fit in this machine's available
    memory less :func:`usable_memory`'s margin; with ``tables``, together with what :func:`memory_needed`
    counts (the tables and the look-ahead buffers). A size that could never be built (``--dcn-low-rank-dim
    100000000``, an MLP layer of a billion units) is one line here, not an allocator's traceback."""
    from hotline.units import format_size

    available = available_memory() if available is None else available
    params, activations = dense_model_bytes(config, dataset)
    rest = memory_needed(config, dataset, world_size) if tables else 0
    need = params + activations + rest
    if available is None or need <= usable_memory(available):
        return
    batch = max(1, min(config.mini_batch_size, len(dataset.train)))
    also = f", and {format_size(rest)} of tables and look-ahead buffers" if tables else ""
    raise MemoryShortfall(
        f"this run needs about {format_size(need)} of host memory up front: the dense model's parameters, "
        f"gradients and optimizer state take {format_size(params)} and its activations at batch {batch} "
        f"{format_size(activations)}{also}; more than the {format_size(usable_memory(available))} it may take "
        f"of the {format_size(available)} available: use a smaller --arch-mlp-bot / --arch-mlp-top, "
        f"--dcn-low-rank-dim, --dcn-num-layers or --mini-batch-size"
    )
