"""A profile: access counts of one sampled split and the global popularity ranking of rows derived from them.

For any HBM budget a :class:`Profile` answers which rows are hot (:meth:`Profile.placement`), which share of
lookups they serve, which share of samples are *popular* (every lookup hot), and how many cold rows a
mini-batch needs; :meth:`Profile.curve` and :meth:`Profile.plot` give the same for a range of budgets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hotline.datasets.format import Dataset
from hotline.datasets.zipf import fit_zipf_exponent
from hotline.kernels import profile as kernels
from hotline.placement import Placement, PlacementError
from hotline.units import format_size, parse_size

if TYPE_CHECKING:
    from hotline.profiling.heldout import HeldOut
    from hotline.profiling.profiler import Profiler


_BLOCK_ROWS = 1 << 22
"""Ranked rows per block of :meth:`Profile.evaluate`'s pass (its float64 temporaries stay a few tens of MiB)."""


@dataclass
class Profile:
    """Access counts of one profiled sample and the global popularity ranking of rows derived from them."""

    counts: InitVar[np.ndarray]
    """int64, or uint32 where the sample's lookups stay below 2**32, [total rows]: accesses per fused row (table
    offset + row id) in the sample. Not kept: the Profile keeps the ranking and each ranked row's count, and
    :attr:`counts` makes the array again when asked for (4 or 8 bytes a row for as long as the caller holds it)."""
    table_sizes: list[int]
    """Rows per table."""
    num_samples: int
    """Samples profiled."""
    pooling_factor: int
    """Lookups per table per sample (L)."""
    profiler: Profiler
    """The settings it was made with (mini-batch size, bytes per row, sampling)."""
    dataset: Dataset | None = None
    """The dataset profiled (for its fingerprint, and to re-scan the sample for always-hot placements)."""
    sample_indices: np.ndarray | None = None
    """Sorted indices of the sampled samples in the split, or None for the first ``num_samples``."""
    timings: dict = field(default_factory=dict)
    """Seconds spent counting, ranking and measuring the held-out figures."""
    heldout: HeldOut | None = None
    """The ranking measured on samples it did not see (None: not measured); see :mod:`~hotline.profiling.heldout`."""
    _chunks: object = None
    _popular_cum: np.ndarray | None = None
    take_counts: InitVar[bool] = False
    """Let the Profile reuse the ``counts`` array's memory for :attr:`rank` (the caller's array is then
    overwritten): one array a row instead of two (what :class:`Profiler` does)."""

    def __post_init__(self, counts: np.ndarray, take_counts: bool) -> None:
        self.offsets = kernels.table_offsets(self.table_sizes)
        counts = np.asarray(counts)
        if counts.shape != (int(self.offsets[-1]),):
            raise ValueError(
                f"counts must have shape [{int(self.offsets[-1])}] (one per fused row), got {counts.shape}"
            )
        # Most accessed first, ascending fused ids (= table, then row) among ties; a counting sort, no row sort
        self.order: np.ndarray = kernels.order_by_count(counts)
        """Fused ids of the accessed rows, best rank first (int32 below 2**31 rows)."""
        A = self.order.shape[0]
        self._ranked_counts = np.zeros(
            A + 1, counts.dtype
        )  # the count of rank r; the last: an unaccessed row's 0
        self._ranked_counts[:A] = counts[self.order]
        self._table_lookups = np.array(
            [counts[lo:hi].sum(dtype=np.int64) for lo, hi in zip(self.offsets[:-1], self.offsets[1:])],
            np.int64,
        )
        # int32 when it fits: the max-rank pass reads it at random, and half the bytes is half the cache misses.
        rank_dtype = np.dtype(np.int32 if A < 2**31 - 1 else np.int64)
        if take_counts and counts.dtype.itemsize == rank_dtype.itemsize and counts.flags.writeable:
            self.rank = counts.view(rank_dtype)  # the counts are in _ranked_counts now: their memory is free
            self.rank.fill(A)
        else:
            self.rank = np.full(counts.shape[0], A, dtype=rank_dtype)
        """[total rows]: global rank of each fused row (0 = most accessed); unaccessed rows get num_accessed."""
        self.rank[self.order] = np.arange(A, dtype=rank_dtype)
        table_dtype = np.int16 if len(self.table_sizes) < 2**15 else np.int64
        self.table_of_order = np.empty(self.order.shape[0], table_dtype)  # the table of each, chunk by chunk
        for lo in range(0, self.order.shape[0], 1 << 22):
            chunk = self.order[lo : lo + (1 << 22)]
            self.table_of_order[lo : lo + chunk.shape[0]] = np.searchsorted(self.offsets, chunk, "right") - 1
        self._cum_counts = np.zeros(A + 1, np.int64)
        np.cumsum(self._ranked_counts[:A], dtype=np.int64, out=self._cum_counts[1:])

    def _counts(self) -> np.ndarray:
        """[total rows]: accesses per fused row (table offset + row id) in the sample, of the dtype counted in;
        made from the ranking on each call (a new array of a row's width: read once, keep the result)."""
        return self._ranked_counts[self.rank]

    def __repr__(self) -> str:
        where = (
            f"{str(self.dataset.path)!r}, split={self.profiler.split!r}, " if self.dataset is not None else ""
        )
        return (
            f"Profile({where}samples={self.num_samples}, lookups={self.total_lookups}, "
            f"accessed_rows={self.num_accessed}/{sum(self.table_sizes)}, bytes_per_row={self.bytes_per_row})"
        )

    # ------------------------------------------------------------------ basic figures
    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def num_accessed(self) -> int:
        """Rows (over all tables) accessed at least once in the sample: the most that can ever be hot."""
        return int(self.order.shape[0])

    @property
    def lookups_per_table(self) -> float:
        """Lookups of one table in the sample, averaged over the tables (n * L for a pooling factor L)."""
        return self.total_lookups / max(1, self.num_tables)

    @property
    def table_lookups(self) -> np.ndarray:
        """int64 [T]: lookups of each table in the sample (n * L_t; fewer with padded bags)."""
        return self._table_lookups

    @property
    def total_lookups(self) -> int:
        """Lookups counted in the sample (padding of variable bags not counted)."""
        return int(self._cum_counts[-1])

    @property
    def bytes_per_row(self) -> int:
        return self.profiler.bytes_per_row

    @property
    def mini_batch_size(self) -> int:
        return int(self.profiler.mini_batch_size)

    def _counts_of(self, table: int, ids: np.ndarray) -> np.ndarray:
        """The counts of rows ``ids`` of ``table`` (an array of their size, none of the table's)."""
        return self._ranked_counts[self.rank[self.offsets[table] + ids]]

    def table_counts(self, table: int) -> np.ndarray:
        """[rows of table]: accesses per row of one table (a new array, of the dtype counted in)."""
        return self._ranked_counts[self.rank[self.offsets[table] : self.offsets[table + 1]]]

    def hot_rows_for(self, budget: int | str) -> int:
        """Rows a budget (bytes, or a size like "256MiB") makes hot: budget // bytes_per_row, at most the
        accessed rows."""
        return min(parse_size(budget) // self.bytes_per_row, self.num_accessed)

    # ------------------------------------------------------------------ curves
    def _row_probabilities(self) -> np.ndarray:
        """Per ranked row, the chance that one lookup of its table hits it (count / lookups of the table)."""
        return self._ranked_counts[:-1] / self.table_lookups[self.table_of_order].astype(np.float64)

    def _expected_unique_suffix(self, batch_size: int) -> np.ndarray:
        """float64 [A+1]: expected unique rows of rank >= k among the lookups of one mini-batch, for each k."""
        p = self._row_probabilities()
        # lookups of the row's table in one batch (B * L_t): the draws its rows compete in
        draws = batch_size * (self.table_lookups[self.table_of_order] / float(max(1, self.num_samples)))
        # 1 - (1 - p)^draws, computed without cancellation for tiny p.
        present = -np.expm1(draws * np.log1p(-np.minimum(p, 1.0)))
        suffix = np.zeros(present.shape[0] + 1)
        suffix[:-1] = np.cumsum(present[::-1])[::-1]
        return suffix

    def curve(self, budgets: Sequence[int | str] | None = None, batch_size: int | None = None):
        """A pandas DataFrame of what each HBM budget gives (one row per budget).

        Columns: budget_bytes, hot_rows, hot_bytes; measured on held-out samples (when the profile has them:
        see :attr:`heldout`; per-batch figures at its mini-batch size): heldout_access_coverage,
        heldout_popular_sample_share, heldout_unique_cold_rows_per_batch, heldout_bytes_per_batch; measured on
        the profiled sample itself (optimistic: the ranking was made from it): access_coverage,
        popular_sample_share, expected_cold_rows_per_batch, expected_unique_rows_per_batch,
        hybrid_bytes_per_batch (every B*T*L looked-up row gathered), hybrid_unique_bytes_per_batch (each unique
        row once), hotline_bytes_per_batch (the unique cold rows of the non-popular micro-batch). Bytes moved
        are host-to-device, bytes_per_row per row. Default budgets: 0, then log-spaced up to all accessed rows.
        """
        import pandas as pd

        if self._popular_cum is None:
            raise ValueError(
                "this Profile has no per-sample ranks (it was built from counts alone): use Profiler"
            )
        B = int(batch_size or self.mini_batch_size)
        if budgets is None:
            top = max(1, self.num_accessed)
            rows = np.unique(np.concatenate([[0], np.geomspace(1, top, 40).round().astype(np.int64)]))
            budgets_b = rows * self.bytes_per_row
        else:
            budgets_b = np.array([parse_size(b) for b in budgets], dtype=np.int64)
        k = np.minimum(budgets_b // self.bytes_per_row, self.num_accessed)
        suffix = self._expected_unique_suffix(B)
        row_bytes = self.bytes_per_row
        heldout = {}
        if self.heldout is not None:
            h = self.heldout.figures(k)
            heldout = {f"heldout_{name}": v for name, v in h.items()}
            heldout["heldout_bytes_per_batch"] = h["unique_cold_rows_per_batch"] * row_bytes
        return pd.DataFrame(
            {
                "budget_bytes": budgets_b,
                "hot_rows": k,
                "hot_bytes": k * row_bytes,
                **heldout,
                "access_coverage": self._cum_counts[k] / max(1, self.total_lookups),
                "popular_sample_share": self._popular_cum[k] / self.num_samples,
                "expected_cold_rows_per_batch": suffix[k],
                "expected_unique_rows_per_batch": np.full(k.shape, suffix[0]),
                "hybrid_bytes_per_batch": np.full(
                    k.shape, B * self.num_tables * self.pooling_factor * row_bytes
                ),
                "hybrid_unique_bytes_per_batch": np.full(k.shape, suffix[0] * row_bytes),
                "hotline_bytes_per_batch": suffix[k] * row_bytes,
            }
        )

    def working_set(self, budget: int | str, batch_sizes: Sequence[int]):
        """A DataFrame: for each mini-batch size, the expected unique cold rows (Hotline's working set), the
        expected unique rows, and the looked-up rows B*T*L, under ``budget``."""
        import pandas as pd

        k = self.hot_rows_for(budget)
        rows = []
        for B in batch_sizes:
            suffix = self._expected_unique_suffix(int(B))
            rows.append(
                {
                    "batch_size": int(B),
                    "looked_up_rows": int(B) * self.num_tables * self.pooling_factor,
                    "expected_unique_rows": suffix[0],
                    "expected_cold_rows": suffix[k],
                }
            )
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ per table
    def _ranked_by_table(self, fused: np.ndarray) -> list[np.ndarray]:
        """Splits fused ids (in rank order) into per-table row ids, keeping rank order within each table."""
        tables = np.searchsorted(self.offsets, fused, side="right") - 1
        by_table = np.argsort(tables, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(tables, minlength=self.num_tables))])
        grouped = fused[by_table]
        return [grouped[bounds[t] : bounds[t + 1]] - self.offsets[t] for t in range(self.num_tables)]

    def table_stats(
        self,
        budget: int | str | None = None,
        always_hot: Sequence[int] = (),
        placement: Placement | None = None,
    ):
        """A pandas DataFrame with one row per table: rows, accessed_rows, lookups, top1pct_share (share of
        the table's lookups that its most accessed 1% of rows serve), zipf_exponent (least-squares slope of
        log count against log rank over the rows accessed at least twice); with ``budget`` also hot_rows,
        hot_pct and coverage (share of the table's lookups served by its hot rows), of ``placement`` when given
        (``placement(budget, always_hot)`` made already), else of ``placement(budget, always_hot)``."""
        import pandas as pd

        ranked = self._ranked_by_table(self.order)
        rows = []
        for t, ids in enumerate(ranked):
            lookups = int(self.table_lookups[t])
            c = self._counts_of(t, ids)
            top = math.ceil(0.01 * self.table_sizes[t])
            rows.append(
                {
                    "table": t,
                    "rows": self.table_sizes[t],
                    "accessed_rows": int(ids.size),
                    "lookups": lookups,
                    "top1pct_share": float(c[:top].sum()) / lookups if lookups else 0.0,
                    "zipf_exponent": fit_zipf_exponent(c),
                }
            )
        df = pd.DataFrame(rows)
        if budget is not None and always_hot:
            placement = placement if placement is not None else self.placement(budget, always_hot)
            pinned = {int(t) for t in always_hot}
            hot_per_table = np.array([ids.size for ids in placement.hot_ids])
            hot_lookups = np.array(  # a pinned table's are all its lookups: no array of its rows
                [self.table_lookups[t] if t in pinned else self._counts_of(t, ids).sum(dtype=np.int64)
                 for t, ids in enumerate(placement.hot_ids)]
            )  # fmt: skip
        elif budget is not None:
            k = self.hot_rows_for(budget)
            hot_per_table = np.bincount(self.table_of_order[:k], minlength=self.num_tables)
            hot_lookups = np.bincount(
                self.table_of_order[:k], weights=self._ranked_counts[:k], minlength=self.num_tables
            )
        if budget is not None:
            df.insert(3, "hot_rows", hot_per_table)
            df.insert(4, "hot_pct", 100.0 * hot_per_table / np.maximum(1, df["rows"].to_numpy()))
            # each table's hot lookups over its own lookups (bag sizes differ by table)
            df.insert(5, "coverage", hot_lookups / np.maximum(1, df["lookups"].to_numpy()))
        return df

    # ------------------------------------------------------------------ placement
    def placement(self, budget: int | str, always_hot: Sequence[int] = ()) -> Placement:
        """The hot rows under ``budget`` bytes: the best ranked rows of all tables, tables in ``always_hot``
        first (whole). Rows never accessed in the sample are never hot (except in always-hot tables)."""
        budget_b = parse_size(budget)
        k = budget_b // self.bytes_per_row
        pinned = sorted({int(t) for t in always_hot})
        for t in pinned:
            if not 0 <= t < self.num_tables:
                raise PlacementError(
                    f"always-hot table {t} does not exist (tables are 0..{self.num_tables - 1})"
                )
        pinned_rows = sum(self.table_sizes[t] for t in pinned)
        if pinned_rows > k:
            raise PlacementError(
                f"always-hot tables {pinned} have {pinned_rows} rows ({format_size(pinned_rows * self.bytes_per_row)}"
                f" at {self.bytes_per_row} B/row), more than the budget {format_size(budget_b)} holds ({k} rows)"
            )
        rest = self.order[~np.isin(self.table_of_order, pinned)][: k - pinned_rows]
        ranked = self._ranked_by_table(rest)
        ranked_all = self._ranked_by_table(self.order) if pinned else None
        hot_ids = []
        for t in range(self.num_tables):
            if t in pinned:
                accessed = ranked_all[t]
                never = np.flatnonzero(self.rank[self.offsets[t] : self.offsets[t + 1]] == self.num_accessed)
                hot_ids.append(np.concatenate([accessed, never]).astype(np.int64))
            else:
                hot_ids.append(ranked[t].astype(np.int64))
        return Placement.from_hot_ids(
            self.table_sizes,
            hot_ids,
            dataset_fingerprint=self.dataset.fingerprint if self.dataset is not None else "",
            embedding_dim=int(self.profiler.embedding_dim),
            bytes_per_row=self.bytes_per_row,
            hbm_budget_bytes=budget_b,
        )

    def evaluate(self, placement: Placement, batch_size: int | None = None) -> dict:
        """Figures of any placement over this sample: access_coverage, popular_sample_share (by re-scanning
        the sample), expected_cold_rows_per_batch. Slower than :meth:`curve`; works for any hot set."""
        if placement.table_sizes != list(self.table_sizes):
            raise PlacementError(
                f"placement table sizes {placement.table_sizes} differ from {self.table_sizes}"
            )
        if self._chunks is None:
            raise ValueError("evaluate needs the profiled sample: this Profile was built from counts alone")
        # the hot set in 1 bit a row: a sample is popular iff none of its lookups is outside it
        bits = kernels.hot_bitmap(placement.table_sizes, placement.hot_ids)
        layout = (
            {}
            if self.dataset is None or self.dataset.uniform
            else {"bag_sizes": self.dataset.bag_sizes, "padded": self.dataset.padded}
        )
        popular = 0
        for c in self._chunks("evaluating"):
            popular += int(np.count_nonzero(kernels.sample_max_cold(c, self.table_sizes, bits, **layout) < 1))
        B = int(batch_size or self.mini_batch_size)
        # Rows the sample never looked up add nothing to either sum (count 0: p = 0): the accessed rows, in
        # blocks of the ranking, are every term.
        covered, expected = 0, 0.0
        for lo in range(0, self.num_accessed, _BLOCK_ROWS):
            hi = min(lo + _BLOCK_ROWS, self.num_accessed)
            c = self._ranked_counts[lo:hi]
            hot = kernels.in_bitmap(bits, self.order[lo:hi])
            per_row = self.table_lookups[self.table_of_order[lo:hi]].astype(np.float64)
            covered += int(c[hot].sum(dtype=np.int64))
            cold = ~hot
            p, draws = c[cold] / per_row[cold], B * (per_row[cold] / max(1, self.num_samples))
            expected += float(-np.expm1(draws * np.log1p(-p)).sum())
        return {
            "hot_rows": placement.num_hot,
            "access_coverage": covered / max(1, self.total_lookups),
            "popular_sample_share": popular / self.num_samples,
            "expected_cold_rows_per_batch": expected,
        }

    def heldout_figures(
        self, budget: int | str, always_hot: Sequence[int] = (), placement: Placement | None = None,
        inside: dict | None = None,
    ) -> dict | None:  # fmt: skip
        """The held-out figures at ``budget`` (of ``placement(budget, always_hot)``, or of ``placement`` made
        already, ``inside`` its :meth:`evaluate`): source, samples, access_coverage, popular_sample_share,
        unique_cold_rows_per_batch, bytes_per_batch, popular_samples_per_batch; None when the profile has no
        held-out samples. When they come from the profiled split, ``epoch_estimate`` is what an epoch over that
        split will count: the profiled samples (a share ``profiled_share_of_split`` of it, at their in-sample
        figures) mixed with the rest (at the held-out ones)."""
        if self.heldout is None:
            return None
        if always_hot and placement is None:
            placement = self.placement(budget, always_hot)
        return self.heldout.summary(self, parse_size(budget), placement if always_hot else None, inside)

    def summary(
        self, budget: int | str, always_hot: Sequence[int] = (), placement: Placement | None = None
    ) -> dict:
        """What ``hotline profile --json`` writes: settings, the held-out figures at ``budget`` (``heldout``),
        the same measured on the profiled sample (top level: optimistic), and per-table stats; ``placement``:
        ``placement(budget, always_hot)`` when made already (with ``always_hot``, each is made once)."""
        budget_b = parse_size(budget)
        figures = self.curve([budget_b]).to_dict(orient="records")[0]
        figures = {k: v for k, v in figures.items() if not k.startswith("heldout_")}
        inside = None
        if not always_hot:
            placement = None
        else:
            placement = placement if placement is not None else self.placement(budget_b, always_hot)
            inside = self.evaluate(placement)
            figures.update(inside)
            figures["hot_bytes"] = placement.hot_bytes
            figures["hotline_bytes_per_batch"] = figures["expected_cold_rows_per_batch"] * self.bytes_per_row
        B = self.mini_batch_size
        p = self.profiler
        out = {
            "dataset": str(self.dataset.path) if self.dataset is not None else None,
            "dataset_fingerprint": self.dataset.fingerprint if self.dataset is not None else "",
            "split": p.split,
            "sample": {
                "mode": "batches" if p.sample_batches is not None else "fraction",
                "sample_fraction": None if p.sample_batches is not None else float(p.sample_fraction),
                "sample_batches": p.sample_batches,
                "seed": p.seed,
                "samples": self.num_samples,
                "lookups": self.total_lookups,
                "accessed_rows": self.num_accessed,
            },
            "mini_batch_size": B,
            "embedding_dim": int(p.embedding_dim),
            "optimizer": p.optimizer,
            "always_hot": sorted({int(t) for t in always_hot}),
            "heldout": self.heldout_figures(budget_b, always_hot, placement, inside),
            "in_sample_note": "the top-level coverage and popular-sample figures are measured on the profiled "
            "sample, which the ranking was made from: optimistic; `heldout` holds them measured on unseen samples",
            **figures,
            "bytes_per_row": self.bytes_per_row,
            "hbm_budget_bytes": budget_b,
            "expected_popular_samples_per_batch": figures["popular_sample_share"] * B,
            "tables": self.table_stats(budget_b, always_hot, placement).to_dict(orient="records"),
        }
        return _jsonable(out)

    # ------------------------------------------------------------------ plots
    def plot(
        self,
        budget: int | str | None = None,
        batch_sizes: Sequence[int] | None = None,
        hardware: dict | str | None = None,
        label_tables: int = 5,
        workload=None,
    ) -> dict:
        """Matplotlib figures: ``rank_frequency`` (per table, log-log: the ``label_tables`` largest tables
        labelled, the rest grouped), ``budget`` (coverage and popular-sample share against the HBM budget,
        held-out solid and in-sample dashed, ``budget`` marked; with ``hardware`` a second panel: the cost
        model's predicted speed-up of hotline over hybrid for ``workload``, a
        :class:`hotline.costmodel.Workload`, default the Kaggle DLRM: ``costmodel.workload_for(prof,
        **costmodel.arch_of(config))`` prices a run's own model) and ``working_set`` (unique rows per mini-batch
        against its size, at ``budget``, default: no hot rows)."""
        # climbs a layer: the figures price the budgets with the cost model (docs/architecture.md, Layers)
        from hotline.profiling.plots import profile_figures

        return profile_figures(self, budget, batch_sizes, hardware, label_tables, workload)


# After the class body: the dataclass takes ``counts`` as a constructor argument (an InitVar), and a property in the
# body would be read as that argument's default.
Profile.counts = property(Profile._counts, doc=Profile._counts.__doc__)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        v = float(x)
        return None if math.isnan(v) else v
    if isinstance(x, float) and math.isnan(x):
        return None
    return x
