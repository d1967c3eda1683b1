"""The dispatcher kernel: split a mini-batch into a popular and a non-popular micro-batch.

A sample is *popular* when every lookup of every table hits a hot row. The popular micro-batch needs the hot
table only; the non-popular one needs hot rows plus its *working set*: the unique cold rows it touches, which
must be gathered from host memory. Ids come out already remapped: hot rows to their fused hot slot, cold rows
to their slot in this step's working buffer (first-occurrence order, so the result is deterministic).

The batch is seen as ``[B, C]`` columns (C = T * L: one-hot and multi-hot bags are the same loop), each column
with its table's offset into the fused row space. The samples are cut into contiguous chunks, one per thread,
and the split makes two parallel passes over them. The lookup pass reads every id once, checks it, looks it
up in the int32 remap (prefetched a few samples ahead: the remap is tens of MB and the lookups are random, so
this pass is bound by memory latency) and writes one int32 slot per lookup, counting each chunk's popular
samples and cold lookups. From those counts every chunk knows where its outputs start, so the write pass reads
its slots back (sequential, cache-resident) and writes each sample straight into its micro-batch at its final
place: nothing is moved afterwards. A short sequential pass then numbers the cold rows in first-occurrence
order with a scratch hash table ``slot_map`` sized by the batch (-1 everywhere between calls) instead of a
sort, or of an array over the fused row space (4 bytes a row). Every kernel releases the GIL (``nogil``): the look-ahead producer runs them beside the
training step.

A compact hot-row structure in place of the remap (a bitmap of hot rows with per-word ranks, 1.4 MB, and a
rank -> slot array, 1.7 MB) was measured slower here for the lookup pass: the int32 remap's hot lines stay
in the last-level cache under the prefetch, while rank -> slot adds a dependent load per hot lookup.

The lookup pass takes either index through one probe (``_slot_of``, specialised by the index's type): the
int32 remap of every row (4 bytes a row: one load a lookup) or the *hot table* (:func:`new_hot_table`), an
open-addressing table of the hot rows alone, sized by the hot set, whose probe walks from a home entry until
the key or an empty entry (cold lookups probe further, a branch the remap has not): slower, and what each of
N ranks holds (``hotline.dispatch.index_for``; ``benchmarks/bench_dispatcher.py`` prints the ratio).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

PREFETCH_LOOKUPS = 96
"""How far ahead (in lookups, rounded to whole samples) the split prefetches remap entries."""


@intrinsic
def _prefetch(typingctx, arr, index):
    """Hints the CPU to load ``arr[index]`` into cache (LLVM's prefetch: read, high locality); no effect on
    results, so an index past the end is harmless but never made."""
    sig = types.void(arr, index)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=fnty)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _u(i):
    """``i`` as an unsigned index. Numba wraps every signed index (``a[i]`` with ``i < 0`` reads from the end),
    which adds a compare and select to each access and keeps LLVM from unrolling the kernels' inner loops;
    an unsigned index has no such branch. Only for indices known to be in range and non-negative (checked
    ids, positions counted from zero). Mixing an unsigned and a signed integer makes Numba compute in float64,
    so every operand of an index sum is wrapped."""
    return np.uint64(i)


_ONE = np.uint64(1)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _home(fid, shift, mask):
    """The first probe of ``fid`` in a slot table of ``mask + 1`` entries (Fibonacci hashing)."""
    return np.int64((np.uint64(fid) * _GOLDEN) >> np.uint64(shift)) & mask


@njit(cache=True, nogil=True, inline="always")
def _hash_shift(entries):
    """64 - log2(``entries``): the shift of :func:`_home` for a table of ``entries`` (a power of two)."""
    bits = 0
    while (1 << bits) < entries:
        bits += 1
    return 64 - bits


def _slot_of(index, fid, shift):
    """The hot slot of fused row ``fid`` in ``index`` (a dense remap or a hot table), or -1."""


def _prefetch_slot(index, fid, shift):
    """Prefetches where :func:`_slot_of` will first look for ``fid``."""


@overload(_slot_of, inline="always")
def _slot_of_impl(index, fid, shift):
    if index.ndim == 1:  # the dense remap: one load

        def dense(index, fid, shift):
            return np.int64(index[_u(fid)])

        return dense

    def hashed(index, fid, shift):  # the hot table: linear probing from the home entry
        mask = index.shape[0] - 1
        i = _home(fid, shift, mask)
        while True:
            k = index[_u(i), 0]
            if k == fid:
                return np.int64(index[_u(i), 1])
            if k == -1:
                return np.int64(-1)
            i = (i + 1) & mask

    return hashed


@overload(_prefetch_slot, inline="always")
def _prefetch_slot_impl(index, fid, shift):
    if index.ndim == 1:

        def dense(index, fid, shift):
            _prefetch(index, fid)

        return dense

    def hashed(index, fid, shift):  # entry i's key is element 2i of the C-contiguous [M, 2] table
        _prefetch(index, 2 * _home(fid, shift, index.shape[0] - 1))

    return hashed


@njit(cache=True, parallel=True, nogil=True)
def _lookup_chunks(ids, col_offset, col_size, remap, ahead, chunk_start, slots, is_popular, bad, counts):
    """Pass 1, the lookups: chunk k (samples ``chunk_start[k]:chunk_start[k+1]``) reads every id once, checks
    it, looks it up in the remap (prefetched ``ahead`` samples on) and writes its slot ``slots[b*C + c]``, then
    ``is_popular[b]`` and ``counts[k]`` = (popular samples, cold lookups). A chunk stops at its first sample
    with an out-of-range id, recording the column in ``bad`` (-1 for every other sample of the chunk); returns
    how many chunks stopped."""
    B, C = ids.shape
    stopped = 0
    shift = _hash_shift(remap.shape[0])
    for k in prange(chunk_start.shape[0] - 1):
        b0, b1 = chunk_start[k], chunk_start[k + 1]
        n_pop = 0
        n_cold = 0
        for b in range(b0, b1):
            if b + ahead < b1:
                for c in range(C):
                    v = ids[_u(b + ahead), _u(c)]
                    if v >= 0 and v < col_size[_u(c)]:
                        _prefetch_slot(remap, col_offset[_u(c)] + v, shift)
            row = _u(b * C)
            cold = 0
            stop = -1
            for c in range(C):
                v = ids[_u(b), _u(c)]
                if v < 0 or v >= col_size[_u(c)]:
                    stop = c
                    break
                r = _slot_of(remap, col_offset[_u(c)] + v, shift)
                slots[row + _u(c)] = r
                cold += r < 0
            bad[b] = stop
            if stop >= 0:
                for rest in range(b + 1, b1):
                    bad[rest] = -1
                stopped += 1
                break
            is_popular[_u(b)] = cold == 0
            n_pop += cold == 0
            n_cold += cold
        counts[k, 0] = n_pop
        counts[k, 1] = n_cold
    return stopped


@njit(cache=True, parallel=True, nogil=True)
def _write_chunks(
    ids, col_offset, slots, is_popular, fused, chunk_start, counts,
    pop_samples, pop_ids, np_samples, hot_pos, hot_slot, cold_pos, cold_fid,
):  # fmt: skip
    """Pass 2, the outputs: from the chunks' counts, each chunk's offsets into the outputs; then every chunk
    reads its slots back (sequentially: they are still in cache) and writes its popular samples and their
    slots, its non-popular samples, their hot lookups (position within the non-popular micro-batch, hot slot)
    and cold lookups (position, fused id) straight at their final places, so no chunk is moved afterwards.
    Returns the totals (popular, non-popular, hot, cold).

    Hot and cold lookups are written behind a branch: measured faster here than writing both candidates and
    keeping one (cold lookups are few, so the branch is mostly predicted), and no write lands past a chunk's
    own outputs."""
    C = ids.shape[1]
    K = chunk_start.shape[0] - 1
    n_pop = 0
    n_cold = 0
    for k in range(K):  # counts -> offsets: popular samples and cold lookups before chunk k
        pop_k = 0 if fused else counts[k, 0]
        cold_k = counts[k, 1]
        counts[k, 0] = n_pop
        counts[k, 1] = n_cold
        n_pop += pop_k
        n_cold += cold_k
    for k in prange(K):
        b0, b1 = chunk_start[k], chunk_start[k + 1]
        p = _u(counts[k, 0])
        q = _u(b0) - p
        nc = _u(counts[k, 1])
        nh = q * _u(C) - nc
        for b in range(b0, b1):
            row = _u(b * C)
            if is_popular[_u(b)] and not fused:
                pop_samples[p] = b
                for c in range(C):
                    pop_ids[p * _u(C) + _u(c)] = slots[row + _u(c)]
                p += _ONE
                continue
            np_samples[q] = b
            first = q * _u(C)
            for c in range(C):
                r = slots[row + _u(c)]
                if r >= 0:
                    hot_pos[nh] = first + _u(c)
                    hot_slot[nh] = r
                    nh += _ONE
                else:
                    cold_pos[nc] = first + _u(c)
                    cold_fid[nc] = col_offset[_u(c)] + ids[_u(b), _u(c)]
                    nc += _ONE
            q += _ONE
    n_np = chunk_start[K] - n_pop
    return n_pop, n_np, n_np * C - n_cold, n_cold


@njit(cache=True, nogil=True)
def _assign_cold_slots(cold_fid, slot_map, cold_slot, working_set):
    """Numbers the distinct cold rows in first-occurrence order (the working set); returns how many.

    ``slot_map`` [M, 2] (M a power of two, at least twice the cold lookups) is an open-addressing table of
    (fused row, slot) pairs, all -1 between calls: sized by the batch, not the row count. Sequential, but over
    the cold lookups only (a few percent of a skewed batch)."""
    n = cold_fid.shape[0]
    M = slot_map.shape[0]
    shift, mask = _hash_shift(M), M - 1
    u = 0
    for j in range(n):
        fid = cold_fid[j]
        i = _home(fid, shift, mask)
        while slot_map[i, 0] != fid and slot_map[i, 0] != -1:
            i = (i + 1) & mask
        if slot_map[i, 0] == -1:
            slot_map[i, 0] = fid
            slot_map[i, 1] = u
            working_set[u] = fid
            u += 1
        cold_slot[j] = slot_map[i, 1]
    # leave the table clean for the next call: latest first, so every earlier row's probe chain stays whole
    for j in range(u - 1, -1, -1):
        fid = working_set[j]
        i = _home(fid, shift, mask)
        while slot_map[i, 0] != fid:
            i = (i + 1) & mask
        slot_map[i, 0] = -1
        slot_map[i, 1] = -1
    return u


LOAD_INVERSE = 4
"""A hot table has at least this many entries a key (at most a quarter full): most probes end at the first
entry, hit or miss (cold lookups probe until an empty entry)."""


@njit(cache=True, nogil=True)
def _fill_hot_table(keys, slots, table):
    """Inserts the distinct ``keys`` with their ``slots`` into the empty (all -1) open-addressing ``table``."""
    M = table.shape[0]
    shift, mask = _hash_shift(M), M - 1
    for j in range(keys.shape[0]):
        i = _home(keys[j], shift, mask)
        while table[i, 0] != -1:
            i = (i + 1) & mask
        table[i, 0] = keys[j]
        table[i, 1] = slots[j]


def new_hot_table(keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The hot table: ``keys`` (distinct non-negative fused row ids) -> ``slots``, for :func:`split_batch` and
    :func:`lookup_slots` in place of a dense remap. An open-addressing table [M, 2] of (key, slot) pairs, -1
    where empty, M the power of two at or above twice the keys (at most half full, so a probe ends within a
    few entries); int32 while every key and slot fits, else int64: 16 to 32 bytes a hot row, whatever the
    row count."""
    keys = np.asarray(keys, np.int64)
    slots = np.asarray(slots, np.int64)
    if keys.shape != slots.shape or keys.ndim != 1:
        raise ValueError(f"keys and slots must be 1-D of one length, got {keys.shape} and {slots.shape}")
    top = max(int(keys.max(initial=0)), int(slots.max(initial=0)))
    dtype = np.int32 if top < 2**31 - 1 else np.int64
    M = 1 << max(4, (LOAD_INVERSE * max(1, keys.shape[0]) - 1).bit_length())
    table = np.full((M, 2), -1, dtype)
    _fill_hot_table(keys.astype(dtype), slots.astype(dtype), table)
    return table


@njit(cache=True, parallel=True, nogil=True)
def _lookup_slots(index, fids, out):
    shift = _hash_shift(index.shape[0])
    for j in prange(fids.shape[0]):
        out[j] = _slot_of(index, fids[j], shift)


def lookup_slots(index: np.ndarray, fids: np.ndarray) -> np.ndarray:
    """int64 [n]: the hot slot of each fused row id in ``fids`` (in range, non-negative), or -1 if cold, by
    ``index``: a dense remap (int32 [rows]) or a hot table (:func:`new_hot_table`)."""
    fids = np.ascontiguousarray(fids, np.int64).reshape(-1)
    out = np.empty(fids.shape[0], np.int64)
    _lookup_slots(index, fids, out)
    return out


def new_slot_map(max_lookups: int) -> np.ndarray:
    """The scratch table of :func:`split_batch` for batches of up to ``max_lookups`` lookups: all -1."""
    M = 1 << max(4, (2 * max(1, int(max_lookups)) - 1).bit_length())
    return np.full((M, 2), -1, np.int64)


def new_buffers(max_lookups: int, max_samples: int) -> dict[str, np.ndarray]:
    """Output arrays for :func:`split_batch`, allocated once and reused (one set per batch in flight)."""
    out = {
        k: np.empty(max_lookups, np.int64)
        for k in ("pop_ids", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "cold_fid", "working_set")
    }
    out["slots"] = np.empty(max_lookups, np.int32)  # pass 1's remapped lookups, read back by pass 2
    for k in ("pop_samples", "np_samples", "bad"):
        out[k] = np.empty(max_samples, np.int64)
    out["is_popular"] = np.empty(max_samples, np.bool_)
    return out


def num_chunks(B: int) -> int:
    """Chunks a batch of B samples is cut into: one per Numba thread, and none smaller than 64 samples."""
    return max(1, min(numba.get_num_threads(), B // 64))


def chunk_bounds(B: int, chunks: int | None = None) -> np.ndarray:
    """int64 [n + 1]: the first sample of each of n chunks of a B-sample batch, then B (n = ``chunks``, or
    :func:`num_chunks` when None)."""
    n = num_chunks(B) if chunks is None else max(1, min(int(chunks), max(B, 1)))
    return (np.arange(n + 1, dtype=np.int64) * B) // n


_EMPTY = np.zeros(0, dtype=np.int64)


def split_batch(ids, col_offset, col_size, remap, slot_map, buffers, fused=False, chunks=None):
    """Splits ``ids`` [B, C] (int32/int64), writing into ``buffers`` (see :func:`new_buffers`; sized for at
    least B*C lookups and B samples). Returns a tuple of arrays (views into ``buffers`` where they are
    lookup-sized):

    ``(popular_samples, non_popular_samples, pop_ids, hot_pos, hot_slot, cold_pos, cold_slot, working_set,
    bad)`` where ``bad`` is per-sample the first out-of-range column (-1 if none); when any is >= 0 the other
    outputs are empty (the first sample with ``bad >= 0`` is the batch's first bad sample; samples after it
    may be unchecked). ``slot_map`` (:func:`new_slot_map`, all -1) is scratch and left all -1. ``chunks``
    overrides :func:`num_chunks` (the result does not depend on it).

    ``fused=True`` classifies as usual (``buffers["is_popular"]``) but returns one micro-batch: every sample
    in the "non-popular" outputs, in batch order (for steps whose cold rows are already on the device).
    """
    B, C = ids.shape
    chunk_start = chunk_bounds(B, chunks)
    K = chunk_start.shape[0] - 1
    counts = np.empty((K, 2), np.int64)
    b = buffers
    bad = b["bad"][:B]
    ahead = max(1, PREFETCH_LOOKUPS // max(C, 1))
    slots, is_popular = b["slots"], b["is_popular"]
    if _lookup_chunks(ids, col_offset, col_size, remap, ahead, chunk_start, slots, is_popular, bad, counts):
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, bad
    pop_samples, pop_ids, np_samples = b["pop_samples"], b["pop_ids"], b["np_samples"]
    hot_pos, hot_slot, cold_pos, cold_fid = b["hot_pos"], b["hot_slot"], b["cold_pos"], b["cold_fid"]
    n_pop, n_np, nh, nc = _write_chunks(
        ids, col_offset, slots, is_popular, fused, chunk_start, counts,
        pop_samples, pop_ids, np_samples, hot_pos, hot_slot, cold_pos, cold_fid,
    )  # fmt: skip
    cold_slot, working_set = b["cold_slot"], b["working_set"]
    if 2 * nc > slot_map.shape[0]:  # more lookups than the table was sized for: one of their size
        slot_map = new_slot_map(nc)
    u = _assign_cold_slots(cold_fid[:nc], slot_map, cold_slot, working_set)
    return (
        pop_samples[:n_pop],
        np_samples[:n_np],
        pop_ids[: n_pop * C],
        hot_pos[:nh],
        hot_slot[:nh],
        cold_pos[:nc],
        cold_slot[:nc],
        working_set[:u],
        bad,
    )


@njit(cache=True, nogil=True)
def _add_counts(ids, col_offset, counts, weight):
    B, C = ids.shape
    for b in range(B):
        for c in range(C):
            v = ids[b, c]
            if v >= 0:  # -1: an empty slot of a padded bag
                counts[v + col_offset[c]] += weight


def add_counts(ids: np.ndarray, col_offset: np.ndarray, counts: np.ndarray, weight: float) -> None:
    """``counts[fused id] += weight`` for every lookup of a checked ``[B, C]`` id batch (column c of table
    offset ``col_offset[c]``); the padding id -1 of variable-length bags is no lookup and is skipped."""
    if ids.ndim != 2 or ids.shape[1] != col_offset.shape[0]:
        raise ValueError(f"ids must be [B, {col_offset.shape[0]}], got {ids.shape}")
    if counts.dtype != np.float64:
        raise ValueError(f"counts must be float64, got {counts.dtype}")
    _add_counts(ids, col_offset, counts, float(weight))
