"""Popularity profiler: access counts per (table, row) over a sample of a dataset, and what they imply.

:class:`Profiler` streams a sample of a split (a seeded uniform fraction, as FAE does, or the first N
mini-batches, as Hotline's learning phase does) through the counting kernel and returns a :class:`Profile`.
A Profile ranks the rows of all tables against each other by access count (ties by table, then row id) and
answers, for any HBM budget: which rows are hot (:meth:`Profile.placement`), which share of lookups they
serve, which share of samples are *popular* (every lookup hot), and how many cold rows a mini-batch needs.

The popular-sample share for every budget comes from one pass: with rows ranked 0, 1, 2, ..., a sample is
popular under a budget of ``k`` rows iff the largest rank among its lookups is ``< k``; a histogram of the
per-sample max rank gives the share for all ``k`` at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hotline._progress import bar_disable
from hotline.datasets.format import Dataset, DatasetError
from hotline.kernels import profile as kernels
from hotline.placement import bytes_per_row_for
from hotline.profiling.profile import Profile

# Keep the sampled ids in memory for the later passes (ranking, evaluate) when they are at most this big; else
# re-read them from the memory map. A Profile holds this cache for its lifetime (Kaggle at 5%: about 240 MB).
_CACHE_SAMPLE_BYTES = 256 << 20

# Ids per chunk of the held-out scan (its figures do not depend on the chunking: chunks are whole mini-batches).
_SCAN_LOOKUPS = 1 << 21


@dataclass
class Profiler:
    """Counts embedding-row accesses over a sample of a dataset split; ``profile(dataset)`` is the verb."""

    sample_fraction: float = 0.05
    """Share of the split's samples to profile, drawn uniformly without replacement (FAE uses 5%)."""
    sample_batches: int | None = None
    """If set, profile the first N mini-batches instead (Hotline's learning phase); overrides sample_fraction."""
    mini_batch_size: int = 128
    """Mini-batch size B: for sample_batches, and for the per-mini-batch working-set figures."""
    seed: int = 0
    """Seed of the uniform sample."""
    embedding_dim: int = 16
    """Embedding dimension (DLRM's --arch-sparse-feature-size): a hot row costs embedding_dim * 4 bytes..."""
    optimizer: str = "sgd"
    """...plus its optimizer state: 'sgd' (none), 'rowwise-adagrad' (one float32 per row), 'adagrad' (D) or
    'adam' (2 D + 1)."""
    split: str = "train"
    """Which split of the dataset to profile."""
    chunk_size: int = 65536
    """Samples read from the memory map per kernel call."""
    progress: bool = True
    """Show tqdm progress bars."""
    heldout: str = "sample"
    """Where the held-out figures are measured: 'sample' (a sample of the same split disjoint from the profiled
    one: the same size, drawn uniformly; after a ``sample_batches`` prefix, the batches that follow it),
    'val' (the validation split), or 'none'. With nothing left to hold out (the whole split profiled),
    'sample' falls back to the validation split."""
    heldout_fraction: float | None = None
    """Share of the split held out (default: as many samples as profiled); only for ``heldout='sample'``."""

    def __post_init__(self) -> None:
        if self.sample_batches is None and not (0.0 < float(self.sample_fraction) <= 1.0):
            raise ValueError(f"sample_fraction must be in (0, 1], got {self.sample_fraction}")
        if self.sample_batches is not None and int(self.sample_batches) <= 0:
            raise ValueError(f"sample_batches must be positive, got {self.sample_batches}")
        if int(self.mini_batch_size) <= 0:
            raise ValueError(f"mini_batch_size must be positive, got {self.mini_batch_size}")
        if int(self.chunk_size) <= 0:
            raise ValueError(f"chunk_size must be positive, got {self.chunk_size}")
        if self.heldout not in ("sample", "val", "none"):
            raise ValueError(f"heldout must be 'sample', 'val' or 'none', got {self.heldout!r}")
        if self.heldout_fraction is not None and not (0.0 < float(self.heldout_fraction) <= 1.0):
            raise ValueError(f"heldout_fraction must be in (0, 1], got {self.heldout_fraction}")
        self.bytes_per_row = bytes_per_row_for(int(self.embedding_dim), self.optimizer)

    def sample_indices(self, num_samples: int) -> np.ndarray | None:
        """Sorted sample indices into a split of ``num_samples`` rows, or None for the prefix ``[0, n)``
        (see :meth:`sample_size`). The uniform sample is
        ``np.sort(np.random.default_rng(seed).choice(num_samples, k, replace=False, shuffle=False))``."""
        if self.sample_batches is not None or self.sample_size(num_samples) == num_samples:
            return None
        rng = np.random.default_rng(self.seed)
        k = self.sample_size(num_samples)
        return np.sort(rng.choice(num_samples, size=k, replace=False, shuffle=False)).astype(np.int64)

    def sample_size(self, num_samples: int) -> int:
        """How many samples of a split of ``num_samples`` rows this profiler reads."""
        if self.sample_batches is not None:
            return min(num_samples, int(self.sample_batches) * int(self.mini_batch_size))
        return (
            min(num_samples, max(1, round(float(self.sample_fraction) * num_samples))) if num_samples else 0
        )

    def profile(self, dataset: Dataset | str | os.PathLike) -> Profile:
        """Counts accesses over the sample of ``dataset`` (a Dataset or its directory) and ranks the rows."""
        from tqdm import tqdm

        ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        split = ds.split(self.split)
        n_total = len(split)
        indices = self.sample_indices(n_total)
        n = self.sample_size(n_total)
        if n == 0:
            raise DatasetError(f"dataset {ds.path}: split {self.split!r} has no samples to profile")
        sizes = ds.table_sizes
        total_rows = sum(sizes)
        sample_bytes = n * ds.lookups_per_sample * 4
        layout = {} if ds.uniform else {"bag_sizes": ds.bag_sizes, "padded": ds.padded}
        keep = [] if sample_bytes <= _CACHE_SAMPLE_BYTES else None

        def chunks(desc: str) -> Iterator[np.ndarray]:
            bar = tqdm(
                total=n,
                desc=desc,
                unit="samples",
                unit_scale=True,
                disable=bar_disable(self.progress),
                leave=False,
            )
            try:
                if keep is not None and keep and desc != "counting":
                    for c in keep:
                        yield c
                        bar.update(c.shape[0])
                    return
                for start in range(0, n, self.chunk_size):
                    stop = min(n, start + self.chunk_size)
                    rows = slice(start, stop) if indices is None else indices[start:stop]
                    c = np.ascontiguousarray(split.sparse[rows])
                    if keep is not None and desc == "counting":
                        keep.append(c)
                    yield c
                    bar.update(stop - start)
            finally:
                bar.close()

        def bad_id(e: kernels.BadIdError, chunk_start: int) -> DatasetError:
            return self._bad_id(ds, indices, e, chunk_start)

        t0 = time.perf_counter()
        counts = np.zeros(total_rows, dtype=kernels.count_dtype(n * ds.lookups_per_sample))  # no wider
        done = 0
        for c in chunks("counting"):
            try:
                kernels.count_lookups(c, sizes, counts, **layout)
            except kernels.BadIdError as e:
                raise bad_id(e, done) from e
            done += c.shape[0]
        t1 = time.perf_counter()
        profile = Profile(
            counts=counts,
            table_sizes=sizes,
            num_samples=n,
            pooling_factor=ds.pooling_factor,
            profiler=self,
            dataset=ds,
            sample_indices=indices,
            _chunks=chunks,
            take_counts=True,  # the rank takes the counts' memory: one array a row, not two
        )
        del counts
        hist = np.zeros(profile.num_accessed + 1, dtype=np.int64)
        for c in chunks("ranking"):
            max_rank = kernels.sample_max_rank(c, sizes, profile.rank, **layout)
            kernels.add_histogram(max_rank + 1, hist)
        profile._popular_cum = np.cumsum(hist)
        t2 = time.perf_counter()
        profile.heldout = self.measure_heldout(ds, indices, n, profile.rank, profile.num_accessed)
        profile.timings = {"count_s": t1 - t0, "rank_s": t2 - t1, "heldout_s": time.perf_counter() - t2}
        return profile

    def _bad_id(self, ds: Dataset, indices, e: kernels.BadIdError, chunk_start: int) -> DatasetError:
        """The one-line error of an id outside its table, naming the file, the sample, the table and the id."""
        i = chunk_start + e.sample
        row = i if indices is None else int(indices[i])
        return DatasetError(
            f"{ds.path / f'{self.split}_sparse.npy'}: sample {row}, table {e.table}, lookup {e.lookup}: "
            f"row id {e.row_id} is outside the table (meta.json: 0 <= id < {e.table_size})"
        )

    def count(self, dataset: Dataset | str | os.PathLike) -> np.ndarray:
        """The access counts alone over this profiler's sample (fused ids [total rows], no wider than the
        sample's lookups need: :func:`~hotline.kernels.profile.count_dtype`): the first pass of
        :meth:`profile`, the same numbers, without the ranking, the held-out figures or a cache of the sample
        (what the disk store's file order needs)."""
        ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        split = ds.split(self.split)
        indices = self.sample_indices(len(split))
        n = self.sample_size(len(split))
        if n == 0:
            raise DatasetError(f"dataset {ds.path}: split {self.split!r} has no samples to profile")
        layout = {} if ds.uniform else {"bag_sizes": ds.bag_sizes, "padded": ds.padded}
        counts = np.zeros(sum(ds.table_sizes), dtype=kernels.count_dtype(n * ds.lookups_per_sample))
        for start in range(0, n, self.chunk_size):
            stop = min(n, start + self.chunk_size)
            rows = slice(start, stop) if indices is None else indices[start:stop]
            try:
                kernels.count_lookups(
                    np.ascontiguousarray(split.sparse[rows]), ds.table_sizes, counts, **layout
                )
            except kernels.BadIdError as e:
                raise self._bad_id(ds, indices, e, start) from e
        return counts

    def heldout_indices(self, num_samples: int, indices: np.ndarray | None, n: int) -> np.ndarray | None:
        """Sorted indices of the held-out samples in a split of ``num_samples`` rows of which ``indices`` (or
        the prefix ``[0, n)`` when None) were profiled; an empty array when nothing is left to hold out."""
        size = n if self.heldout_fraction is None else round(float(self.heldout_fraction) * num_samples)
        size = min(max(1, size), num_samples - n)
        if size <= 0:
            return np.zeros(0, dtype=np.int64)
        if indices is None:  # a prefix was profiled (sample_batches): hold out the batches that follow it
            return np.arange(n, n + size, dtype=np.int64)
        rest = np.ones(num_samples, dtype=bool)
        rest[indices] = False
        rest = np.flatnonzero(rest)
        rng = np.random.default_rng(
            [int(self.seed), 1]
        )  # a stream of its own: the profiled sample is unchanged
        return np.sort(rng.choice(rest, size=size, replace=False, shuffle=False)).astype(np.int64)

    def measure_heldout(
        self, ds: Dataset, indices: np.ndarray | None, n: int, rank: np.ndarray, num_ranked: int
    ):
        """The ranking's :class:`~hotline.profiling.heldout.HeldOut` figures (None for ``heldout='none'``)."""
        from tqdm import tqdm

        from hotline.profiling.heldout import HeldOut, scan

        if self.heldout == "none":
            return None
        split_name = self.split
        picked = None
        if self.heldout == "sample":
            picked = self.heldout_indices(len(ds.split(self.split)), indices, n)
            source = f"disjoint {'uniform sample' if indices is not None else 'next batches'} of split {self.split!r}"
        if picked is None or picked.size == 0:
            if self.split == "val" or len(ds.split("val")) == 0:
                if self.heldout == "val":
                    raise ValueError(
                        f"no held-out samples: the validation split of {ds.path} is empty or profiled"
                    )
                return None
            split_name, picked, source = "val", None, "validation split"
        split = ds.split(split_name)
        total = len(split) if picked is None else int(picked.shape[0])
        B = int(self.mini_batch_size)
        # whole mini-batches, and at most _SCAN_LOOKUPS ids: the scan's temporaries are some 30 bytes an id
        step = max(B, (min(int(self.chunk_size), _SCAN_LOOKUPS // max(1, ds.lookups_per_sample)) // B) * B)

        def chunks() -> Iterator[np.ndarray]:
            bar = tqdm(total=total, desc="held-out", unit="samples", unit_scale=True, disable=bar_disable(self.progress),
                       leave=False)  # fmt: skip
            try:
                for start in range(0, total, step):
                    stop = min(total, start + step)
                    rows = slice(start, stop) if picked is None else picked[start:stop]
                    yield np.ascontiguousarray(split.sparse[rows])
                    bar.update(stop - start)
            finally:
                bar.close()

        bags = None if ds.uniform else ds.bags
        hits, popular, cold, batches, lookups, stale = scan(
            chunks(), ds.table_sizes, rank, num_ranked, B, bags
        )
        return HeldOut(
            source=f"{source} ({total:,} samples)",
            split=split_name,
            num_samples=total,
            num_batches=batches,
            batch_size=B,
            total_lookups=lookups,
            hits_cum=hits,
            popular_cum=popular,
            cold_suffix=cold,
            indices=picked,
            _chunks=chunks,
            bags=bags,
            stale_suffix=stale,
        )


def profile(
    dataset: Dataset | str | os.PathLike,
    *,
    sample_fraction: float = 0.05,
    sample_batches: int | None = None,
    mini_batch_size: int = 128,
    seed: int = 0,
    embedding_dim: int = 16,
    optimizer: str = "sgd",
    split: str = "train",
    progress: bool = True,
    heldout: str = "sample",
    heldout_fraction: float | None = None,
) -> Profile:
    """Profiles ``dataset`` (a Dataset or its directory): ``Profiler(...).profile(dataset)``."""
    return Profiler(
        sample_fraction=sample_fraction,
        sample_batches=sample_batches,
        mini_batch_size=mini_batch_size,
        seed=seed,
        embedding_dim=embedding_dim,
        optimizer=optimizer,
        split=split,
        progress=progress,
        heldout=heldout,
        heldout_fraction=heldout_fraction,
    ).profile(dataset)
