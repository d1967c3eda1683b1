"""Placement: which embedding rows are hot (kept in device memory) and where each hot row lives.

A :class:`Placement` is per table: the hot row ids in hot-slot order and a remap array row -> hot slot (or -1
for a cold row). Hot slots of all tables are fused into one id space by ``hot_offsets``, so the device holds a
single hot table of ``num_hot`` rows. It is saved as a plain ``.npz`` (no pickle) of the hot ids (the remaps
follow from them: the file grows with the hot rows, not the row count) together with the fingerprint of the
dataset it was profiled on, and loading it against another dataset is refused. Files of the first format, which
also stored every table's remap, still load (their remaps are checked against the hot ids).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hotline._io import atomic_write
from hotline._paths import check_file
from hotline.table_layout import TableLayout
from hotline.table_layout import bytes_per_row as _bytes_per_row

FORMAT_TAG = "hotline-placement/2"
"""The format :meth:`Placement.save` writes: header and hot ids only."""
FORMAT_WITH_REMAPS = "hotline-placement/1"
"""The first format, which also stored ``remap_<t>`` (int32 a row of every table); still read."""


class PlacementError(ValueError):
    """A placement does not fit its dataset, or a placement file is missing, corrupt or inconsistent."""


def bytes_per_row_for(embedding_dim: int, optimizer: str) -> int:
    """Device bytes one hot row costs: float32 embedding plus its optimizer state (one float for row-wise
    Adagrad, nothing for SGD)."""
    return _bytes_per_row(embedding_dim, optimizer)


class _Remaps(Sequence):
    """Per table, int32 [table_size]: row -> hot slot within that table, or -1 if the row is cold; each made from
    the hot ids when asked for, never kept (4 bytes a row of every table otherwise)."""

    def __init__(self, table_sizes: list[int], hot_ids: list[np.ndarray]):
        self._sizes, self._ids = table_sizes, hot_ids

    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, t):
        if isinstance(t, slice):
            return [self[i] for i in range(len(self))[t]]
        ids = self._ids[t]
        remap = np.full(self._sizes[t], -1, np.int32)
        remap[ids] = np.arange(ids.size, dtype=np.int32)
        return remap


def _write_npz(f, arrays) -> None:
    """``np.savez_compressed`` of the ``(name, array)`` pairs ``arrays`` yields, one array in memory at a time
    (remap arrays are mostly -1 and shrink a hundredfold)."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for name, a in arrays:
            with zf.open(f"{name}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(a), allow_pickle=False)


def _checked_ids(sizes: list[int], hot_ids: Sequence) -> list[np.ndarray]:
    """Each table's hot ids as int64, refused unless 1-D integers in range without duplicates (checked on a
    sorted copy of the hot ids, not a remap of every row)."""
    out = []
    for t, (size, ids) in enumerate(zip(sizes, hot_ids, strict=True)):
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise PlacementError(
                f"table {t}: hot ids must be a 1-D integer array, got {ids.dtype} {ids.shape}"
            )
        ids = ids.astype(np.int64, copy=False)
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            raise PlacementError(
                f"table {t}: hot ids must lie in [0, {size}), got [{ids.min()}, {ids.max()}]"
            )
        if ids.size > 1:
            ordered = np.sort(ids)
            if (ordered[1:] == ordered[:-1]).any():
                raise PlacementError(f"table {t}: hot ids contain duplicates")
        out.append(ids)
    return out


class _Stored(Sequence):
    """Per table, the remap stored in an open placement file, read when asked for (checked table by table)."""

    def __init__(self, npz, tables: int):
        self._npz, self._tables = npz, tables

    def __len__(self) -> int:
        return self._tables

    def __getitem__(self, t):
        if not 0 <= t < self._tables:
            raise IndexError(t)
        return self._npz[f"remap_{t}"]


class Placement:
    """Hot rows per table under a byte budget, with the remap arrays the training engine indexes with.

    Attributes:
        table_sizes: rows per table.
        hot_ids: per table, int64 row ids that are hot, in hot-slot order (slot i holds ``hot_ids[t][i]``).
        remap: per table, int32 [table_size]: row -> hot slot within that table, or -1 if the row is cold.
        hot_offsets: int64 [T+1]: the fused hot slot of (t, row) is ``hot_offsets[t] + remap[t][row]``.
        bytes_per_row, embedding_dim, hbm_budget_bytes: what a hot row costs and the budget it was chosen for.
        dataset_fingerprint: ``Dataset.fingerprint`` of the dataset it was profiled on ("" if none).
    """

    def __init__(
        self,
        table_sizes: Sequence[int],
        hot_ids: Sequence[np.ndarray],
        remap: Sequence[np.ndarray],
        *,
        dataset_fingerprint: str,
        embedding_dim: int,
        bytes_per_row: int,
        hbm_budget_bytes: int,
    ):
        self.table_sizes: list[int] = [int(s) for s in table_sizes]
        self.hot_ids: list[np.ndarray] = list(hot_ids)
        # checked against the hot ids (a table at a time: no remap of every row is held), then made on demand
        self.remap: Sequence[np.ndarray] = remap if isinstance(remap, (_Remaps, _Stored)) else list(remap)
        self.dataset_fingerprint: str = str(dataset_fingerprint)
        self.embedding_dim: int = int(embedding_dim)
        self.bytes_per_row: int = int(bytes_per_row)
        self.hbm_budget_bytes: int = int(hbm_budget_bytes)
        counts = np.array([len(h) for h in self.hot_ids], dtype=np.int64)
        self.hot_offsets: np.ndarray = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._validate()
        self.remap = _Remaps(self.table_sizes, self.hot_ids)
        self.sample_order: np.ndarray | None = None
        """The fused rows the profile it was chosen by counted, most counted first, ties by id (:meth:`profiled`:
        the counted rows alone, not a count of every row), until start-up takes them (:meth:`take_sample_order`);
        None otherwise (a loaded placement)."""
        self.sample_once: np.ndarray | None = None
        """With :attr:`sample_order`: each table's rows the profile counted exactly once."""
        self.profile_s: float | None = None
        """Seconds the profile it was chosen by took (:meth:`profiled`); None otherwise."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hot_ids(
        cls,
        table_sizes: Sequence[int],
        hot_ids: Sequence[np.ndarray],
        *,
        dataset_fingerprint: str = "",
        embedding_dim: int = 16,
        bytes_per_row: int | None = None,
        hbm_budget_bytes: int | None = None,
    ) -> Placement:
        """A placement from per-table hot row ids in slot order (its remaps are made from them when asked for).

        ``bytes_per_row`` defaults to ``embedding_dim * 4`` (SGD); ``hbm_budget_bytes`` to exactly the hot bytes.
        """
        sizes = [int(s) for s in table_sizes]
        if len(hot_ids) != len(sizes):
            raise PlacementError(f"hot_ids has {len(hot_ids)} tables but there are {len(sizes)} tables")
        ids_list = _checked_ids(sizes, hot_ids)
        if bytes_per_row is None:
            bytes_per_row = _bytes_per_row(embedding_dim, "sgd")
        num_hot = sum(int(i.size) for i in ids_list)
        if hbm_budget_bytes is None:
            hbm_budget_bytes = num_hot * int(bytes_per_row)
        return cls(
            sizes,
            ids_list,
            _Remaps(sizes, ids_list),
            dataset_fingerprint=dataset_fingerprint,
            embedding_dim=embedding_dim,
            bytes_per_row=int(bytes_per_row),
            hbm_budget_bytes=int(hbm_budget_bytes),
        )

    @classmethod
    def profiled(cls, profile, budget) -> Placement:
        """``profile.placement(budget)`` carrying the rows the profile counted, most counted first (ties by
        id: the profile's :attr:`~hotline.profiling.profile.Profile.order`) as :attr:`sample_order`, so that
        start-up (:func:`hotline.tiers.build.build_mode`, the disk file's order) takes them instead of reading the
        sample a second time."""
        placement = profile.placement(budget).carry_sample(profile)
        placement.profile_s = float(sum(getattr(profile, "timings", {}).values()))
        return placement

    def carry_sample(self, profile) -> Placement:
        """Carries ``profile``'s counted rows in count order (:attr:`sample_order`) and each table's rows it
        counted once (:attr:`sample_once`: the order of the disk file's never-counted rows) until start-up takes
        them; returns self."""
        self.sample_order = profile.order
        A = profile.order.shape[0]
        once = profile.table_of_order[profile._ranked_counts[:A] == 1]
        self.sample_once = np.bincount(once, minlength=len(profile.table_sizes))
        return self

    def take_sample_order(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``(order, once)``: the profile's counted rows in count order this placement carries (:meth:`profiled`)
        and each table's rows counted once, then forgets them (nothing keeps them past start-up); None when it
        carries none."""
        order, self.sample_order = self.sample_order, None
        once, self.sample_once = self.sample_once, None
        return None if order is None else (order, once)

    @classmethod
    def all_cold(cls, table_sizes: Sequence[int], **kwargs) -> Placement:
        """No hot rows (the hybrid baseline: everything in host memory)."""
        kwargs.setdefault("hbm_budget_bytes", 0)
        return cls.from_hot_ids(table_sizes, [np.zeros(0, np.int64) for _ in table_sizes], **kwargs)

    @classmethod
    def all_hot(cls, table_sizes: Sequence[int], **kwargs) -> Placement:
        """Every row hot, slot = row id (the device-only baseline)."""
        return cls.from_hot_ids(
            table_sizes, [np.arange(int(s), dtype=np.int64) for s in table_sizes], **kwargs
        )

    # ------------------------------------------------------------------ figures
    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def num_hot(self) -> int:
        """Hot rows over all tables."""
        return int(self.hot_offsets[-1])

    @property
    def hot_bytes(self) -> int:
        """Device bytes the hot rows take (embeddings plus optimizer state)."""
        return self.num_hot * self.bytes_per_row

    def fused_remap(self) -> np.ndarray:
        """int32 [sum(table_sizes)] (int64 from 2**31 hot rows): fused row id (table offset + row) -> fused hot
        slot, or -1 if cold; made from the hot ids with no wider temporary."""
        dtype = np.int32 if self.num_hot < 2**31 - 1 else np.int64
        out = np.full(sum(self.table_sizes), -1, dtype)
        for t, offset in enumerate(TableLayout(self.table_sizes).offsets.tolist()):
            ids = self.hot_ids[t]
            out[offset + ids] = np.arange(self.hot_offsets[t], self.hot_offsets[t + 1], dtype=dtype)
        return out

    def fused_hot_ids(self) -> np.ndarray:
        """int64 [num_hot]: the fused row id (table offset + row) of every hot row, in fused hot-slot order."""
        return TableLayout(self.table_sizes).fuse_rows(self.hot_ids)

    def __repr__(self) -> str:
        return (
            f"Placement(tables={self.num_tables}, hot_rows={self.num_hot}/{sum(self.table_sizes)}, "
            f"hot_bytes={self.hot_bytes}, budget={self.hbm_budget_bytes}, dataset={self.dataset_fingerprint!r})"
        )

    # ------------------------------------------------------------------ checks
    def _validate(self, source: str = "placement") -> None:
        T = len(self.table_sizes)
        if len(self.hot_ids) != T or len(self.remap) != T:
            raise PlacementError(
                f"{source}: {T} table sizes but {len(self.hot_ids)} hot id arrays and {len(self.remap)} remaps"
            )
        for t, (size, ids) in enumerate(zip(self.table_sizes, self.hot_ids, strict=True)):
            if ids.dtype != np.int64 or ids.ndim != 1:
                raise PlacementError(
                    f"{source}: table {t}: hot ids must be int64 [n], got {ids.dtype} {ids.shape}"
                )
            if isinstance(self.remap, _Remaps):  # made from these ids (checked there): nothing to compare
                continue
            remap = self.remap[t]  # one table's remap at a time
            if remap.dtype != np.int32 or remap.shape != (size,):
                raise PlacementError(
                    f"{source}: table {t}: remap must be int32 [{size}], got {remap.dtype} {remap.shape}"
                )
            if ids.size and (ids.min() < 0 or ids.max() >= size):
                raise PlacementError(f"{source}: table {t}: hot ids outside [0, {size})")
            hot_rows = np.flatnonzero(remap >= 0)
            if hot_rows.size != ids.size or (
                ids.size and not np.array_equal(remap[ids], np.arange(ids.size))
            ):
                raise PlacementError(f"{source}: table {t}: remap does not match the hot ids")
            if (remap < -1).any():
                raise PlacementError(f"{source}: table {t}: remap has entries below -1")
        if self.bytes_per_row <= 0 or self.embedding_dim <= 0:
            raise PlacementError(f"{source}: bytes_per_row and embedding_dim must be positive")

    def check_dataset(self, dataset) -> None:
        """Raises PlacementError unless ``dataset`` (a Dataset) is the one this placement was profiled on."""
        where = f" (placement file {self._path})" if getattr(self, "_path", None) else ""
        if dataset.fingerprint != self.dataset_fingerprint:
            raise PlacementError(
                f"placement{where} was made for dataset fingerprint {self.dataset_fingerprint!r}, but dataset "
                f"{dataset.path} has fingerprint {dataset.fingerprint!r}: profile this dataset again"
            )
        if list(dataset.table_sizes) != self.table_sizes:
            raise PlacementError(
                f"placement{where} has table sizes {self.table_sizes}, dataset {dataset.path} has "
                f"{list(dataset.table_sizes)}"
            )

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike, force: bool = False) -> Path:
        """Writes the placement to ``path`` (.npz, no pickle), atomically; returns the path. An existing file
        is replaced only with ``force`` (:func:`hotline.outputs.guard`)."""
        from hotline.outputs import guard

        path = guard("Placement.save path", path, force=force)  # a link's target
        header: dict[str, np.ndarray] = {
            "format": np.array(FORMAT_TAG),
            "table_sizes": np.array(self.table_sizes, dtype=np.int64),
            "embedding_dim": np.array(self.embedding_dim, dtype=np.int64),
            "bytes_per_row": np.array(self.bytes_per_row, dtype=np.int64),
            "hbm_budget_bytes": np.array(self.hbm_budget_bytes, dtype=np.int64),
            "dataset_fingerprint": np.array(self.dataset_fingerprint),
        }

        def arrays():
            yield from header.items()
            for t in range(self.num_tables):
                yield f"hot_ids_{t}", self.hot_ids[t]

        atomic_write(path, lambda f: _write_npz(f, arrays()))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, dataset=None) -> Placement:
        """Reads a placement saved by :meth:`save`; with ``dataset`` also checks it belongs to that dataset."""
        path = Path(path)
        check_file(path, "placement file", PlacementError)  # missing, a directory, a FIFO, /dev/null: named
        try:
            with np.load(path, allow_pickle=False) as z:
                tag = str(z["format"])
                if tag not in (FORMAT_TAG, FORMAT_WITH_REMAPS):
                    want = f"{FORMAT_TAG!r} (or {FORMAT_WITH_REMAPS!r})"
                    raise PlacementError(f"placement file {path}: format is {tag!r}, expected {want}")
                sizes = [int(s) for s in z["table_sizes"]]
                hot_ids = [z[f"hot_ids_{t}"] for t in range(len(sizes))]
                scalars = {k: int(z[k]) for k in ("embedding_dim", "bytes_per_row", "hbm_budget_bytes")}
                fingerprint = str(z["dataset_fingerprint"])
                try:  # stored remaps (the first format) are read and checked a table at a time, then dropped
                    remaps = _Stored(z, len(sizes)) if tag == FORMAT_WITH_REMAPS else None
                    if remaps is None:
                        hot_ids = _checked_ids(sizes, hot_ids)
                        remaps = _Remaps(sizes, hot_ids)
                    placement = cls(sizes, hot_ids, remaps, dataset_fingerprint=fingerprint, **scalars)
                except PlacementError as e:
                    raise PlacementError(f"placement file {path} is inconsistent: {e}") from e
        except PlacementError:
            raise
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, TypeError) as e:
            raise PlacementError(f"placement file {path} is corrupt or not a Hotline placement: {e}") from e
        placement._path = path
        if dataset is not None:
            placement.check_dataset(dataset)
        return placement
