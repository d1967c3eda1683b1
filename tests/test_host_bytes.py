"""Host memory that grows with the row count: at most 8 bytes a row in all, for the disk store and the memory
store (beside its table and state), measured on the built mode in the middle of a look-ahead run.

Every array reachable from the mode (its stores, file, dispatcher, placement, claim book) is found by walking
its attributes; those of at least a byte a row are the per-row structures. A memory-mapped array is on disk and
counts nothing. The row count is small (a million rows) so the test is quick; the structures are the ones a
204-million-row run makes."""

from __future__ import annotations

import numpy as np
import pytest

from hotline import TrainConfig
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.placement import Placement
from hotline.tiers.build import build_mode
from hotline.training.host_memory import per_row_bytes

TABLES = [400_000, 350_000, 250_000, 40]
ROWS = sum(TABLES)
BATCH = 64
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 8], "top_mlp": [8, 1]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    ds = Dataset(generate(root / "d", 2_000, seed=1, table_sizes=TABLES, zipf=1.2, progress=False))
    sp = ds.train.sparse[:1000]
    hot = [np.unique(sp[:, t].reshape(-1))[:50] for t in range(len(TABLES))]
    placement = Placement.from_hot_ids(TABLES, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8,
                                       bytes_per_row=36)  # fmt: skip
    return ds, placement


def _in_flight(mode, ds, steps: int = 6):
    """The per-row bytes of ``mode`` with ``steps`` steps fetched ahead (their claims in the book)."""
    cold = mode.cold
    batches = np.asarray(ds.train.sparse[: steps * BATCH]).reshape(steps, BATCH, -1, 1)
    with cold.lookahead():
        for step, ids in enumerate(batches):
            ws = mode.dispatcher.split(ids).working_set.copy()
            w = np.empty((ws.shape[0], 8), np.float32)
            s = np.empty(mode.optimizer.state_shape(ws.shape[0]), np.float32)
            cold.fetch(ws, w, s, step=step)
        return per_row_bytes(mode, ROWS, exclude=_tables(cold))


def _tables(cold) -> list:
    host = cold.host
    return [host.w, host.s] if hasattr(host, "w") else []


@pytest.mark.parametrize("store", ["disk", "memory"])
def test_per_row_host_bytes_are_at_most_eight(data, tmp_path, store):
    ds, placement = data
    cold = {"cold_store": "disk", "cold_dir": str(tmp_path), "cold_cache": 0} if store == "disk" else {}
    cfg = TrainConfig(mode="hotline", optimizer="rowwise-adagrad", mini_batch_size=BATCH, lookahead=3,
                      progress=False, **ARCH, **cold)  # fmt: skip
    mode = build_mode(cfg, ds, placement)
    try:
        found = _in_flight(mode, ds)
    finally:
        mode.close()
    total = sum(found.values())

    assert total / ROWS <= 8, found
    # the file's positions are those of the rows outside its ascending run only (tests/test_row_positions.py),
    # not an array of every row; the memory store's dispatcher keeps its int32 remap (row -> hot slot), the disk
    # store's a table of the hot rows (hotline.dispatch.index_for): nothing a row is left there
    assert not any("positions" in p for p in found), found
    if store == "disk":
        # a bit a row: rows not written yet, rows whose write is held (hotline.tiers.held_rows)
        pages = -(-ROWS * 36 // 4096)
        bitmap = {
            "mode.cold.file.pending.bits": -(-ROWS // 8),
            "mode.cold.file.held.marked": -(-ROWS // 8),
            "mode.cold.file._page_stamp": 4 * pages,
        }  # the write that last changed each page
        assert mode.dispatcher.index == "hash" and found == bitmap, found
    else:
        assert any(p.endswith(("remap", "remap.index")) for p in found), found
