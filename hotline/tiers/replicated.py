"""Rows replicated on every rank (the hot tier; every table in ``device`` mode) and their sparse gradients.

Each rank coalesces the gradients of its lookups per row, the ranks all-gather those (row, gradient) pairs,
and every replica runs the same sparse update on the same concatenation (rank order): the touched set is the
union over ranks, each row is updated once with the sum of all ranks' gradients, and the replicas stay
bit-identical. With one rank there is nothing to exchange and the update reads the lookups directly.
"""

from __future__ import annotations

import torch

from hotline.distributed.comm import Comm


def coalesce(ids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct ``ids`` (sorted) and the summed gradient of each: what a rank contributes to a sparse update."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    summed = torch.zeros((uniq.shape[0], grads.shape[1]), dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, inverse, grads)
    return uniq, summed


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

    The ids travel bit for bit inside the float payload (an int64 is two float32 words; nothing adds them)."""
    if ids:
        uniq, summed = coalesce(torch.cat(ids), torch.cat(grads))
    else:
        uniq = torch.zeros(0, dtype=torch.int64, device=device)
        summed = torch.zeros((0, dim), dtype=torch.float32, device=device)
    packed = torch.cat([uniq.contiguous().view(torch.float32).view(-1, 2), summed], dim=1)
    parts = comm.all_gather_varlen(packed, kind)
    allp = torch.cat(parts) if len(parts) > 1 else parts[0]
    return allp[:, :2].contiguous().view(torch.int64).view(-1), allp[:, 2:].contiguous()
