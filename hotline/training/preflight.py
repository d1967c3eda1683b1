"""Checks before the first training step: every output can be written, the input data is in range.

A run that would fail after hours (an unwritable ``--dump-params``, a ``--checkpoint-dir`` below a file) fails
here, before any step, with one clear line naming the flag. Every output is treated the same way: its
directory is created if missing (as the writers do), and a real temporary file (a name only Hotline uses) is
created and removed in it, so permissions, read-only mounts and full disks are all seen.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from hotline._io import temporary_name


def _probe(directory: Path, flag: str, path: str | os.PathLike) -> None:
    """Creates the directory if missing and writes and removes a temporary file in it (ValueError if not)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = temporary_name(directory / "preflight")
        with open(probe, "wb") as f:
            f.write(b"\0")
        probe.unlink()
    except OSError as e:
        blocker = next((a for a in (directory, *directory.parents) if a.exists() and not a.is_dir()), None)
        why = f"{blocker} is a file, not a directory" if blocker is not None else (e.strerror or str(e))
        raise ValueError(f"{flag} {path}: cannot write there ({why})") from None


def check_outputs(outputs: dict[str, str | os.PathLike | None], directories: dict | None = None) -> None:
    """Raises ValueError naming the flag unless every file in ``outputs`` (flag -> path) and every directory
    in ``directories`` (flag -> path) can be written; None entries are skipped."""
    for flag, path in outputs.items():
        if path is None:
            continue
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"{flag} {path} is a directory: give a file name")
        _probe(p.parent, flag, path)
    for flag, path in (directories or {}).items():
        if path is None:
            continue
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise ValueError(f"{flag} {path} exists and is not a directory")
        _probe(p, flag, path)


def check_train_outputs(config, save: str | os.PathLike | None = None) -> None:
    """The outputs of a training run (``--metrics``, ``--dump-params``, ``--save``, ``--checkpoint-dir``)."""
    files = {"--metrics": config.metrics_path, "--dump-params": config.dump_params_path, "--save": save}
    check_outputs(files, {"--checkpoint-dir": config.checkpoint_dir})


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
                bags.check(chunk)
            except IndexError as e:
                raise IndexError(
                    f"{Path(dataset.path) / f'{name}_sparse.npy'}, chunk from sample {lo}: {e}"
                ) from None


def memory_needed(config, dataset, world_size: int = 1) -> int:
    """Host bytes a run allocates up front: the embedding rows and their optimizer state (this rank's share of
    the cold tier on N ranks, plus the replicated hot tier), the staging and dispatch buffers of the
    look-ahead ring, sized from the batch (the batch is clipped to the training split)."""
    from hotline.table_layout import bytes_per_row

    rows, row_bytes = dataset.total_rows, bytes_per_row(config.embedding_dim, config.optimizer)
    batch = max(1, min(config.mini_batch_size, len(dataset.train)))
    if config.mode == "device":
        return rows * row_bytes + rows * 4  # the table, its state, the update's scratch
    lookups = -(-batch // world_size) * dataset.lookups_per_sample
    ring = 1 if config.mode == "hybrid" else config.lookahead + 3
    tables = -(-rows // world_size) * row_bytes
    if (
        getattr(config, "cold_store", "memory") == "disk"
    ):  # rows on disk: their index arrays and the DRAM tier
        tables = -(-rows // world_size) * 8 * 4 + config.cold_cache + (config.hbm_budget or 0)
    buffers = ring * lookups * (row_bytes + 8 * 8)  # staging rows, dispatch index arrays (int64)
    return tables + buffers


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(config, dataset, world_size: int = 1, available: int | None = None) -> None:
    """Raises MemoryError with the figures when the run cannot fit in this machine's available memory."""
    from hotline.units import format_size

    available = available_memory() if available is None else available
    need = memory_needed(config, dataset, world_size)
    if available is not None and need > available:
        raise MemoryError(
            f"this run needs about {format_size(need)} of host memory up front (embedding rows and optimizer "
            f"state, look-ahead buffers), this machine has {format_size(available)} available: use a smaller "
            f"--mini-batch-size or --lookahead, more ranks (--nproc), or a machine with more memory"
        )
