"""Re-placement's move of rows between the tiers: a new hot set under the same budget, exactly.

Rows that leave the hot tier go to the cold store with their optimizer state, rows that enter come from it,
rows that stay keep their values (in their new slot order); the placement, the dispatcher (its remap and
ring; the online counts carry over) and the hot tier's scratch are rebuilt. Only values move, no arithmetic,
so training stays exact. Runs between two steps, with nothing in flight.
"""

from __future__ import annotations

import numpy as np
import torch

from hotline.dispatch import Dispatcher
from hotline.kernels import sparse_update
from hotline.placement import Placement


def swap_hot_set(mode, hot_rows: np.ndarray) -> dict[str, int]:
    """Makes ``hot_rows`` (fused ids) the hot set of ``mode`` (a :class:`~hotline.tiers.tiered.TieredMode`).
    Returns how many rows were promoted and demoted, and the hot rows now."""
    new = np.unique(np.asarray(hot_rows, dtype=np.int64))
    old, old_slot = mode.hot_rows, mode.fused_remap
    stays = np.isin(new, old)
    leaves = old[~np.isin(old, new)]
    S = mode.optimizer.state_floats_per_row
    hot_w = mode.hot_w.detach().cpu().numpy()
    hot_s = mode.hot_s.detach().cpu().numpy()
    leave_slots = old_slot[leaves].astype(np.int64)
    mode.cold.demote(leaves, hot_w[leave_slots], hot_s[leave_slots] if S else hot_s[:0])
    w = np.empty((new.shape[0], mode.dim), np.float32)
    s = np.zeros(mode.optimizer.state_shape(new.shape[0]), np.float32)
    stay_slots = old_slot[new[stays]].astype(np.int64)
    w[stays] = hot_w[stay_slots]
    enter_w, enter_s = mode.cold.promote(new[~stays])
    w[~stays] = enter_w
    if S:
        s[stays] = hot_s[stay_slots]
        s[~stays] = enter_s
    bounds = mode.layout.bounds()
    per_table = np.split(new, np.searchsorted(new, bounds[1:-1]))
    mode.placement = Placement.from_hot_ids(
        mode.table_sizes,
        [ids - bounds[t] for t, ids in enumerate(per_table)],
        dataset_fingerprint=mode.placement.dataset_fingerprint,
        embedding_dim=mode.placement.embedding_dim,
        bytes_per_row=mode.placement.bytes_per_row,
        hbm_budget_bytes=mode.placement.hbm_budget_bytes,
    )
    counts = mode.dispatcher.counts
    d = mode.dispatcher
    mode.dispatcher = Dispatcher(mode.placement, d.bags, d.max_batch_size, len(d._ring), d.index)
    mode.dispatcher.counts = counts
    mode.fused_remap = mode.dispatcher.row_remap
    mode.hot_rows = mode.placement.fused_hot_ids()
    mode.hot_w = torch.from_numpy(w).to(mode.device)
    mode.hot_s = torch.from_numpy(s).to(mode.device)
    mode._hot_scratch = sparse_update.new_scratch(mode.hot_w.shape[0])
    mode._prep_scratch = sparse_update.new_scratch(mode.hot_w.shape[0])
    return {
        "promoted": int((~stays).sum()),
        "demoted": int(leaves.shape[0]),
        "hot_rows": int(new.shape[0]),
    }
