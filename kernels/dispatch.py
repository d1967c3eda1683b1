"""The dispatcher kernel: split a mini-batch into a popular and a non-popular micro-batch.

A sample is *popular* when every lookup of every table hits a hot row. The popular micro-batch needs the hot
table only; the non-popular one needs hot rows plus its *working set*: the unique cold rows it touches, which
must be gathered from host memory. Ids come out already remapped: hot rows to their fused hot slot, cold rows
to their slot in this step's working buffer (first-occurrence order, so the result is deterministic).

The batch is seen as ``[B, C]`` columns (C = T * L: one-hot and multi-hot bags are the same loop), each column
with its table's offset into the fused row space. Classification runs in parallel over samples; slot
assignment for cold rows is a sequential pass over the non-popular lookups only, using a scratch array
``slot_map`` over the fused row space (-1 everywhere between calls) instead of a sort or a hash table.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _classify(ids, col_offset, col_size, remap, is_popular, bad, slot, n_cold):
    """is_popular[b] = every lookup of sample b is hot; bad[b] = first out-of-range column of b, or -1;
    n_cold[b] = its cold lookups.

    Also keeps each lookup's hot slot (or -1) in ``slot`` [B*C], so the later passes read it sequentially
    instead of going back to the large remap array."""
    B, C = ids.shape
    for b in prange(B):
        cold = 0
        bad[b] = -1
        for c in range(C):
            v = ids[b, c]
            if v < 0 or v >= col_size[c]:
                bad[b] = c
                cold += 1
                break
            r = remap[col_offset[c] + v]
            slot[b * C + c] = r
            if r < 0:
                cold += 1
        n_cold[b] = cold
        is_popular[b] = cold == 0


@njit(cache=True)
def _partition(is_popular, bad, n_cold, C, fused, pop_samples, np_samples, hot_start, cold_start):
    """Stable partition into popular / non-popular samples with the prefix sums of the non-popular samples'
    hot and cold lookups. Returns (n_popular, n_non_popular, n_cold_lookups), or (-1, b, 0) if sample b has
    an out-of-range id."""
    B = is_popular.shape[0]
    for b in range(B):
        if bad[b] >= 0:
            return -1, b, 0
    n_pop = 0
    n_np = 0
    nc = 0
    hot_start[0] = 0
    cold_start[0] = 0
    for b in range(B):
        if is_popular[b] and not fused:
            pop_samples[n_pop] = b
            n_pop += 1
        else:
            np_samples[n_np] = b
            nc += n_cold[b]
            n_np += 1
            cold_start[n_np] = nc
            hot_start[n_np] = n_np * C - nc
    return n_pop, n_np, nc


@njit(cache=True, parallel=True)
def _write_popular(slot, C, pop_samples, pop_ids):
    for i in prange(pop_samples.shape[0]):
        b = pop_samples[i]
        for c in range(C):
            pop_ids[i * C + c] = slot[b * C + c]


@njit(cache=True, parallel=True)
def _write_non_popular(
    ids, col_offset, slot, np_samples, hot_start, cold_start, hot_pos, hot_slot, cold_pos, cold_fid
):
    """Positions and hot slots of the non-popular lookups, and the fused ids of the cold ones, in batch order.

    Each sample writes at its own offsets (``hot_start``/``cold_start``: prefix sums of its hot and cold
    lookups), so the samples run in parallel."""
    C = ids.shape[1]
    for i in prange(np_samples.shape[0]):
        b = np_samples[i]
        nh = hot_start[i]
        nc = cold_start[i]
        for c in range(C):
            k = i * C + c
            r = slot[b * C + c]
            if r >= 0:
                hot_pos[nh] = k
                hot_slot[nh] = r
                nh += 1
            else:
                cold_pos[nc] = k
                cold_fid[nc] = col_offset[c] + ids[b, c]
                nc += 1


@njit(cache=True)
def _assign_cold_slots(cold_fid, slot_map, cold_slot, working_set):
    """Numbers the distinct cold rows in first-occurrence order (the working set); returns how many.

    Sequential, but over the cold lookups only (a few percent of a skewed batch)."""
    u = 0
    for j in range(cold_fid.shape[0]):
        fid = cold_fid[j]
        s = slot_map[fid]
        if s < 0:
            s = u
            slot_map[fid] = u
            working_set[u] = fid
            u += 1
        cold_slot[j] = s
    for j in range(u):  # leave the scratch map clean for the next call
        slot_map[working_set[j]] = -1
    return u


def new_buffers(max_lookups: int, max_samples: int) -> dict[str, np.ndarray]:
    """Output arrays for :func:`split_batch`, allocated once and reused (one set per batch in flight)."""
    out = {
        k: np.empty(max_lookups, np.int64)
        for k in ("pop_ids", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "cold_fid", "working_set")
    }
    for k in ("n_cold", "pop_samples", "np_samples"):
        out[k] = np.empty(max_samples, np.int64)
    for k in ("hot_start", "cold_start"):
        out[k] = np.empty(max_samples + 1, np.int64)
    out["is_popular"] = np.empty(max_samples, np.bool_)
    out["slot"] = np.empty(max_lookups, np.int32)
    out["bad"] = np.empty(max_samples, np.int64)
    return out


def split_batch(ids, col_offset, col_size, remap, slot_map, buffers, fused=False):
    """Runs the three kernels on ``ids`` [B, C] (int32/int64), writing into ``buffers`` (see
    :func:`new_buffers`; sized for at least B*C lookups and B samples). Returns a tuple of arrays (views into
    ``buffers`` where they are lookup-sized):

    ``(popular_samples, non_popular_samples, pop_ids, hot_pos, hot_slot, cold_pos, cold_slot, working_set,
    bad)`` where ``bad`` is per-sample the first out-of-range column (-1 if none); when any is >= 0 the other
    outputs are empty. ``slot_map`` (int32, fused rows, all -1) is scratch and left all -1.

    ``fused=True`` classifies as usual (``buffers["is_popular"]``) but returns one micro-batch: every sample
    in the "non-popular" outputs, in batch order (for steps whose cold rows are already on the device).
    """
    B, C = ids.shape
    is_popular = buffers["is_popular"][:B]
    bad = buffers["bad"][:B]
    slot = buffers["slot"][: B * C]
    n_cold = buffers["n_cold"][:B]
    _classify(ids, col_offset, col_size, remap, is_popular, bad, slot, n_cold)
    hot_start, cold_start = buffers["hot_start"][: B + 1], buffers["cold_start"][: B + 1]
    n_pop, n_np, nc = _partition(
        is_popular,
        bad,
        n_cold,
        C,
        fused,
        buffers["pop_samples"],
        buffers["np_samples"],
        hot_start,
        cold_start,
    )
    if n_pop < 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty, empty, empty, empty, empty, bad
    pop_samples, np_samples = buffers["pop_samples"][:n_pop], buffers["np_samples"][:n_np]
    pop_ids = buffers["pop_ids"][: n_pop * C]
    _write_popular(slot, C, pop_samples, pop_ids)
    nh = n_np * C - nc
    hot_pos, hot_slot = buffers["hot_pos"], buffers["hot_slot"]
    cold_pos, cold_slot, cold_fid = buffers["cold_pos"], buffers["cold_slot"], buffers["cold_fid"]
    working_set = buffers["working_set"]
    _write_non_popular(
        ids, col_offset, slot, np_samples, hot_start, cold_start, hot_pos, hot_slot, cold_pos, cold_fid
    )
    u = _assign_cold_slots(cold_fid[:nc], slot_map, cold_slot, working_set)
    return (
        pop_samples,
        np_samples,
        pop_ids,
        hot_pos[:nh],
        hot_slot[:nh],
        cold_pos[:nc],
        cold_slot[:nc],
        working_set[:u],
        bad,
    )


@njit(cache=True)
def _claim_rows(working_set, owner, step, fresh_before, stale):
    """Marks ``working_set`` as read by ``step``; returns how many of its slots went to ``stale``.

    ``owner[row]`` is the last step whose working set held the row. A row last held by a step that had not
    finished writing back (``owner >= fresh_before``) may be read from host memory before its update lands, so
    its slot is listed in ``stale`` for a refresh just before the step computes.
    """
    n = 0
    for s in range(working_set.shape[0]):
        r = working_set[s]
        if owner[r] >= fresh_before:
            stale[n] = s
            n += 1
        owner[r] = step
    return n


def claim_rows(working_set: np.ndarray, owner: np.ndarray, step: int, fresh_before: int) -> np.ndarray:
    """Slots of ``working_set`` whose rows an unfinished earlier step may still update (see ``_claim_rows``)."""
    stale = np.empty(working_set.shape[0], np.int64)
    n = _claim_rows(working_set, owner, step, fresh_before, stale)
    return stale[:n]


@njit(cache=True)
def _add_counts(ids, col_offset, counts, weight):
    B, C = ids.shape
    for b in range(B):
        for c in range(C):
            counts[ids[b, c] + col_offset[c]] += weight


def add_counts(ids: np.ndarray, col_offset: np.ndarray, counts: np.ndarray, weight: float) -> None:
    """``counts[fused id] += weight`` for every lookup of a checked ``[B, T*L]`` id batch (column c of table
    offset ``col_offset[c]``)."""
    if ids.ndim != 2 or ids.shape[1] != col_offset.shape[0]:
        raise ValueError(f"ids must be [B, {col_offset.shape[0]}], got {ids.shape}")
    if counts.dtype != np.float64:
        raise ValueError(f"counts must be float64, got {counts.dtype}")
    _add_counts(ids, col_offset, counts, float(weight))
