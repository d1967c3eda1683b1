"""The on-disk dataset directory: memory-mapped ``.npy`` arrays per split plus ``meta.json``.

Layout of a dataset directory::

    meta.json                 format tag, table sizes, pooling factor, rows per split, fingerprint, source
    {split}_dense.npy         float32 [N, num_dense]   dense features, already log(x+1)-transformed
    {split}_sparse.npy        int32   [N, T, L]        row ids per table (L = pooling factor, 1 = one-hot)
                           or int32   [N, C]           multi-hot bags of per-table sizes (format 2, below)
    {split}_labels.npy        float32 [N]              click labels, 0.0 or 1.0

Format 2 (``hotline-dataset/2``) adds ``bag_sizes`` (L_t per table) and ``padded`` to meta.json: table t's bag
is columns ``sum(L_<t) : sum(L_<=t)`` of the ``[N, C]`` sparse array (C = sum L_t), and with ``padded`` a bag
shorter than L_t fills its remaining columns with -1 (:data:`~hotline.table_layout.PAD_ID`), which every stage
skips. Format 1 (one pooling factor for all tables) stays readable and written for uniform bags.

for ``split`` in ``train``, ``val``, ``test`` (a split may have zero rows). Arrays load with
``allow_pickle=False`` semantics (a pickled object array is refused, never run) and are read row range by row
range (:class:`~hotline.datasets.files.ArrayFile`): a dataset never has to fit in memory. ``meta.json`` records
every array's size and sampled content digest (``arrays``), checked at open.

Writers go through :class:`DatasetWriter`, which builds the directory under a temporary name and renames it
into place only when every array and ``meta.json`` are complete, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotline._io import TMP_MARKER, fsync_dir, remove_stale_temporaries, replace_whole, write_json
from hotline._paths import file_problem
from hotline.datasets.files import ArrayFile, DatasetError, sampled_digest
from hotline.table_layout import BagLayout, TableLayout

FORMAT_TAG = "hotline-dataset/1"
FORMAT_TAG_BAGS = "hotline-dataset/2"
"""Datasets with per-table bag sizes (and padding): sparse ids [N, C]."""
FORMAT_TAGS = (FORMAT_TAG, FORMAT_TAG_BAGS)
SPLITS = ("train", "val", "test")
NUM_DENSE = 13
ID_DTYPE = np.int32


@dataclass(frozen=True)
class Batch:
    """One mini-batch as numpy arrays (B samples, T tables, L lookups per bag)."""

    dense: np.ndarray
    """float32 [B, num_dense] dense features."""
    sparse: np.ndarray
    """int32 [B, T, L] row ids per table (L = 1 is the one-hot case), or [B, C] bags of per-table sizes."""
    labels: np.ndarray
    """float32 [B] labels in {0, 1}."""
    global_size: int = -1
    """Samples of the global mini-batch this batch is one rank's shard of (the loss normaliser); -1: itself."""

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def loss_normaliser(self) -> int:
        """The number of samples the loss of this batch is averaged over (the whole global mini-batch)."""
        return len(self) if self.global_size < 0 else self.global_size


class Split:
    """One split (train / val / test) of a dataset: three array files (:class:`ArrayFile`: indexing one reads
    rows into memory, and a file changed since it was opened is a DatasetError, never a bus error)."""

    def __init__(self, name: str, dense: ArrayFile, sparse: ArrayFile, labels: ArrayFile):
        self.name = name
        self.dense = dense
        self.sparse = sparse
        self.labels = labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batch(self, start: int, stop: int, global_size: int = -1) -> Batch:
        """Rows ``start:stop`` as an in-memory :class:`Batch` (copied out of the memory map); ``global_size``:
        the samples of the global mini-batch it is a shard of."""
        return Batch(
            dense=self.dense[start:stop],
            sparse=self.sparse[start:stop],
            labels=self.labels[start:stop],
            global_size=global_size,
        )

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        n = len(self)
        return n // batch_size if drop_last else -(-n // batch_size)

    def batches(
        self,
        batch_size: int,
        num_batches: int | None = None,
        start_batch: int = 0,
        drop_last: bool = False,
    ) -> Iterator[Batch]:
        """Consecutive mini-batches in file order, starting at batch index ``start_batch``."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        total = self.num_batches(batch_size, drop_last)
        stop = total if num_batches is None else min(total, start_batch + num_batches)
        for b in range(start_batch, stop):
            yield self.batch(b * batch_size, min((b + 1) * batch_size, len(self)))


class Dataset:
    """A preprocessed dataset directory opened read-only (see the module docstring for the layout)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not self.path.is_dir():
            problem = file_problem(self.path)
            if problem is None or problem.startswith("is "):  # it is something, just not a directory
                kind = "a regular file" if problem is None else problem[3:].removesuffix(", not a file")
                problem = f"is not a directory ({kind})"
            raise DatasetError(f"dataset directory {self.path} {problem}")
        problem = file_problem(meta_path)
        if problem == "does not exist":
            raise DatasetError(f"{meta_path} is missing: {self.path} is not a Hotline dataset directory")
        if problem is not None:
            raise DatasetError(f"{meta_path} {problem}: {self.path} is not a Hotline dataset directory")
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetError(f"{meta_path} is not valid JSON: {e}") from e
        if not isinstance(meta, dict):
            raise DatasetError(
                f"{meta_path} holds a JSON {type(meta).__name__}, not an object: it was not written by DatasetWriter"
            )
        if meta.get("format") not in FORMAT_TAGS:
            raise DatasetError(
                f"{meta_path}: format is {meta.get('format')!r}, expected {FORMAT_TAG!r} (or {FORMAT_TAG_BAGS!r})"
            )
        self.meta = meta
        try:
            self.table_sizes: list[int] = [int(s) for s in meta["table_sizes"]]
            uniform = meta["format"] == FORMAT_TAG
            pooling = int(meta["pooling_factor"]) if uniform else 0
            bag_sizes = [pooling] * len(self.table_sizes) if uniform else [int(b) for b in meta["bag_sizes"]]
            self.bags = BagLayout(TableLayout(self.table_sizes), bag_sizes, bool(meta.get("padded", False)))
            self.num_dense: int = int(meta["num_dense"])
            self.fingerprint: str = str(meta["fingerprint"])
            rows = {name: int(meta["splits"].get(name, 0)) for name in SPLITS}
        except KeyError as e:
            raise DatasetError(f"{meta_path} lacks the field {e}: it was not written by DatasetWriter") from e
        except (TypeError, ValueError, AttributeError) as e:
            raise DatasetError(f"{meta_path} has a malformed field: {e}") from e
        self.uniform = uniform
        """Format 1: sparse ids [N, T, L] with one pooling factor."""
        self.bag_sizes: list[int] = self.bags.bag_sizes
        self.padded: bool = self.bags.padded
        self.pooling_factor: float = pooling if uniform else self.bags.num_columns / len(self.table_sizes)
        """Id columns per table and sample: L of a uniform dataset, the mean bag size of a multi-hot one."""
        self._splits: dict[str, Split] = {}
        for name in SPLITS:
            self._splits[name] = self._open_split(name, rows[name])
        self._check_digests(meta_path, meta.get("arrays"))

    def arrays(self) -> dict[str, dict]:
        """Every array file by name, with its size and sampled content digest (as meta.json records them)."""
        return {
            a.path.name: {"bytes": a.offset + a.nbytes, "sha256_sampled": a.digest}
            for split in self._splits.values()
            for a in (split.dense, split.sparse, split.labels)
        }

    @property
    def content_fingerprint(self) -> str:
        """A hash of :attr:`fingerprint` and every array's name, size and sampled content digest: what a run
        read (a file swapped for another dataset's changes it, even where meta.json records no digests)."""
        key = json.dumps([self.fingerprint, self.arrays()], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def _check_digests(self, meta_path: Path, recorded) -> None:
        """Raises DatasetError for an array whose size or sampled digest differs from meta.json's record (a
        dataset written before digests were recorded has none to check)."""
        if recorded is None:
            return
        if not isinstance(recorded, dict):
            raise DatasetError(f"{meta_path} has a malformed field: 'arrays' is not an object")
        for name, now in self.arrays().items():
            then = recorded.get(name)
            if then != now:

                def said(r):
                    if not isinstance(r, dict):
                        return "nothing"
                    return f"{r.get('bytes')} bytes, sampled sha256 {str(r.get('sha256_sampled'))[:12]}"

                raise DatasetError(
                    f"{self.path / name} is not the file this dataset was written with (meta.json records "
                    f"{said(then)}; the file has {said(now)}): swapped for, or linked to, another dataset's "
                    "file? Restore it or regenerate the dataset"
                )

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def lookups_per_sample(self) -> int:
        """Id columns per sample (C = T * L, or the sum of the bag sizes): real lookups plus padding."""
        return self.bags.num_columns

    @property
    def total_rows(self) -> int:
        """Number of embedding rows over all tables."""
        return int(sum(self.table_sizes))

    def split(self, name: str) -> Split:
        if name not in self._splits:
            raise DatasetError(f"unknown split {name!r}; expected one of {SPLITS}")
        return self._splits[name]

    @property
    def train(self) -> Split:
        return self._splits["train"]

    @property
    def val(self) -> Split:
        return self._splits["val"]

    @property
    def test(self) -> Split:
        return self._splits["test"]

    def _open_split(self, name: str, n: int) -> Split:
        expect = {
            "dense": ((n, self.num_dense), np.float32),
            "sparse": (
                (n, self.num_tables, self.pooling_factor) if self.uniform else (n, self.bags.num_columns),
                ID_DTYPE,
            ),  # fmt: skip
            "labels": ((n,), np.float32),
        }
        arrays = {}
        for kind, (shape, dtype) in expect.items():
            f = self.path / f"{name}_{kind}.npy"
            problem = file_problem(f)
            if problem == "does not exist":
                raise DatasetError(f"{f} is missing (meta.json says split {name!r} has {n} rows)")
            if problem is not None:
                raise DatasetError(f"{f} {problem}")
            try:
                arrays[kind] = ArrayFile(f, shape, dtype)  # header, dtype, shape and size checked here
            except OSError as e:
                raise DatasetError(f"{f} cannot be read as a .npy array: {e}") from e
        return Split(name, arrays["dense"], arrays["sparse"], arrays["labels"])

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self._splits.items())
        return f"Dataset({str(self.path)!r}, tables={self.num_tables}, rows={self.total_rows}, {sizes})"


def fingerprint_of(meta: dict) -> str:
    """A stable hash of what identifies a dataset: table sizes, split sizes, pooling and the source."""
    key = {k: meta[k] for k in ("table_sizes", "pooling_factor", "num_dense", "splits", "source")}
    key.update(
        {k: meta[k] for k in ("bag_sizes", "padded") if k in meta}
    )  # format 2 only: old ones unchanged
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def record_arrays(path: str | os.PathLike) -> dict:
    """Records in ``path``'s meta.json the size and sampled digest of every array file as they are now, after
    a deliberate edit of the data in place (cleaning values, say); returns the new record. Without it, the
    edited dataset is refused at open as one whose files were swapped."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    meta.pop("arrays", None)
    write_json(path / "meta.json", meta)  # opened without a record: nothing to disagree with
    meta["arrays"] = Dataset(path).arrays()
    write_json(path / "meta.json", meta)
    return meta["arrays"]


def is_dataset_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory that Hotline wrote as a dataset (its meta.json carries the format tag)."""
    meta = Path(path) / "meta.json"
    try:
        return Path(path).is_dir() and json.loads(meta.read_text()).get("format") in FORMAT_TAGS
    except (OSError, ValueError, AttributeError):
        return False


def check_output_dir(out: str | os.PathLike, overwrite: bool = False, inputs=()) -> None:
    """Refuses (DatasetError) an output directory whose replacement could destroy something Hotline did not
    make: an existing file, a directory that is not a Hotline dataset, a Hotline dataset without
    ``overwrite``, or a directory holding (or being) one of the ``inputs``. An empty directory is fine."""
    out = Path(out)
    target = out.resolve()
    for given in inputs:
        src = Path(given).resolve()
        if src == target or target in src.parents:
            raise DatasetError(
                f"output directory {out} holds {given}: writing the dataset there would delete it; "
                "choose another output directory"
            )
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise DatasetError(f"output {out} exists and is not a dataset directory: refusing to replace it")
    if not any(out.iterdir()):
        return
    if not is_dataset_dir(out):
        raise DatasetError(
            f"output directory {out} exists and is not a Hotline dataset directory (no meta.json with format "
            f"{FORMAT_TAG!r}): refusing to replace it; choose a new or empty directory"
        )
    if not overwrite:
        raise DatasetError(
            f"output directory {out} already holds a Hotline dataset: pass overwrite=True to replace it"
        )


class DatasetWriter:
    """Builds a dataset directory atomically: everything goes to a temporary sibling directory (a name only
    Hotline uses, ``.DIR.hotline-tmp-<pid>-<random>``) that is renamed into place at the end.

    Use as a context manager; an exception inside the ``with`` block removes the temporary directory, so a
    failed run leaves no half-written dataset (and an existing dataset at ``out`` is only replaced once the
    new one is complete). What is at ``out`` is checked first by :func:`check_output_dir`: only an empty
    directory, or a Hotline dataset with ``overwrite=True``, is ever replaced; ``inputs`` (raw files) must not
    lie inside ``out``::

        with DatasetWriter(out, table_sizes, pooling_factor=1) as w:  # or bag_sizes=[...], padded=True
            dense, sparse, labels = w.create_split("train", n_rows)
            ...fill the memory maps...
            w.finish(source={"kind": "synthetic", "seed": 0})
    """

    def __init__(
        self,
        out: str | os.PathLike,
        table_sizes: list[int],
        pooling_factor: int = 1,
        num_dense: int = NUM_DENSE,
        *,
        overwrite: bool = False,
        inputs=(),
        bag_sizes: list[int] | None = None,
        padded: bool = False,
    ):
        self.out = Path(out)
        self.overwrite = bool(overwrite)
        self.inputs = [Path(p) for p in inputs]
        check_output_dir(self.out, self.overwrite, self.inputs)
        self.table_sizes = [int(s) for s in table_sizes]
        self.pooling_factor = int(pooling_factor)
        self.num_dense = int(num_dense)
        if self.pooling_factor < 1:
            raise ValueError(f"pooling_factor must be >= 1, got {pooling_factor}")
        # Per-table bag sizes or padding need format 2; uniform bags keep format 1 (and their fingerprints).
        if bag_sizes is not None and not padded and len(set(bag_sizes)) == 1:
            self.pooling_factor, bag_sizes = int(bag_sizes[0]), None
        self.bags = BagLayout(
            TableLayout(self.table_sizes),
            [self.pooling_factor] * len(self.table_sizes) if bag_sizes is None else bag_sizes,
            padded,
        )
        self.uniform = bag_sizes is None and not padded
        self.tmp = self.out.parent / f".{self.out.name}{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
        self._rows: dict[str, int] = {}
        self._finished = False

    def __enter__(self) -> DatasetWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.out.parent)  # a killed writer's temporary dataset (its pid gone)
        self.tmp.mkdir()  # a fresh random name: never a directory someone else made
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._finished:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def create_split(self, name: str, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Allocates the three arrays of a split as writable memory maps and returns (dense, sparse, labels)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        self._rows[name] = int(n_rows)
        T, L = len(self.table_sizes), self.pooling_factor
        dense = self._allocate(f"{name}_dense.npy", np.float32, (n_rows, self.num_dense))
        shape = (n_rows, T, L) if self.uniform else (n_rows, self.bags.num_columns)
        sparse = self._allocate(f"{name}_sparse.npy", ID_DTYPE, shape)
        labels = self._allocate(f"{name}_labels.npy", np.float32, (n_rows,))
        return dense, sparse, labels

    def _allocate(self, file_name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A writable memory-mapped .npy file whose disk blocks are reserved now.

        Without the reservation the file is sparse, and a disk that fills while the memory map is written
        kills the process with SIGBUS (no exception, no clean-up); reserved, a full disk is an OSError here.
        """
        path = self.tmp / file_name
        try:
            a = np.lib.format.open_memmap(path, "w+", dtype, shape)
            if hasattr(os, "posix_fallocate"):
                with open(path, "r+b") as f:
                    try:
                        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
                    except OSError as e:
                        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                            raise  # a file system without fallocate keeps the sparse file
        except OSError as e:
            raise OSError(
                e.errno,
                f"{e.strerror}: cannot write {file_name} ({np.dtype(dtype).itemsize * int(np.prod(shape)):,} "
                f"bytes) of dataset {self.out}; the partial output was removed",
            ) from e
        return a

    def finish(self, source: dict, extra: dict | None = None) -> Path:
        """Writes meta.json and moves the directory into place. ``source`` identifies where the data came from."""
        for name in SPLITS:
            if name not in self._rows:
                self.create_split(name, 0)
        meta = {
            "format": FORMAT_TAG if self.uniform else FORMAT_TAG_BAGS,
            "table_sizes": self.table_sizes,
            "pooling_factor": self.pooling_factor if self.uniform else max(self.bags.bag_sizes),
            **({} if self.uniform else {"bag_sizes": self.bags.bag_sizes, "padded": self.bags.padded}),
            "num_dense": self.num_dense,
            "splits": dict(self._rows),
            "source": source,
        }
        meta["fingerprint"] = fingerprint_of(meta)
        if extra:
            meta.update(extra)
        meta["arrays"] = {}
        for f in sorted(self.tmp.glob("*.npy")):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
                size = os.fstat(fh.fileno()).st_size
                meta["arrays"][f.name] = {"bytes": size, "sha256_sampled": sampled_digest(fh.fileno(), size)}
        write_json(self.tmp / "meta.json", meta)
        fsync_dir(self.tmp)  # its entries durable before it takes the name
        check_output_dir(self.out, self.overwrite, self.inputs)  # again: it may have changed meanwhile
        if self.out.exists() and any(self.out.iterdir()):
            replace_whole(self.tmp, self.out)  # over the Hotline dataset that check_output_dir accepted
        else:
            if self.out.exists():
                self.out.rmdir()  # empty
            self.tmp.rename(self.out)
        fsync_dir(self.out.parent)  # the rename itself durable
        self._finished = True
        return self.out
