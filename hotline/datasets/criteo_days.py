"""Criteo 1TB day files as torchrec's and MLPerf's scripts write them -> a Hotline dataset directory.

torchrec's ``npy_preproc_criteo.py`` / ``process_Criteo_1TB_Click_Logs_dataset.sh`` write, per day ``i``:

    day_{i}_dense.npy     float32 [n, 13]   dense features, already log-transformed
    day_{i}_sparse.npy    int     [n, 26]   one id per feature (contiguous ids, or raw values to hash)
    day_{i}_labels.npy    int     [n, 1]    click labels

and MLPerf's ``materialize_synthetic_multihot_dataset.py`` writes the multi-hot form beside them:

    day_{i}_sparse_multi_hot.npz   members "0" .. "25", member t int [n, L_t]   (``np.savez``, not compressed)

Nothing is tokenised again: every array is memory-mapped (an ``.npz`` member too, read in place from the zip
file) and copied chunk by chunk into the dataset, each id taken modulo its table size as torchrec's reader
does with ``hashes`` (MLPerf's ``--num_embeddings_per_feature``). Splits as torchrec's
``InMemoryBinaryCriteoIterDataPipe``: every day but the last is train (days 0-22 of the full set); the last day
(23) is cut in two, val = its first ceil(n/2) rows, test = the rest.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import numpy as np

from hotline._progress import bar_disable
from hotline.datasets.format import NUM_DENSE, DatasetWriter

NUM_FEATURES = 26
CHUNK_ROWS = 1 << 18


class DayFileError(ValueError):
    """A day file is missing, unreadable or does not match the others."""


def find_days(directory: Path) -> list[int]:
    """The day numbers 0..D-1 of ``day_{i}_dense.npy`` in ``directory`` (consecutive from 0, else an error)."""
    found = sorted(
        int(m.group(1)) for p in directory.iterdir() if (m := re.fullmatch(r"day_(\d+)_dense\.npy", p.name))
    )
    if not found:
        raise DayFileError(
            f"{directory} holds no day_N_dense.npy files (torchrec's Criteo 1TB preprocessed form)"
        )
    if found != list(range(len(found))):
        missing = sorted(set(range(found[-1] + 1)) - set(found))
        raise DayFileError(
            f"{directory}: day files must be day_0 .. day_{found[-1]}; missing day {missing[0]}"
        )
    if len(found) < 2:
        raise DayFileError(
            f"{directory}: one day file only; the last day is val/test, so at least 2 are needed"
        )
    return found


def _load(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DayFileError(f"{path} is missing")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DayFileError(f"{path} cannot be read as a .npy array: {e}") from e


def npz_members(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed ``.npz`` file, memory-mapped in place (``np.load`` would read them)."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z, open(path, "rb") as f:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                if info.compress_type != zipfile.ZIP_STORED:
                    raise DayFileError(
                        f"{path}: member {info.filename} is compressed; only np.savez files map"
                    )
                f.seek(info.header_offset)
                local = f.read(30)
                if local[:4] != b"PK\x03\x04":
                    raise DayFileError(f"{path}: member {info.filename} has no local header")
                name_len, extra_len = (
                    int.from_bytes(local[26:28], "little"),
                    int.from_bytes(local[28:30], "little"),
                )
                start = info.header_offset + 30 + name_len + extra_len
                f.seek(start)
                version = np.lib.format.read_magic(f)
                reader = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = reader(f)
                if fortran or dtype.hasobject:
                    raise DayFileError(f"{path}: member {info.filename} is not a C-ordered plain array")
                out[info.filename[:-4]] = np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        if isinstance(e, DayFileError):
            raise
        raise DayFileError(f"{path} cannot be read as an .npz file: {e}") from e
    return out


class _Day:
    """One day's arrays, memory-mapped: dense [n, 13], labels [n], and the bags (one [n, L_t] per table)."""

    def __init__(self, directory: Path, i: int, multi_hot: bool):
        self.dense_path, self.labels_path = (
            directory / f"day_{i}_dense.npy",
            directory / f"day_{i}_labels.npy",
        )
        self.dense = _load(self.dense_path)
        if self.dense.ndim and self.dense.shape[0] == 0:
            raise DayFileError(
                f"{self.dense_path} holds 0 rows: an empty day file (did its preprocessing fail?); every day gives "
                f"rows (training rows, or the last day validation and test rows): remove it and renumber the days"
            )
        labels = _load(self.labels_path)
        self.labels = labels.reshape(labels.shape[0], -1)
        n = self.dense.shape[0]
        if self.dense.ndim != 2 or self.dense.shape[1] != NUM_DENSE or self.labels.shape != (n, 1):
            raise DayFileError(
                f"{directory}/day_{i}: dense {self.dense.shape} and labels {labels.shape} do not match "
                f"(expected [n, {NUM_DENSE}] and [n] or [n, 1])"
            )
        if multi_hot:
            path = directory / f"day_{i}_sparse_multi_hot.npz"
            if not path.is_file():
                raise DayFileError(f"{path} is missing (day_0 has the multi-hot form)")
            members = npz_members(path)
            if sorted(members) != sorted(str(t) for t in range(NUM_FEATURES)):
                raise DayFileError(f"{path}: members {sorted(members)}, expected '0' .. '{NUM_FEATURES - 1}'")
            self.bags = [members[str(t)] for t in range(NUM_FEATURES)]
            self.bags = [b.reshape(b.shape[0], -1) for b in self.bags]
            self.bag_names = [f"{path} (member {t})" for t in range(NUM_FEATURES)]
        else:
            sparse = _load(directory / f"day_{i}_sparse.npy")
            self.bag_names = [f"{directory / f'day_{i}_sparse.npy'}"] * NUM_FEATURES
            if sparse.ndim != 2 or sparse.shape[1] != NUM_FEATURES:
                raise DayFileError(
                    f"{directory}/day_{i}_sparse.npy has shape {sparse.shape}, expected [n, 26]"
                )
            self.bags = [sparse[:, t : t + 1] for t in range(NUM_FEATURES)]
        for t, b in enumerate(self.bags):
            if b.shape[0] != n or not np.issubdtype(b.dtype, np.integer):
                raise DayFileError(
                    f"{directory}/day_{i}: table {t}'s ids have shape {b.shape} and dtype {b.dtype}, "
                    f"expected {n} rows of integers"
                )

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def check_rows(self, lo: int, hi: int) -> None:
        """Raises DayFileError naming the file, the row (from 0) and the column of the first value of rows
        ``lo:hi`` that is not data: a dense feature that is NaN or infinite, a label outside [0, 1] (or NaN),
        a negative id (an id is taken modulo its table's size: a negative one would land on another row)."""
        dense, labels = np.asarray(self.dense[lo:hi]), np.asarray(self.labels[lo:hi, 0])
        bad = ~np.isfinite(dense) if dense.dtype.kind == "f" else np.zeros(dense.shape, bool)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise DayFileError(
                f"{self.dense_path}, row {lo + int(r)}, column {int(c)}: the value is {dense[r, c]}; dense "
                f"features must be finite numbers"
            )
        bad = ~((labels >= 0) & (labels <= 1))  # NaN too
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise DayFileError(
                f"{self.labels_path}, row {lo + r}: the label is {labels[r]}; labels must lie in [0, 1] (click "
                f"labels are 0 or 1)"
            )
        for t, bag in enumerate(self.bags):
            ids = np.asarray(bag[lo:hi])
            if ids.size and ids.min() < 0:
                r, c = np.argwhere(ids < 0)[0]
                raise DayFileError(
                    f"{self.bag_names[t]}, row {lo + int(r)}: table {t}'s id is {int(ids[r, c])}; ids must be "
                    f">= 0 (each is taken modulo its table's size: a negative one would land on another row)"
                )


def convert_days(
    directory: str | os.PathLike,
    out: str | os.PathLike,
    table_sizes: list[int],
    *,
    multi_hot: str = "auto",
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Writes the dataset of the day files in ``directory`` to ``out`` (see the module docstring); returns it.

    ``table_sizes``: rows per table, each id is taken modulo its table's size. ``multi_hot``: ``auto`` (the
    ``.npz`` form when day_0 has it), ``yes`` or ``no``.
    """
    from tqdm.auto import tqdm

    src = Path(directory)
    if not src.is_dir():
        raise DayFileError(f"day-file directory {src} does not exist")
    if len(table_sizes) != NUM_FEATURES or any(int(s) < 1 for s in table_sizes):
        raise ValueError(f"table sizes must be {NUM_FEATURES} positive integers, got {list(table_sizes)}")
    if multi_hot not in ("auto", "yes", "no"):
        raise ValueError(f"multi_hot must be auto, yes or no, got {multi_hot!r}")
    days_found = find_days(src)
    use_npz = (src / "day_0_sparse_multi_hot.npz").is_file() if multi_hot == "auto" else multi_hot == "yes"
    days = [_Day(src, i, use_npz) for i in days_found]
    bag_sizes = [b.shape[1] for b in days[0].bags]
    for i, d in enumerate(days):
        if [b.shape[1] for b in d.bags] != bag_sizes:
            raise DayFileError(
                f"{src}/day_{i}: bag sizes {[b.shape[1] for b in d.bags]} differ from day_0's {bag_sizes}"
            )
    last = len(days[-1])
    if last < 2:
        raise DayFileError(
            f"{days[-1].dense_path} holds {last} row: the last day is cut into validation and test (half each), "
            f"so it needs at least 2 rows"
        )
    half = (last + 1) // 2  # torchrec: val = the first ceil(n/2) rows of the last day, test = the rest
    parts = {
        "train": [(d, 0, len(d)) for d in days[:-1]],
        "val": [(days[-1], 0, half)],
        "test": [(days[-1], half, last)],
    }
    sizes = np.asarray(table_sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(bag_sizes)])
    writer = DatasetWriter(
        out, [int(s) for s in sizes], bag_sizes=bag_sizes, overwrite=overwrite, inputs=[src]
    )
    total = sum(hi - lo for p in parts.values() for _, lo, hi in p)
    with writer:
        bar = tqdm(
            total=total, unit="rows", unit_scale=True, desc="criteo days", disable=bar_disable(progress)
        )
        for name, pieces in parts.items():
            n = sum(hi - lo for _, lo, hi in pieces)
            dense, sparse, labels = writer.create_split(name, n)
            sparse2d = sparse.reshape(n, sum(bag_sizes))
            at = 0
            for day, lo, hi in pieces:
                for a in range(lo, hi, CHUNK_ROWS):
                    b = min(hi, a + CHUNK_ROWS)
                    k = b - a
                    day.check_rows(a, b)  # before any of the chunk is written: named, file and row
                    dense[at : at + k] = day.dense[a:b]
                    labels[at : at + k] = day.labels[a:b, 0]
                    for t, bag in enumerate(day.bags):
                        ids = np.asarray(bag[a:b]).astype(np.int64) % sizes[t]  # torchrec's hashes
                        sparse2d[at : at + k, starts[t] : starts[t + 1]] = ids
                    at += k
                    bar.update(k)
            for arr in (dense, sparse, labels):
                arr.flush()
            del dense, sparse, labels, sparse2d
        bar.close()
        source = {
            "kind": "criteo-days",
            "directory": str(src.resolve()),
            "days": len(days),
            "rows_per_day": [len(d) for d in days],
            "multi_hot": use_npz,
            "table_sizes": [int(s) for s in sizes],
        }
        return writer.finish(
            source=source, extra={"split_rule": "days 0..D-2 train; day D-1: val first ceil(n/2), test rest"}
        )
