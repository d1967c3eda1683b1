"""torchrec CacheStatistics filled from a Hotline profile: LFU from the coverage curve, LRU from stack distances."""

from __future__ import annotations

import math

import numpy as np
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec.distributed.types import (
    CacheStatistics,
)

from hotline.kernels.reuse import lru_hit_counts, stack_distances
from hotline.table_layout import PAD_ID

ALGORITHMS = {"lru": CacheAlgorithm.LRU, "lfu": CacheAlgorithm.LFU}


class PlanError(ValueError):
    """torchrec found no plan for the tables, or a plan / hot-rows file is missing, corrupt or mismatched."""


class HotlineCacheStats(CacheStatistics):
    """torchrec ``CacheStatistics`` of one table, measured by a Hotline profile.

    The miss rate for a cache of ``C = floor(load_factor * rows)`` rows is ``1 - hits[min(C, len - 1)] /
    accesses``, where ``hits`` [K] is the cumulative hit count by cache size: the coverage of the C most
    popular rows (LFU) or the accesses with an LRU stack distance below C (LRU).
    """

    def __init__(
        self, rows: int, hits: np.ndarray, accesses: int, expected_lookups: float, algorithm: str = "lru"
    ):
        self.rows = int(rows)
        """Rows of the table."""
        self.hits = np.asarray(hits, dtype=np.int64)
        """Cumulative accesses served by a cache of 0, 1, 2, ... rows (hits[0] = 0, non-decreasing)."""
        self.accesses = int(accesses)
        """Accesses of the table in the profiled sample."""
        self.algorithm = algorithm
        """``lru`` or ``lfu``: which cache the curve models."""
        self._expected_lookups = float(expected_lookups)
        if self.hits.ndim != 1 or self.hits.size == 0 or self.hits[0] != 0 or (np.diff(self.hits) < 0).any():
            raise ValueError("hits must be a non-empty, non-decreasing 1-D count array starting at 0")
        if self.hits[-1] > self.accesses:
            raise ValueError(f"hits end at {self.hits[-1]}, more than the {self.accesses} accesses")
        miss = np.array([self.expected_miss_rate(x) for x in np.linspace(0.0, 1.0, 101)])
        self._cacheability = float((miss.sum() - 0.5 * (miss[0] + miss[-1])) / 100)  # trapezoid rule

    def __deepcopy__(self, memo) -> HotlineCacheStats:
        # Immutable, and the planner deep-copies every sharding option many times: share the arrays.
        return self

    @property
    def expected_lookups(self) -> float:
        """Expected distinct rows of this table in one global training batch."""
        return self._expected_lookups

    def expected_miss_rate(self, clf: float) -> float:
        """Expected share of lookups that miss a cache of ``clf * rows`` rows (1 at 0, 0 at 1)."""
        clf = min(max(float(clf), 0.0), 1.0)
        if self.accesses == 0 or clf >= 1.0:
            return 0.0
        c = min(int(math.floor(clf * self.rows)), self.hits.size - 1)
        return 1.0 - float(self.hits[c]) / self.accesses

    @property
    def cacheability(self) -> float:
        """Area under the miss-rate curve over load factors 0..1: 0 caches perfectly, 1 not at all."""
        return self._cacheability

    def __repr__(self) -> str:
        return (
            f"HotlineCacheStats({self.algorithm}, rows={self.rows}, expected_lookups={self.expected_lookups:.1f},"
            f" cacheability={self.cacheability:.3f})"
        )


def sampled_trace(profile, max_samples: int | None = None) -> np.ndarray:
    """The ids the profile sampled, in trace order, as int32 [n, T, L] (or [n, C] for bags of per-table sizes;
    at most ``max_samples`` samples)."""
    if profile.dataset is None:
        raise PlanError("the profile has no dataset attached: the LRU curve needs its sampled trace")
    split = profile.dataset.split(profile.profiler.split)
    n = profile.num_samples if max_samples is None else min(profile.num_samples, int(max_samples))
    if profile.sample_indices is None:
        return np.ascontiguousarray(split.sparse[:n])
    return np.ascontiguousarray(split.sparse[profile.sample_indices[:n]])


def lru_hit_curves(profile, max_samples: int | None = 1 << 20) -> list[tuple[np.ndarray, int]]:
    """Per table, ``(hits, accesses)`` of an LRU cache over the profile's sampled trace (see
    :class:`HotlineCacheStats`). A uniform sample (FAE's default) shortens reuse distances compared with the
    full trace; a ``sample_batches`` profile (a contiguous prefix) gives that prefix's exact curve."""
    trace = sampled_trace(profile, max_samples)
    if trace.ndim == 2:  # bags of per-table sizes [n, C]: one trace per table, its real ids in sample order
        bags = profile.dataset.bags
        out = []
        for t in range(bags.layout.num_tables):
            ids = trace[:, bags.bag_start[t] : bags.bag_start[t + 1]]
            seq = np.ascontiguousarray(ids[ids != PAD_ID])
            out.append((lru_hit_counts(stack_distances(seq)), int(seq.size)))
        return out
    n, T, L = trace.shape
    per_table = np.ascontiguousarray(trace.transpose(1, 0, 2).reshape(T, n * L))
    distances = stack_distances(per_table)
    return [(lru_hit_counts(distances[t]), n * L) for t in range(T)]


def lfu_hit_curves(profile) -> list[tuple[np.ndarray, int]]:
    """Per table, ``(hits, accesses)`` of a static cache of the most accessed rows (the coverage curve)."""
    out = []
    for t in range(profile.num_tables):
        counts = profile.table_counts(t)
        ranked = np.sort(counts[counts > 0])[::-1]
        out.append((np.concatenate([[0], np.cumsum(ranked)]).astype(np.int64), int(profile.table_lookups[t])))
    return out


def expected_unique_lookups(profile, global_batch_size: int) -> np.ndarray:
    """float64 [T]: expected distinct rows per table in a batch of ``global_batch_size`` samples, each row
    drawn independently with its sampled frequency."""
    out = np.zeros(profile.num_tables)
    for t in range(profile.num_tables):
        lookups = float(max(1, profile.table_lookups[t]))
        draws = int(global_batch_size) * (lookups / max(1, profile.num_samples))  # B * L_t
        p = profile.table_counts(t) / lookups
        p = p[p > 0]
        out[t] = float(-np.expm1(draws * np.log1p(-np.minimum(p, 1.0))).sum())
    return out


def cache_stats(
    profile, algorithm: str, global_batch_size: int, lru_max_samples: int | None = 1 << 20
) -> list[HotlineCacheStats]:
    """One :class:`HotlineCacheStats` per table of ``profile`` for an ``lru`` or ``lfu`` cache."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    curves = lru_hit_curves(profile, lru_max_samples) if algorithm == "lru" else lfu_hit_curves(profile)
    unique = expected_unique_lookups(profile, global_batch_size)
    return [
        HotlineCacheStats(size, hits, accesses, unique[t], algorithm)
        for t, (size, (hits, accesses)) in enumerate(zip(profile.table_sizes, curves))
    ]
