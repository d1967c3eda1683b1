"""Row gather and scatter between a host table and a staging buffer, on parallel threads.

These move a step's working set: ``gather_rows`` copies the needed cold rows (and their optimizer state)
out of the host table into a preallocated staging buffer; ``scatter_rows`` writes the updated rows back.
Rows are split into contiguous blocks, one per thread, each row a contiguous memcpy-like inner loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True, nogil=True)
def _gather_rows(table, rows, out):
    D = table.shape[1]
    for i in prange(rows.shape[0]):
        r = rows[i]
        for d in range(D):
            out[i, d] = table[r, d]


@njit(cache=True, parallel=True, nogil=True)
def _scatter_rows(table, rows, src):
    D = table.shape[1]
    for i in prange(rows.shape[0]):
        r = rows[i]
        for d in range(D):
            table[r, d] = src[i, d]


@njit(cache=True, parallel=True, nogil=True)
def _gather_values(values, rows, out):
    for i in prange(rows.shape[0]):
        out[i] = values[rows[i]]


@njit(cache=True, parallel=True, nogil=True)
def _scatter_values(values, rows, src):
    for i in prange(rows.shape[0]):
        values[rows[i]] = src[i]


def _check_index(index: np.ndarray, what: str, name: str, size: int, target: str) -> None:
    """Raises IndexError naming the first entry of ``index`` outside ``[0, size)``.

    The kernels do not bounds-check (Numba does not), so a bad index would read or write outside the
    arrays. One min and one max over ``index`` keep the check O(n) with no Python loop."""
    if index.ndim != 1 or index.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-d integer array, got {index.dtype} {index.shape}")
    if index.shape[0] and (index.min() < 0 or index.max() >= size):
        pos = int(np.flatnonzero((index < 0) | (index >= size))[0])
        raise IndexError(
            f"{what} {index[pos]} at position {pos} of {name} out of range for {target} of {size} rows"
        )


def gather_rows(table: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[:n] = table[rows]`` for 2-D tables or 1-D state arrays; returns the filled view ``out[:n]``."""
    _check_index(rows, "row id", "rows", table.shape[0], "a table")
    n = rows.shape[0]
    if out.shape[0] < n or out.shape[1:] != table.shape[1:]:
        raise ValueError(f"staging buffer {out.shape} too small for {n} rows of shape {table.shape[1:]}")
    if table.ndim == 2:
        _gather_rows(table, rows, out)
    else:
        _gather_values(table, rows, out)
    return out[:n]


def scatter_rows(table: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``table[rows] = src`` (rows must be unique, as a working set is)."""
    _check_index(rows, "row id", "rows", table.shape[0], "a table")
    if src.shape[0] != rows.shape[0] or src.shape[1:] != table.shape[1:]:
        raise ValueError(
            f"{src.shape[0]} source rows of shape {src.shape[1:]} for {rows.shape[0]} table rows"
        )
    if table.ndim == 2:
        _scatter_rows(table, rows, src)
    else:
        _scatter_values(table, rows, src)


@njit(cache=True, parallel=True, nogil=True)
def _copy_rows(dst, dst_rows, src, src_rows):
    D = dst.shape[1]
    for i in prange(dst_rows.shape[0]):
        p = dst_rows[i]
        s = src_rows[i]
        for d in range(D):
            dst[p, d] = src[s, d]


def copy_rows(dst: np.ndarray, dst_rows: np.ndarray, src: np.ndarray, src_rows: np.ndarray) -> None:
    """``dst[dst_rows] = src[src_rows]`` in one parallel pass, with no intermediate copy, for 2-D tables or 1-D
    state arrays (``dst_rows`` distinct)."""
    if dst_rows.shape != src_rows.shape:
        raise ValueError(f"dst_rows {dst_rows.shape} and src_rows {src_rows.shape} must match")
    if dst.shape[1:] != src.shape[1:] or dst.ndim not in (1, 2):
        raise ValueError(f"rows of shape {src.shape[1:]} copied into rows of shape {dst.shape[1:]}")
    _check_index(dst_rows, "row", "dst_rows", dst.shape[0], "the destination")
    _check_index(src_rows, "row", "src_rows", src.shape[0], "the source")
    if dst.ndim == 1:
        dst, src = dst.reshape(-1, 1), src.reshape(-1, 1)
    _copy_rows(dst, dst_rows, src, src_rows)


@njit(cache=True, nogil=True)
def _stale_holders(slots, owners, owner_slots, rows, live_steps, live_rows, mine, theirs, counts, rest, copy,
                   work, state, live_work, live_state):  # fmt: skip
    k = 0
    for j in range(live_steps.shape[0]):  # one holder at a time: its buffers stay put in the inner loop
        step, held, src, src_state = live_steps[j], live_rows[j], live_work[j], live_state[j]
        for i in range(slots.shape[0]):
            if owners[i] != step:
                continue
            p, s = slots[i], owner_slots[i]
            if s < 0 or s >= held.shape[0] or held[s] != rows[p]:
                return -1 - i, 0
            mine[k], theirs[k] = p, s
            k += 1
            if copy:  # forwarded as it is found (the CPU's refresh); a partition only (the GPU path's)
                for d in range(work.shape[1]):
                    work[p, d] = src[s, d]
                for d in range(state.shape[1] if state.shape[0] else 0):
                    state[p, d] = src_state[s, d]
        counts[j] = k
    n_rest = 0
    for i in range(slots.shape[0]):  # the slots no live step holds, in order
        live = False
        for j in range(live_steps.shape[0]):
            live = live or owners[i] == live_steps[j]
        if not live:
            rest[n_rest] = slots[i]
            n_rest += 1
    return k, n_rest


def _as_rows(a: np.ndarray) -> np.ndarray:
    """A view of a table [n, D], a state array [n] or an empty state as rows of a 2-D array."""
    return a.reshape(a.shape[0], -1) if a.size else a.reshape(0, 1)


def _stale(slots, owners, owner_slots, rows, live_steps, live_rows, forward=None):
    """:func:`partition_stale`, and with ``forward`` (``(work, state, live_work, live_state)``, state as rows)
    each held row copied as it is checked: one kernel, so that the CPU's refresh and the GPU path's partition
    check the same way."""
    size = rows.shape[0] if forward is None else min(rows.shape[0], forward[0].shape[0])  # and the buffer
    _check_index(slots, "slot", "slots", size, "the working set")
    if not (slots.shape == owners.shape == owner_slots.shape):
        raise ValueError(
            f"slots {slots.shape}, owners {owners.shape}, owner_slots {owner_slots.shape} must match"
        )
    steps = np.asarray(live_steps, np.int64).reshape(-1)
    if steps.shape[0] != len(live_rows):
        raise ValueError(f"{steps.shape[0]} live steps and {len(live_rows)} working sets")
    if not steps.shape[0] or not slots.shape[0]:
        return [(slots[:0], slots[:0]) for _ in range(steps.shape[0])], slots
    mine, theirs, rest = np.empty_like(slots), np.empty_like(slots), np.empty_like(slots)
    counts = np.zeros(steps.shape[0], np.int64)
    copy = forward is not None
    if forward is None:  # nothing copied: empty buffers of the kernel's types
        none = np.empty((0, 1), np.float32)
        forward = (none, none, (none,) * steps.shape[0], (none,) * steps.shape[0])
    work, state, live_work, live_state = forward
    k, n_rest = _stale_holders(slots, owners, owner_slots, rows, steps, tuple(live_rows), mine, theirs, counts,
                               rest, copy, work, state, tuple(live_work), tuple(live_state))  # fmt: skip
    if k < 0:
        i = -1 - k
        raise RuntimeError(
            f"stale row {rows[slots[i]]} is missing from the working set of step {owners[i]}, which last held it"
        )
    bounds = np.concatenate([[0], counts])
    return [(mine[a:b], theirs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])], rest[:n_rest]


def partition_stale(
    slots: np.ndarray, owners: np.ndarray, owner_slots: np.ndarray, rows: np.ndarray,
    live_steps, live_rows,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:  # fmt: skip
    """Where the look-ahead refresh reads each stale slot ``slots[i]`` of a working set (``rows``: its rows)
    from: the live step ``owners[i]`` that last held it, at ``owner_slots[i]`` of that step's working set
    (``live_rows[j]``: the working set of ``live_steps[j]``), checked to hold the same row; or, where the
    holder is no longer live, where the rows live.

    Returns, for each live step in order, ``(mine, theirs)``: the slots it holds and where in its working set
    (in the order of ``slots``), and the slots left (in order). Raises RuntimeError where a holder's slot does
    not hold its row (forwarding it would copy another row's value)."""
    return _stale(slots, owners, owner_slots, rows, live_steps, live_rows)


def forward_stale(
    work: np.ndarray, state: np.ndarray, slots: np.ndarray, owners: np.ndarray, owner_slots: np.ndarray,
    rows: np.ndarray, live: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[int, np.ndarray]:  # fmt: skip
    """The look-ahead refresh's forwarding on a CPU, with no intermediate copy: each stale slot whose last
    holder is a live step of ``live`` (``(step, work, state, rows)`` of each: its working buffer, state and
    working set) gets that row and its state from the holder's buffer, found and checked as
    :func:`partition_stale` does, in the same pass.

    ``work`` [n, D] and ``state`` ([n], [n, D] or empty: no state) are this step's buffers. Returns how many
    rows were forwarded and the slots left to read from where the rows live (holders no longer live).
    Raises RuntimeError where a holder's slot does not hold its row: the rows before it are copied, the
    caller's step is lost anyway."""
    state2 = _as_rows(state)
    for step, w, s, r in live:
        short = w.shape[0] < r.shape[0] or (state2.shape[0] and s.shape[0] < r.shape[0])
        if short or w.shape[1:] != work.shape[1:] or (state2.shape[0] and s.shape[1:] != state.shape[1:]):
            raise ValueError(
                f"live step {step}'s buffers {w.shape} / {s.shape} do not hold its {r.shape[0]} rows"
                f" of this step's shape {work.shape[1:]} / {state.shape[1:]}"
            )
    forward = (work, state2, [e[1] for e in live], [_as_rows(e[2]) for e in live])
    groups, rest = _stale(
        slots, owners, owner_slots, rows, [e[0] for e in live], [e[3] for e in live], forward
    )
    return sum(int(mine.shape[0]) for mine, _ in groups), rest


@njit(cache=True, nogil=True)
def _assemble_rows(out, hot, hot_pos, hot_slot, work, cold_pos, cold_slot):
    _copy_rows(out, hot_pos, hot, hot_slot)
    _copy_rows(out, cold_pos, work, cold_slot)


def assemble_rows(out, hot, hot_pos, hot_slot, work, cold_pos, cold_slot) -> np.ndarray:
    """``out[hot_pos] = hot[hot_slot]`` and ``out[cold_pos] = work[cold_slot]`` in one parallel pass: the rows
    a micro-batch looks up, from the hot table and the working buffer (positions cover ``out`` at most once;
    rows of padding slots, which no position names, keep what ``out`` holds: zeros, for padded bags)."""
    if hot_pos.shape[0] + cold_pos.shape[0] > out.shape[0]:
        raise ValueError(
            f"{hot_pos.shape[0]} hot + {cold_pos.shape[0]} cold positions for {out.shape[0]} rows"
        )
    if hot_slot.shape != hot_pos.shape or cold_slot.shape != cold_pos.shape:
        raise ValueError(
            f"hot_slot {hot_slot.shape} / cold_slot {cold_slot.shape} must match "
            f"hot_pos {hot_pos.shape} / cold_pos {cold_pos.shape}"
        )
    _check_index(hot_slot, "hot slot", "hot_slot", hot.shape[0], "the hot table")
    _check_index(cold_slot, "working slot", "cold_slot", work.shape[0], "the working buffer")
    _check_index(hot_pos, "position", "hot_pos", out.shape[0], "the output")
    _check_index(cold_pos, "position", "cold_pos", out.shape[0], "the output")
    _assemble_rows(out, hot, hot_pos, hot_slot, work, cold_pos, cold_slot)
    return out
