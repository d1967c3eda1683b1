"""What each rank of the torchrec bridge holds beside its shard of the rows: nothing that grows with the table.

On N ranks a :class:`~hotline.torchrec_bridge.tiered_tables.TieredTables` finds hot slots through a hot table of
the hot rows (``hotline.dispatch.index_for``), not a remap of every row (4 bytes a row on every rank); its other
host structures (the dispatcher's ring and slot map, the claim book, the update's scratch) follow the lookups
and the hot rows. The same tables at 100x the rows: every such structure has the same bytes, and the store holds
this rank's shard (1/N of the rows). One rank keeps the dense remap, the faster split: 4 bytes a row.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torchrec")

from hotline.distributed.comm import Comm  # noqa: E402
from hotline.tiers.sparse_optim import SparseOptimizer  # noqa: E402
from hotline.torchrec_bridge.tiered_tables import TieredTables  # noqa: E402

DIM, HOT = 4, np.array([5, 1, 9, 30, 2])


def _arrays(obj) -> int:
    """Bytes of the numpy arrays among ``obj``'s attributes (one level, lists and dicts of arrays included)."""
    total = 0
    for v in vars(obj).values():
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list | tuple) else [v]
        for a in items:
            if isinstance(a, dict):
                total += sum(x.nbytes for x in a.values() if isinstance(x, np.ndarray))
            elif isinstance(a, np.ndarray):
                total += a.nbytes
    return total


def host_structures(grp: TieredTables) -> int:
    """Bytes of a rank's host structures beside its rows and their state (which are the table itself)."""
    host = grp.store.host
    rows = host.w.nbytes + host.s.nbytes
    return _arrays(grp) + _arrays(grp._dispatcher) + _arrays(grp.store) + _arrays(host) - rows


def tables(rows: int, world: int) -> TieredTables:
    """Two tables of ``rows`` rows each as rank 0 of ``world`` builds them (nothing here is a collective)."""
    weights = np.zeros((2 * rows, DIM), np.float32)
    return TieredTables([rows, rows], DIM, [HOT, HOT[:3]], weights, SparseOptimizer("rowwise-adagrad", 0.1, dim=DIM),
                        Comm(0, world), "cpu", max_lookups=256)  # fmt: skip


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_holds_nothing_that_grows_with_the_rows_but_its_shard(world):
    small, large = tables(1_000, world), tables(100_000, world)
    try:
        assert small._dispatcher.index == large._dispatcher.index == "hash"
        assert host_structures(large) == host_structures(small) > 0
        assert large.store.host.w.shape[0] == len(range(0, 200_000, world))  # the rank's shard of the rows
    finally:
        small.close()
        large.close()


def test_one_rank_keeps_the_dense_remap():
    small, large = tables(1_000, 1), tables(100_000, 1)
    try:
        assert small._dispatcher.index == "dense"
        assert host_structures(large) - host_structures(small) == 4 * 2 * (100_000 - 1_000)
    finally:
        small.close()
        large.close()
