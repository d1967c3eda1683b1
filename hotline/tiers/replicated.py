"""Rows replicated on every rank (the hot tier; every table in ``device`` mode) and their sparse gradients.

Each rank sums the gradients of its lookups per row, the ranks all-gather those (row, gradient) pairs, and
every replica runs the same sparse update on the same concatenation (rank order): the touched set is the
union over ranks, each row is updated once with the sum of all ranks' gradients. With one rank there is
nothing to exchange and the update reads the lookups directly.

:func:`update_replicas` is the step's exchange and update. Off the CPU (``torch_update``) it reads nothing
back from the device: a rank's distinct rows come from the host (the dispatcher's, found while the batch was
prepared) or from a sort on the device (one slot per lookup); the row counts travel over the host group
(``Comm.all_gather_sizes``; under look-ahead, ahead, on the look-ahead thread), the payload where it lives; the
rows of every rank are summed in rank order (:func:`sum_in_rank_order`, one pass per rank in which each row
receives one gradient at most, and zeros that add exactly nothing), so every replica computes the same bits
whatever order the device's atomic adds take.
tests/test_replicated.py checks the bits across ranks and, on fake CUDA tensors, that nothing is read back.
"""

from __future__ import annotations

import numpy as np
import torch

from hotline.distributed.comm import Comm
from hotline.tiers.sparse_optim import SparseOptimizer


def coalesce(ids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct ``ids`` (sorted) and the summed gradient of each: what a rank contributes to a sparse update
    (``torch.unique``: on CUDA it waits for the device; :func:`local_sums` does not)."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    summed = torch.zeros((uniq.shape[0], grads.shape[1]), dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, inverse, grads)
    return uniq, summed


def _runs(sorted_ids: torch.Tensor) -> torch.Tensor:
    """The run of equal ids each entry of ``sorted_ids`` belongs to, 0..U-1 (no read back)."""
    first = torch.ones(sorted_ids.shape[0], dtype=torch.bool, device=sorted_ids.device)
    torch.ne(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    return torch.cumsum(first, 0) - 1


def local_sums(
    ids: torch.Tensor, grads: torch.Tensor, distinct: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (rows, summed gradients) without reading anything back from the device.

    ``distinct``: the distinct rows and each lookup's index into them, found on the host (their count is
    then known ahead). Without it the ``n`` lookups are sorted on the device and the result has ``n`` slots:
    slot ``k < U`` holds distinct row ``k`` and its sum, a slot ``k >= U`` a row among those with a zero
    gradient (which adds exactly nothing)."""
    D = grads.shape[1]
    if distinct is not None:
        rows, inverse = distinct
        summed = torch.zeros((rows.shape[0], D), dtype=grads.dtype, device=grads.device)
        return rows, summed.index_add_(0, inverse, grads)
    sorted_ids, order = torch.sort(ids, stable=True)
    number = _runs(sorted_ids)
    inverse = torch.empty_like(number).index_copy_(0, order, number)
    summed = torch.zeros((ids.shape[0], D), dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, inverse, grads)
    return sorted_ids.clone().index_copy_(0, number, sorted_ids), summed


def sum_in_rank_order(
    ids: torch.Tensor, grads: torch.Tensor, sizes: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's (row, gradient) pairs, concatenated in rank order (``sizes[r]`` pairs from rank r), summed
    per row in rank order: the same bits on every device and every run, read back nothing.

    Returns ``(sorted_ids, number, gsum)``: the ids sorted (stable), the distinct row of each (0..U-1), and
    ``gsum`` [n, D] whose row ``k < U`` is distinct row ``k``'s sum (rows ``>= U`` zero). Pass r adds rank r's
    gradients with one ``index_add_``: a row gets at most one nonzero addend in a pass (a rank's rows are
    distinct, or its extra slots carry zeros) and ``x + 0 == x``, so no order of the device's atomic adds
    can change a bit."""
    sorted_ids, order = torch.sort(ids, stable=True)
    number = _runs(sorted_ids)
    source = torch.cat(
        [torch.full((s,), r, dtype=torch.int32, device=ids.device) for r, s in enumerate(sizes)]
    )
    source, g = source.index_select(0, order), grads.index_select(0, order)
    gsum = torch.zeros_like(g)
    for r, s in enumerate(sizes):
        if s:
            gsum.index_add_(0, number, torch.where((source == r)[:, None], g, 0.0))
    return sorted_ids, number, gsum


def apply_in_rank_order(
    optimizer: SparseOptimizer,
    table: torch.Tensor,
    state: torch.Tensor,
    ids: torch.Tensor,
    grads: torch.Tensor,
    sizes: list[int],
) -> None:
    """The torch update of ``table`` by every rank's (row, gradient) pairs (:func:`sum_in_rank_order`): each
    distinct row once, bit-identical on every replica, nothing read back (as ``SparseOptimizer.step_sorted``
    lays out its slots)."""
    sorted_ids, number, gsum = sum_in_rank_order(ids, grads, sizes)
    if optimizer.kind == "adam":  # every slot of a row carries its sum and writes the same values
        optimizer._adam_torch(table, state, sorted_ids, gsum.index_select(0, number), duplicates=True)
        return
    rows = sorted_ids.clone().index_copy_(0, number, sorted_ids)  # slots >= U: a row among them, zero sum
    optimizer._apply_torch(table, state, rows, gsum)


def exchange(
    comm: Comm, rows: torch.Tensor, summed: torch.Tensor, kind: str, sizes: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Every rank's (rows, summed gradients), concatenated in rank order, and the count from each rank
    (``sizes``: those counts, exchanged ahead; else exchanged here first).

    The ids travel bit for bit inside the float payload (an int64 is two float32 words; nothing adds them)."""
    packed = torch.cat([rows.contiguous().view(torch.float32).view(-1, 2), summed], dim=1)
    parts = comm.all_gather_varlen(packed, kind, sizes)
    allp = torch.cat(parts) if len(parts) > 1 else parts[0]
    sizes = [int(p.shape[0]) for p in parts]  # shapes: host-side facts
    return allp[:, :2].contiguous().view(torch.int64).view(-1), allp[:, 2:].contiguous(), sizes


def all_ranks_gradients(
    comm: Comm,
    ids: list[torch.Tensor],
    grads: list[torch.Tensor],
    dim: int,
    kind: str,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's coalesced (row, gradient) pairs of a replicated table, concatenated in rank order, on
    ``device`` (the table's: a rank with no lookups, an empty batch shard, still takes part from there).
    Coalesces with :func:`coalesce` (the torchrec bridge's path); the training modes use :func:`update_replicas`."""
    if ids:
        uniq, summed = coalesce(torch.cat(ids), torch.cat(grads))
    else:
        uniq = torch.zeros(0, dtype=torch.int64, device=device)
        summed = torch.zeros((0, dim), dtype=torch.float32, device=device)
    all_ids, all_grads, _ = exchange(comm, uniq, summed, kind)
    return all_ids, all_grads


def update_replicas(
    comm: Comm,
    optimizer: SparseOptimizer,
    table: torch.Tensor,
    state: torch.Tensor,
    ids: list[torch.Tensor],
    grads: list[torch.Tensor],
    kind: str,
    distinct: tuple[torch.Tensor, torch.Tensor] | None = None,
    torch_update: bool | None = None,
    scratch: np.ndarray | None = None,
    sizes: list[int] | None = None,
) -> int | None:
    """ONE update of a replicated ``table`` (and ``state``) by every rank's lookups: ``ids`` / ``grads`` are
    this rank's (lists, concatenated in order; empty for a rank without lookups, which still takes part).

    ``torch_update`` (default: off the CPU): the update as torch ops that read nothing back, the same bits
    on every replica (see the module docstring); ``distinct``: this rank's distinct rows and the lookups'
    inverse, found on the host. Otherwise (the CPU): each rank's distinct rows by ``torch.unique`` and the
    Numba kernel over the concatenation (``scratch``: its reusable scratch). ``sizes``: every rank's count
    of rows it sends (its distinct rows; its lookups on the torch path without ``distinct``), exchanged ahead
    (by the look-ahead thread): the step then runs no collective of sizes. Returns the
    rows updated on the CPU path; on the torch path their count would be a read back: this rank's distinct
    rows when ``distinct`` is given, else None."""
    if torch_update is None:
        torch_update = table.device.type != "cpu"
    D, device = table.shape[1], table.device
    if ids:
        cat_ids, cat_grads = torch.cat(ids), torch.cat(grads)
        if torch_update:
            rows, summed = local_sums(cat_ids, cat_grads, distinct)
        else:
            rows, summed = coalesce(cat_ids, cat_grads)
    else:
        rows = torch.zeros(0, dtype=torch.int64, device=device)
        summed = torch.zeros((0, D), dtype=torch.float32, device=device)
    all_ids, all_grads, sizes = exchange(comm, rows, summed, kind, sizes)
    if not torch_update:
        return optimizer.step(table, state, all_ids, all_grads, scratch) if sum(sizes) else 0
    if sum(sizes):
        apply_in_rank_order(optimizer, table, state, all_ids, all_grads, sizes)
    if distinct is not None:
        return int(distinct[0].shape[0]) if ids else 0
    return None
