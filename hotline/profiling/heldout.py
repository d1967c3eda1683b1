"""Held-out figures: what a ranking gives on samples it did not see (the honest estimate of training).

A profile ranks rows by how often its sample looked them up, so figures measured on that same sample are
optimistic: every row the sample touched once is "hot" once the budget reaches it, though most such rows are
never looked up again. :class:`HeldOut` re-measures the ranking on a second sample, disjoint from the profiled
one (by default a uniform sample of the same split and the same size; or the validation split):

- ``hits_cum[k]``: held-out lookups that hit one of the ``k`` best-ranked rows (access coverage at ``k``);
- ``popular_cum[k]``: held-out samples whose every lookup hits one of them (popular-sample share);
- ``cold_suffix[k]``: unique rows of rank ``>= k`` summed over the held-out mini-batches of ``B`` samples
  (the working set a mini-batch needs; rows the profile never saw are always cold);
- ``stale_suffix[k]``: of those, the rows one of :data:`STALE_WINDOW` other mini-batches also looks up (under
  look-ahead, rows an earlier step may still update when this one is fetched: read again on the main thread
  before the step computes, so the cost model prices them there). The mini-batches are taken as exchangeable:
  from the number of held-out mini-batches each row is in, the expected count over every choice of the others,
  which uses every pair of mini-batches, not only neighbours (the first mini-batches of a short sample have
  fewer before them).

All three come from one scan, for every budget at once, like the in-sample curve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hotline.kernels import profile as kernels
from hotline.table_layout import PAD_ID, BagLayout

if TYPE_CHECKING:
    from hotline.placement import Placement
    from hotline.profiling.profile import Profile

STALE_WINDOW = 3
"""Mini-batches before a step whose rows count as stale for it: the look-ahead of ``hotline train`` (K=2) claims
step j's rows while steps j-2 and j-1 wait in its queue and step j-3 computes or is written back: the rows
the executor flags on bench_pipeline's runs lie between a window of 3 and one of 4."""

_MAX_STALE_BATCHES = 2**16 - 1
"""Held-out mini-batches the stale count reads (the count of mini-batches per row is kept in 16 bits)."""


@dataclass
class HeldOut:
    """Figures of a ranking measured on a sample the ranking did not see, for every budget ``k`` (rows)."""

    source: str
    """What the held-out samples are, in words (e.g. "disjoint uniform sample of split 'train'")."""
    split: str
    """The split they come from."""
    num_samples: int
    """Held-out samples."""
    num_batches: int
    """Mini-batches of ``batch_size`` samples the per-batch figures average over."""
    batch_size: int
    """Mini-batch size B of the per-batch figures."""
    total_lookups: int
    """Lookups of the held-out samples."""
    hits_cum: np.ndarray
    """int64 [A+1]: lookups hitting one of the k best-ranked rows, for k = 0..A (A: rows the profile saw)."""
    popular_cum: np.ndarray
    """int64 [A+1]: samples whose every lookup hits one of the k best-ranked rows."""
    cold_suffix: np.ndarray
    """int64 [A+1]: unique rows of rank >= k (unseen rows included), summed over the mini-batches."""
    indices: np.ndarray | None = None
    """Sorted indices of the held-out samples in ``split`` (None: the whole split)."""
    _chunks: Callable[[], Iterator[np.ndarray]] | None = None
    bags: BagLayout | None = None
    """Bag sizes and padding of the samples' ids (None: uniform [n, T, L] chunks)."""
    stale_suffix: np.ndarray | None = None
    """float64 [A+1]: of ``cold_suffix``'s rows, the expected number one of :data:`STALE_WINDOW` other
    mini-batches also looks up, summed over the mini-batches (None: not measured)."""

    def stale_rows_per_batch(self, k) -> float:
        """Unique cold rows per mini-batch at ``k`` hot rows that one of :data:`STALE_WINDOW` other mini-batches
        also looks up (expected; 0 where not measured)."""
        if self.stale_suffix is None:
            return 0.0
        return float(self.stale_suffix[int(k)] / max(1, self.num_batches))

    def figures(self, k) -> dict:
        """Held-out figures at ``k`` hot rows (an int or an int array): access_coverage, popular_sample_share,
        unique_cold_rows_per_batch."""
        k = np.asarray(k)
        return {
            "access_coverage": self.hits_cum[k] / max(1, self.total_lookups),
            "popular_sample_share": self.popular_cum[k] / max(1, self.num_samples),
            "unique_cold_rows_per_batch": self.cold_suffix[k] / max(1, self.num_batches),
        }

    def summary(self, prof: Profile, budget: int, placement: Placement | None, inside: dict | None) -> dict:
        """:meth:`Profile.heldout_figures <hotline.profiling.profile.Profile.heldout_figures>` of ``prof`` (the
        ranking measured here) at ``budget``: of ``placement`` (its in-sample figures ``inside``, when made
        already), or of the best ranked rows under ``budget`` (None)."""
        if placement is not None:  # the hot set as a bitmap: 1 bit a row, not a remap
            figures = self.evaluate(
                kernels.hot_bitmap(placement.table_sizes, placement.hot_ids), prof.table_sizes
            )
        else:
            figures = {k: float(v) for k, v in self.figures(prof.hot_rows_for(budget)).items()}
        out = {
            "source": self.source,
            "split": self.split,
            "samples": self.num_samples,
            "mini_batches": self.num_batches,
            **figures,
            "bytes_per_batch": figures["unique_cold_rows_per_batch"] * prof.bytes_per_row,
            "popular_samples_per_batch": figures["popular_sample_share"] * self.batch_size,
        }
        if prof.dataset is not None and self.split == prof.profiler.split:
            # An epoch over the profiled split also trains the profiled samples, on which the in-sample figures
            # hold: what it will count is the mix, weighted by the share of the split that was profiled.
            share = prof.num_samples / max(1, len(prof.dataset.split(self.split)))
            if placement is not None and inside is None:
                inside = prof.evaluate(placement)
            k = prof.hot_rows_for(budget)
            cov_in = inside["access_coverage"] if inside else prof._cum_counts[k] / max(1, prof.total_lookups)
            pop_in = inside["popular_sample_share"] if inside else prof._popular_cum[k] / prof.num_samples
            out["epoch_estimate"] = {
                "profiled_share_of_split": share,
                "access_coverage": float(share * cov_in + (1 - share) * figures["access_coverage"]),
                "popular_sample_share": float(share * pop_in + (1 - share) * figures["popular_sample_share"]),
            }
        return out

    def evaluate(self, hot_bits: np.ndarray, table_sizes) -> dict:
        """The same figures for any hot set (a bitmap of the hot fused rows,
        :func:`~hotline.kernels.profile.hot_bitmap`), by scanning the held-out samples again."""
        hits, popular, cold, _, _, _ = scan(
            self._chunks(), table_sizes, hot_bits, 1, self.batch_size, self.bags, window=0, bitmap=True
        )
        return {
            "access_coverage": hits[1] / max(1, self.total_lookups),
            "popular_sample_share": popular[1] / max(1, self.num_samples),
            "unique_cold_rows_per_batch": cold[1] / max(1, self.num_batches),
        }


def scan(
    chunks: Iterator[np.ndarray], table_sizes, rank: np.ndarray, num_ranked: int, batch_size: int,
    bags: BagLayout | None = None, window: int = STALE_WINDOW, bitmap: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, np.ndarray]:  # fmt: skip
    """One pass over sample chunks (each a whole number of mini-batches, except the last) under ``rank``
    (int32 [total rows], ranks ``0..num_ranked``, ``num_ranked`` meaning never hot).

    Returns ``(hits_cum, popular_cum, cold_suffix, num_batches, lookups, stale_suffix)``, each array of length
    ``num_ranked + 1`` indexed by the number of hot rows ``k`` (``stale_suffix``: of ``cold_suffix``'s rows,
    those one of ``window`` other mini-batches also looks up, see :func:`stale_rows`; ``window`` 0: not counted,
    zeros). Per-batch figures count
    full mini-batches only (the last, partial one too when there is no full one, with no stale rows).
    ``bags``: the chunks are [n, C] bags of these sizes (padding skipped); None: [n, T, L]. With ``bitmap``,
    ``rank`` is a bitmap of hot rows (:func:`~hotline.kernels.profile.hot_bitmap`: 1 bit a row) ranking them 0
    and every other row 1 (``num_ranked`` 1)."""
    A = int(num_ranked)
    offsets = kernels.table_offsets(table_sizes)
    total = int(offsets[-1])
    if bitmap:
        rank_of = lambda f: (~kernels.in_bitmap(rank, f)).view(np.int8)  # noqa: E731 (1 cold, 0 hot)
        max_of = lambda c, **layout: kernels.sample_max_cold(c, table_sizes, rank, **layout)  # noqa: E731
    else:
        rank_of = rank.__getitem__
        max_of = lambda c, **layout: kernels.sample_max_rank(c, table_sizes, rank, **layout)  # noqa: E731
    lookup_hist = np.zeros(A + 1, dtype=np.int64)
    max_hist = np.zeros(A + 2, dtype=np.int64)
    unique_hist = np.zeros(A + 1, dtype=np.int64)
    # Held-out mini-batches that look each row up: a ranked row's by its rank, and the rows the ranking never saw
    # (rank A) by id, as the (mini-batch, row) pairs met, merged as they grow: sized by what the held-out
    # samples touch, never by the row count.
    in_batches = np.zeros(A, dtype=np.uint16)
    unseen = _UnseenRows()
    B = int(batch_size)
    batches = lookups = 0
    partial_hist, partial_batches = None, 0
    for c in chunks:
        n = c.shape[0]
        ids = c.reshape(n, int(np.prod(c.shape[1:])))
        cols = np.repeat(offsets[:-1], c.shape[2]) if bags is None else bags.col_offset
        fused = ids.astype(np.int64) + cols[None, :]
        real = ids != PAD_ID if bags is not None and bags.padded else None
        ranks = rank_of(fused if real is None else fused[real])
        lookup_hist += np.bincount(ranks.ravel(), minlength=A + 1)
        lookups += ranks.size
        layout = {} if bags is None else {"bag_sizes": bags.bag_sizes, "padded": bags.padded}
        kernels.add_histogram(max_of(c, **layout) + 1, max_hist)
        full = (n // B) * B
        if full:
            b, r = _batch_rows(fused[:full], total, B, None if real is None else real[:full])
            ranks = rank_of(r)
            unique_hist += np.bincount(ranks, minlength=A + 1)
            counted = b < _MAX_STALE_BATCHES - batches
            ranks, r = ranks[counted], r[counted]
            if window:
                kernels.add_histogram(ranks[ranks < A], in_batches)
                unseen.add(r[ranks >= A])
            batches += full // B
        if full < n:
            partial_hist = _unique_rank_hist(
                fused[full:], rank_of, total, n - full, A, None if real is None else real[full:]
            )
            partial_batches = 1
    if batches == 0 and partial_hist is not None:
        unique_hist, batches = partial_hist, partial_batches
    hits_cum = np.concatenate([[0], np.cumsum(lookup_hist[:A])])
    popular_cum = np.cumsum(max_hist)[: A + 1]
    cold_suffix = np.cumsum(unique_hist[::-1])[::-1]
    stale_suffix = np.zeros(A + 1)
    if window:
        stale_suffix = stale_rows(
            in_batches, unseen.counts(), A, min(batches, _MAX_STALE_BATCHES), window
        ) * (batches / max(1, min(batches, _MAX_STALE_BATCHES)))
    return hits_cum, popular_cum, cold_suffix, batches, lookups, stale_suffix


def stale_rows(
    in_batches: np.ndarray, unseen_batches: np.ndarray, num_ranked: int, n: int, window: int
) -> np.ndarray:
    """float64 [A+1]: for each k, the expected number of rows of rank >= k that one mini-batch of ``n`` shares
    with ``window`` others drawn from the rest, summed over the ``n`` (``in_batches`` [A]: of how many of the
    ``n`` mini-batches each ranked row is in, by rank; ``unseen_batches``: the same for each row the ranking
    never saw, by ascending row id). A row in ``c`` of them is in the chosen one with chance ``c / n`` and
    then in none of the others with chance ``C(n - c, w) / C(n - 1, w)``; ``w`` is ``window``, or ``n - 1``
    where fewer mini-batches were held out (fewer others to share rows with: an undercount)."""
    A = int(num_ranked)
    w = min(int(window), n - 1)
    ranked = np.flatnonzero(in_batches)
    if w < 1 or not (ranked.size or unseen_batches.size):
        return np.zeros(A + 1)
    c = np.concatenate([in_batches[ranked], unseen_batches]).astype(np.float64)
    bins = np.concatenate([ranked, np.full(unseen_batches.shape[0], A, np.int64)])
    none_of_them = np.ones_like(c)
    for i in range(w):
        none_of_them *= np.clip(n - c - i, 0, None) / (n - 1 - i)
    hist = np.bincount(bins, weights=c * (1.0 - none_of_them), minlength=A + 1)
    return np.cumsum(hist[::-1])[::-1]


_MERGE_AT = 1 << 20
"""(mini-batch, row) pairs of unseen rows kept unmerged, at least."""


class _UnseenRows:
    """Of how many mini-batches each row is in, for rows met one (mini-batch, row) pair at a time: the pairs are
    kept as ids and merged into (row, count) once they outnumber the rows merged so far."""

    def __init__(self):
        self._rows = np.zeros(0, np.int64)
        self._counts = np.zeros(0, np.int64)
        self._pending: list[np.ndarray] = []
        self._pending_size = 0

    def add(self, rows: np.ndarray) -> None:
        """One entry per (mini-batch, row) pair."""
        self._pending.append(rows.astype(np.int64, copy=False))
        self._pending_size += rows.shape[0]
        if self._pending_size > max(_MERGE_AT, self._rows.shape[0]):
            self._merge()

    def _merge(self) -> None:
        rows, inverse = np.unique(np.concatenate([self._rows, *self._pending]), return_inverse=True)
        weights = np.concatenate([self._counts, np.ones(self._pending_size, np.int64)])
        self._counts = np.bincount(inverse, weights=weights, minlength=rows.shape[0]).astype(np.int64)
        self._rows, self._pending, self._pending_size = rows, [], 0

    def counts(self) -> np.ndarray:
        """int64: of how many mini-batches each row met is in, by ascending row id."""
        self._merge()
        return self._counts


def _batch_rows(
    fused: np.ndarray, total: int, batch_size: int, real: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (mini-batch, row) pairs of ``fused`` [n, C] (n a multiple of B), as (batch, row) arrays
    sorted by batch, then row; ``real`` [n, C]: which entries are lookups (not padding)."""
    n = fused.shape[0]
    batch = np.repeat(np.arange(n // batch_size, dtype=np.int64), batch_size * fused.shape[1])
    keys = batch * total + fused.ravel()
    keys = np.unique(keys if real is None else keys[real.ravel()])
    return keys // total, keys % total


def _unique_rank_hist(
    fused: np.ndarray, rank_of, total: int, batch_size: int, num_ranked: int, real: np.ndarray | None = None
) -> np.ndarray:
    """Histogram over ranks (``rank_of(rows)``) of the distinct (mini-batch, row) pairs of ``fused`` [n, C] (n a
    multiple of B, ``total`` rows in all); ``real`` [n, C]: which entries are lookups (not padding)."""
    _, rows = _batch_rows(fused, total, batch_size, real)
    return np.bincount(rank_of(rows), minlength=num_ranked + 1)
