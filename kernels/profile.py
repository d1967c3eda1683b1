"""Profiling kernels: access counts per embedding row, and the largest popularity rank per sample.

Ids come as ``[n, C]`` columns with ``bag_start`` [T+1] (table t's bag is columns ``bag_start[t]:bag_start[t+1]``:
one-hot, a fixed pooling factor L and per-table bag sizes are the same loop); with ``padded`` the id -1 marks an
empty slot of a shorter bag and is skipped. All tables share one *fused* id space: row ``r`` of table ``t`` has fused id ``table_offsets[t] + r``, so
one count array covers every table and one sort ranks rows of all tables against each other.

Counting is a scatter-add, which races when two threads increment the same row. Two race-free strategies,
chosen by the size of the id space R (measured in benchmarks/bench_profile.py):

- ``private`` (small R): each thread counts a contiguous block of samples into its own count array, and the
  arrays are added into the result after each call. Reads the ids sequentially; the P private arrays and
  the reduction are cheap while R is small (at most PRIVATE_MAX_ROWS rows, and P * R at most the lookups of
  the call).
- ``owned`` (large R, e.g. the 33.8 M rows of Criteo Kaggle): each thread *owns* work items (whole tables, or
  row ranges of one when there are fewer tables than threads) and counts only the lookups that fall in its
  items, straight into the shared array: no private copies of a big id space, no reduction. Threads walk the
  samples in blocks, table by table, so one table's hot rows at a time compete for the cache.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

# Samples per block: the block's ids (BLOCK * T * L * 4 bytes) stay in L2 while every table is visited.
BLOCK = 512
# Largest id space counted with per-thread private arrays (8 MiB of int64 per thread); larger uses "owned".
PRIVATE_MAX_ROWS = 1 << 20


@njit(cache=True, parallel=True, nogil=True)
def _count_lookups_private(sparse, bag_start, padded, table_sizes, table_offsets, private):
    """Counts the lookups of ``sparse`` [n, C] into ``private`` [P, R], sample block p into row p.
    Returns the first bad flat position (sample * C + column) of an out-of-range id, or -1."""
    n, C = sparse.shape
    T = table_sizes.shape[0]
    P = private.shape[0]
    first_bad = np.full(P, -1, dtype=np.int64)
    for p in prange(P):
        counts = private[p]
        for i in range(n * p // P, n * (p + 1) // P):
            for t in range(T):
                size = table_sizes[t]
                base = table_offsets[t]
                for c in range(bag_start[t], bag_start[t + 1]):
                    row = sparse[i, c]
                    if row >= 0 and row < size:
                        counts[base + row] += 1
                    elif padded and row == -1:
                        continue
                    elif first_bad[p] < 0:
                        first_bad[p] = i * C + c
    bad = -1
    for p in range(P):
        if first_bad[p] >= 0 and (bad < 0 or first_bad[p] < bad):
            bad = first_bad[p]
    return bad


@njit(cache=True, parallel=True, nogil=True)
def _add_private(private, counts):
    """``counts += private.sum(axis=0)``, in parallel over the id space."""
    P, R = private.shape
    for r in prange(R):
        s = counts[r]
        for p in range(P):
            s += private[p, r]
        counts[r] = s


@njit(cache=True, parallel=True, nogil=True)
def _count_lookups(sparse, bag_start, padded, table_sizes, table_offsets, item_table, item_lo, item_hi, slot_ptr,
                   counts, block):  # fmt: skip
    """Adds the lookups of ``sparse`` [n, C] into ``counts`` [R]. Work slot p counts the row ranges
    ``item_lo[a] <= row < item_hi[a]`` of tables ``item_table[a]`` for a in ``slot_ptr[p]:slot_ptr[p+1]``
    (the items must tile every table exactly once). Returns the first bad flat position
    (sample * C + column) of an out-of-range id, or -1 when every id is valid."""
    n, C = sparse.shape
    P = slot_ptr.shape[0] - 1
    first_bad = np.full(P, -1, dtype=np.int64)
    for p in prange(P):
        for s0 in range(0, n, block):
            s1 = min(n, s0 + block)
            for a in range(slot_ptr[p], slot_ptr[p + 1]):
                t = item_table[a]
                lo = item_lo[a]
                hi = item_hi[a]
                size = table_sizes[t]
                base = table_offsets[t]
                for i in range(s0, s1):
                    for c in range(bag_start[t], bag_start[t + 1]):
                        row = sparse[i, c]
                        if row >= lo and row < hi:
                            counts[base + row] += 1
                        elif (row < 0 and lo == 0 and not (padded and row == -1)) or (
                            row >= size and hi == size
                        ):
                            bad = i * C + c
                            if first_bad[p] < 0 or bad < first_bad[p]:
                                first_bad[p] = bad
    bad = -1
    for p in range(P):
        if first_bad[p] >= 0 and (bad < 0 or first_bad[p] < bad):
            bad = first_bad[p]
    return bad


@njit(cache=True, parallel=True, nogil=True)
def _sample_max_rank(sparse, bag_start, padded, table_sizes, table_offsets, rank, bitmap, out, block):
    """Writes into ``out`` [n] the largest ``rank`` of the fused rows that sample i looks up (-1 if none);
    returns the first bad flat position of an out-of-range id, or -1. With ``bitmap``, ``rank`` is a bitmap of
    hot rows (:func:`hot_bitmap`) ranking them 0 and every other row 1.
    Blocks of samples run in parallel, table by table inside a block (for cache locality, as in
    _count_lookups)."""
    n, C = sparse.shape
    T = table_sizes.shape[0]
    num_blocks = (n + block - 1) // block
    bad_at = np.full(num_blocks, -1, dtype=np.int64)
    for b in prange(num_blocks):
        s0 = b * block
        s1 = min(n, s0 + block)
        for i in range(s0, s1):
            out[i] = -1
        for t in range(T):
            size = table_sizes[t]
            base = table_offsets[t]
            for i in range(s0, s1):
                m = out[i]
                for c in range(bag_start[t], bag_start[t + 1]):
                    row = sparse[i, c]
                    if padded and row == -1:
                        continue
                    if row < 0 or row >= size:
                        bad = i * C + c
                        if bad_at[b] < 0 or bad < bad_at[b]:
                            bad_at[b] = bad
                    else:
                        f = base + row
                        r = 1 - ((rank[f >> 3] >> (f & 7)) & 1) if bitmap else rank[f]
                        if r > m:
                            m = r
                out[i] = m
    for b in range(num_blocks):
        if bad_at[b] >= 0:
            return bad_at[b]
    return -1


@njit(cache=True, nogil=True)
def _add_histogram(values, hist):
    """``hist[v] += 1`` for every v in ``values`` (all within ``0 <= v < len(hist)``)."""
    for i in range(values.shape[0]):
        hist[values[i]] += 1


def table_offsets(table_sizes) -> np.ndarray:
    """int64 [T+1]: where each table starts in the fused id space (the last entry is the total rows)."""
    sizes = np.asarray(table_sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes < 0).any():
        raise ValueError(f"table_sizes must be a list of non-negative ints, got {table_sizes!r}")
    out = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def _as_sparse(sparse: np.ndarray, num_tables: int, bag_sizes=None) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, C] int32, bag_start int64 [T+1]) of ``sparse`` given as [n, T, L] or [n, T] (one bag size), or
    as [n, C] with ``bag_sizes`` (one per table)."""
    sparse = np.asarray(sparse)
    if not np.issubdtype(sparse.dtype, np.integer):
        raise ValueError(f"sparse ids must be integers, got dtype {sparse.dtype}")
    if bag_sizes is not None:
        bags = np.asarray(bag_sizes, dtype=np.int64)
        C = int(bags.sum())
        if bags.shape != (num_tables,) or (bags < 1).any() or sparse.ndim != 2 or sparse.shape[1] != C:
            raise ValueError(
                f"sparse ids must have shape [n, {C}] for bag sizes {list(bag_sizes)} of {num_tables} tables, "
                f"got {sparse.shape}"
            )
    else:
        if sparse.ndim == 2:
            sparse = sparse[:, :, None]
        if sparse.ndim != 3 or sparse.shape[1] != num_tables:
            raise ValueError(
                f"sparse ids must have shape [n, {num_tables}, L] (or [n, {num_tables}]), got {sparse.shape}"
            )
        bags = np.full(num_tables, sparse.shape[2], dtype=np.int64)
        sparse = sparse.reshape(sparse.shape[0], num_tables * sparse.shape[2])
    start = np.zeros(num_tables + 1, dtype=np.int64)
    np.cumsum(bags, out=start[1:])
    return np.ascontiguousarray(sparse, dtype=np.int32), start


class BadIdError(ValueError):
    """A row id outside its table; ``sample`` is the index within the array passed to the kernel."""

    def __init__(self, sample: int, table: int, lookup: int, row_id: int, table_size: int):
        self.sample, self.table, self.lookup = sample, table, lookup
        self.row_id, self.table_size = row_id, table_size
        super().__init__(
            f"sample {sample}, table {table}, lookup {lookup}: row id {row_id} is outside the table "
            f"(expected 0 <= id < {table_size})"
        )


def _bad_id_error(
    sparse: np.ndarray, bag_start: np.ndarray, table_sizes: np.ndarray, flat: int
) -> BadIdError:
    i, c = divmod(int(flat), sparse.shape[1])
    t = int(np.searchsorted(bag_start, c, side="right")) - 1
    return BadIdError(i, t, c - int(bag_start[t]), int(sparse[i, c]), int(table_sizes[t]))


def plan_count_work(table_sizes, num_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Work items for :func:`count_lookups`: (item_table, item_lo, item_hi, slot_ptr).

    Every table is one item, or (with fewer than 2 tables per slot) split into equal row ranges so every
    slot gets work. Items go to slots largest first in snake order (0, 1, ..., P-1, P-1, ..., 0), which
    balances the cache-missing big tables between threads.
    """
    sizes = [int(s) for s in table_sizes]
    P = max(1, int(num_slots))
    T = len(sizes)
    parts = 1 if T >= 2 * P or T == 0 else math.ceil(2 * P / T)
    items = []
    for t, size in enumerate(sizes):
        k = max(1, min(parts, size))
        bounds = [size * q // k for q in range(k + 1)]
        items.extend((t, bounds[q], bounds[q + 1]) for q in range(k))
    items.sort(key=lambda it: (-(it[2] - it[1]), it[0], it[1]))
    slots: list[list[tuple[int, int, int]]] = [[] for _ in range(P)]
    for k, item in enumerate(items):
        r = k % (2 * P)
        slots[r if r < P else 2 * P - 1 - r].append(item)
    flat = [it for slot in slots for it in sorted(slot)]
    item_table = np.array([it[0] for it in flat], dtype=np.int64)
    item_lo = np.array([it[1] for it in flat], dtype=np.int64)
    item_hi = np.array([it[2] for it in flat], dtype=np.int64)
    slot_ptr = np.zeros(P + 1, dtype=np.int64)
    np.cumsum([len(slot) for slot in slots], out=slot_ptr[1:])
    return item_table, item_lo, item_hi, slot_ptr


COUNT_DTYPES = (np.dtype(np.int64), np.dtype(np.uint32))


def count_dtype(lookups: int) -> np.dtype:
    """The narrowest count that holds ``lookups`` lookups of one row: uint32 below 2**32, else int64."""
    return np.dtype(np.uint32) if lookups < 2**32 else np.dtype(np.int64)


@njit(cache=True, nogil=True)
def _order_by_count(counts, hist, order):
    """Writes into ``order`` the rows with a count, most counted first, ties in id order (a counting sort:
    ``hist`` [max count + 1] zeros is its scratch)."""
    for r in range(counts.shape[0]):
        if counts[r] > 0:
            hist[counts[r]] += 1
    at = 0
    for c in range(hist.shape[0] - 1, 0, -1):
        n = hist[c]
        hist[c] = at
        at += n
    for r in range(counts.shape[0]):
        c = counts[r]
        if c > 0:
            order[hist[c]] = r
            hist[c] += 1


def order_by_count(counts: np.ndarray) -> np.ndarray:
    """The rows with a count, most counted first, ties in id order: ``np.argsort(-counts[accessed],
    kind="stable")`` of the accessed rows, without sorting them (a counting sort over the counts' values, when
    the largest count is below the row count; a stable sort otherwise). int32 below 2**31 rows."""
    counts = np.ascontiguousarray(counts)
    dtype = np.int32 if counts.shape[0] < 2**31 else np.int64
    top = int(counts.max(initial=0))
    accessed = int(np.count_nonzero(counts))
    if top > max(counts.shape[0], 1 << 16):
        rows = np.flatnonzero(counts)
        return rows[np.argsort(-counts[rows].astype(np.int64), kind="stable")].astype(dtype)
    order = np.empty(accessed, dtype)
    _order_by_count(counts, np.zeros(top + 1, np.int64), order)
    return order


def count_lookups(
    sparse: np.ndarray,
    table_sizes,
    counts: np.ndarray,
    num_slots: int | None = None,
    method: str | None = None,
    bag_sizes=None,
    padded: bool = False,
) -> None:
    """Adds the lookups of ``sparse`` (int [n, T, L], or [n, C] with ``bag_sizes``) into ``counts`` (int64, or
    uint32 where the lookups counted stay below 2**32: :func:`count_dtype`; [total rows], fused ids); with ``padded`` the id -1 (an empty bag slot) is skipped.

    Call it once per chunk of a dataset. ``num_slots`` (default: Numba's thread count) is how many parallel
    work slots share the work; ``method`` is "private" or "owned" (default: private up to PRIVATE_MAX_ROWS
    rows when the P private arrays are no bigger than the lookups of the call, see the module docstring). Raises :class:`BadIdError` naming the sample, table and id when an id
    is outside its table (``counts`` is then left unchanged by "private", partially updated by "owned").
    """
    import numba

    sizes = np.asarray(table_sizes, dtype=np.int64)
    sparse, start = _as_sparse(sparse, sizes.shape[0], bag_sizes)
    offsets = table_offsets(sizes)
    total = int(offsets[-1])
    if counts.shape != (total,) or counts.dtype not in COUNT_DTYPES or not counts.flags.c_contiguous:
        raise ValueError(
            f"counts must be C-contiguous int64 or uint32 [{total}], got {counts.dtype} {counts.shape}"
        )
    slots = int(num_slots or numba.get_num_threads())
    if method is None:
        # Private arrays cost P * R zeroing and reduction per call: worth it only while that is small next to
        # the lookups counted (and the arrays stay cache-sized).
        small = total <= PRIVATE_MAX_ROWS and slots * total <= sparse.size
        method = "private" if small else "owned"
    if method == "private":
        private = np.zeros((max(1, slots), total), dtype=counts.dtype)
        bad = _count_lookups_private(sparse, start, bool(padded), sizes, offsets[:-1], private)
        if bad < 0:
            _add_private(private, counts)
    elif method == "owned":
        plan = plan_count_work(sizes, slots)
        bad = _count_lookups(sparse, start, bool(padded), sizes, offsets[:-1], *plan, counts, BLOCK)
    else:
        raise ValueError(f"method must be 'private' or 'owned', got {method!r}")
    if bad >= 0:
        raise _bad_id_error(sparse, start, sizes, bad)


def lookup_counts(
    sparse: np.ndarray, table_sizes, num_slots: int | None = None, method: str | None = None, bag_sizes=None,
    padded: bool = False,
) -> np.ndarray:  # fmt: skip
    """int64 [total rows]: how often each fused row (table offset + row id) is looked up in ``sparse``."""
    counts = np.zeros(int(table_offsets(table_sizes)[-1]), dtype=np.int64)
    count_lookups(sparse, table_sizes, counts, num_slots, method, bag_sizes, padded)
    return counts


def sample_max_rank(
    sparse: np.ndarray, table_sizes, rank: np.ndarray, bag_sizes=None, padded: bool = False
) -> np.ndarray:
    """int64 [n]: for each sample, the largest ``rank[fused row]`` over its lookups (-1 for no lookups).

    ``rank`` is int32 or int64 [total rows] (int32 halves the cache footprint of the random reads).

    A sample is *popular* under a placement of the ``k`` best-ranked rows iff its max rank is ``< k``.
    ``bag_sizes`` / ``padded`` as in :func:`count_lookups`.
    """
    sizes = np.asarray(table_sizes, dtype=np.int64)
    sparse, start = _as_sparse(sparse, sizes.shape[0], bag_sizes)
    offsets = table_offsets(sizes)
    if rank.dtype not in (np.int32, np.int64):
        rank = rank.astype(np.int64)
    rank = np.ascontiguousarray(rank)
    if rank.shape != (int(offsets[-1]),):
        raise ValueError(f"rank must have shape [{int(offsets[-1])}] (one per fused row), got {rank.shape}")
    out = np.empty(sparse.shape[0], dtype=np.int64)
    bad = _sample_max_rank(sparse, start, bool(padded), sizes, offsets[:-1], rank, False, out, BLOCK)
    if bad >= 0:
        raise _bad_id_error(sparse, start, sizes, bad)
    return out


def hot_bitmap(table_sizes, hot_ids) -> np.ndarray:
    """uint8 [ceil(total rows / 8)]: bit ``f & 7`` of byte ``f >> 3`` set for each hot fused row ``f`` (table
    offset + row id of ``hot_ids[t]``, one int array per table): a hot set in 1 bit a row, where a remap takes 32."""
    offsets = table_offsets(table_sizes)
    if len(hot_ids) != offsets.shape[0] - 1:
        raise ValueError(f"hot_ids has {len(hot_ids)} tables, table_sizes {offsets.shape[0] - 1}")
    bits = np.zeros((int(offsets[-1]) + 7) // 8, np.uint8)
    for t, ids in enumerate(hot_ids):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= offsets[t + 1] - offsets[t]):
            raise ValueError(f"table {t}: hot ids must lie in [0, {int(offsets[t + 1] - offsets[t])})")
        _set_bits(bits, ids, int(offsets[t]))
    return bits


@njit(cache=True, nogil=True)
def _set_bits(bits, ids, base):
    for i in range(ids.shape[0]):
        f = base + ids[i]
        bits[f >> 3] |= np.uint8(1 << (f & 7))


def in_bitmap(bits: np.ndarray, fused: np.ndarray) -> np.ndarray:
    """bool [like fused]: whether each fused row is set in ``bits`` (:func:`hot_bitmap`)."""
    fused = np.asarray(fused, dtype=np.int64)
    return ((bits[fused >> 3] >> (fused & 7).astype(np.uint8)) & 1).astype(bool)


def sample_max_cold(
    sparse: np.ndarray, table_sizes, bits: np.ndarray, bag_sizes=None, padded: bool = False
) -> np.ndarray:
    """int64 [n]: :func:`sample_max_rank` under the ranks 0 (a row set in ``bits``, :func:`hot_bitmap`) and 1
    (any other): 1 when the sample looks up a row outside the hot set, 0 when every lookup is hot, -1 for none."""
    sizes = np.asarray(table_sizes, dtype=np.int64)
    sparse, start = _as_sparse(sparse, sizes.shape[0], bag_sizes)
    offsets = table_offsets(sizes)
    if bits.dtype != np.uint8 or bits.shape != ((int(offsets[-1]) + 7) // 8,):
        raise ValueError(f"bits must be uint8 [{(int(offsets[-1]) + 7) // 8}], got {bits.dtype} {bits.shape}")
    out = np.empty(sparse.shape[0], dtype=np.int64)
    bad = _sample_max_rank(sparse, start, bool(padded), sizes, offsets[:-1], bits, True, out, BLOCK)
    if bad >= 0:
        raise _bad_id_error(sparse, start, sizes, bad)
    return out


def add_histogram(values: np.ndarray, hist: np.ndarray) -> None:
    """``hist[v] += 1`` for every value (int64 values in ``[0, len(hist))``; checked). ``hist``: int64, or uint16
    where the caller keeps every count below 65,536 (a count per row of a large table, in a quarter of the
    memory)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= hist.shape[0]):
        raise ValueError(
            f"histogram values must lie in [0, {hist.shape[0]}), got [{values.min()}, {values.max()}]"
        )
    if hist.dtype not in (np.int64, np.uint16) or hist.ndim != 1:
        raise ValueError(f"hist must be int64 or uint16 [bins], got {hist.dtype} {hist.shape}")
    _add_histogram(values, hist)


@njit(cache=True, nogil=True)
def _add_step_counts(ids, col_offset, counts, weight, top):
    """``counts[fused] += weight`` per lookup (-1, an empty bag slot, skipped) while the count is below ``top``
    (uint32's largest value: a count stops there instead of wrapping round to 0; float32: infinity)."""
    B, C = ids.shape
    for b in range(B):
        for c in range(C):
            v = ids[b, c]
            if v >= 0:
                f = v + col_offset[c]
                if counts[f] < top:
                    counts[f] += weight


def add_step_counts(ids: np.ndarray, col_offset: np.ndarray, counts: np.ndarray, weight: float) -> None:
    """Counts one step's lookups (checked ids ``[B, C]``, column c of table offset ``col_offset[c]``; the
    padding id -1 skipped) into ``counts``: float32 adds ``weight`` per lookup, uint32 adds 1 and saturates at
    2**32 - 1 (``weight`` must then be 1)."""
    if ids.ndim != 2 or ids.shape[1] != col_offset.shape[0]:
        raise ValueError(f"ids must be [B, {col_offset.shape[0]}], got {ids.shape}")
    if counts.dtype not in (np.float32, np.uint32) or (counts.dtype == np.uint32 and weight != 1.0):
        raise ValueError(f"counts must be float32, or uint32 at weight 1: got {counts.dtype} at {weight}")
    top = np.iinfo(np.uint32).max if counts.dtype == np.uint32 else np.inf
    _add_step_counts(ids, col_offset, counts, counts.dtype.type(weight), counts.dtype.type(top))


@njit(cache=True, nogil=True)
def _top_rows(keys, k, out):
    """Writes into ``out`` [k] the ids of the ``k`` largest ``keys`` (uint32), ties to the lowest ids, in id
    order: the k-th largest key found a byte at a time (four histogram passes), then one pass to collect."""
    prefix = np.uint32(0)
    mask = np.uint32(0)
    remaining = k  # of the k, how many are still to be found among the keys that match the prefix
    hist = np.zeros(256, np.int64)
    for shift in (24, 16, 8, 0):
        hist[:] = 0
        for i in range(keys.shape[0]):
            if keys[i] & mask == prefix:
                hist[(keys[i] >> shift) & 255] += 1
        for d in range(255, -1, -1):
            if hist[d] >= remaining:
                prefix |= np.uint32(d) << np.uint32(shift)
                break
            remaining -= hist[d]
        mask |= np.uint32(255) << np.uint32(shift)
    at = 0
    for i in range(keys.shape[0]):
        if keys[i] > prefix:
            out[at] = i
            at += 1
        elif keys[i] == prefix and remaining > 0:
            out[at] = i
            at += 1
            remaining -= 1


def top_rows(values: np.ndarray, k: int) -> np.ndarray:
    """int64 [k]: the indices of the ``k`` largest ``values`` (uint32, or float32 >= 0), ties to the lowest
    index, sorted: ``np.sort(np.argsort(-values, kind="stable")[:k])`` with no sort and no array of every index
    (a selection a byte of the values at a time)."""
    values = np.ascontiguousarray(values)
    if values.dtype not in (np.uint32, np.float32) or values.ndim != 1:
        raise ValueError(f"values must be 1-D uint32 or float32, got {values.dtype} {values.shape}")
    k = int(min(max(k, 0), values.shape[0]))
    out = np.empty(k, np.int64)
    if k:
        # the bits of a float32 >= 0 read as uint32 are in the same order as its value
        _top_rows(values.view(np.uint32), k, out)
    return out
