"""Host memory that grows with the row count, for the whole machine: at most 8 bytes a row in all on one rank
and on two (each rank holds its shard's structures and a hot table sized by the hot rows, not a remap of every
row), one-hot and padded bags (one padded remap, never a second copy), disk and memory stores; and start-up
reads the profiled sample of the training split once when the placement is profiled (``--hbm-budget``).

Sizes are asserted, never times: the structures are found by walking the built mode's attributes
(:func:`hotline.training.host_memory.per_row_bytes`) in the middle of a look-ahead run, as tests/test_host_bytes.py
does for one-hot bags on one rank."""

from __future__ import annotations

import json
import mmap
import os

import numpy as np
import pytest
import ranks

from hotline import TrainConfig
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.placement import Placement
from hotline.tiers.build import build_mode
from hotline.training.host_memory import per_row_bytes

TABLES = [400_000, 350_000, 250_000, 40]
ROWS = sum(TABLES)
BAGS = [3, 2, 1, 1]
BATCH, STEPS = 64, 6
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 8], "top_mlp": [8, 1]}
ALLOWANCE = 4 * len(TABLES)
"""Bytes beyond 8 a row: a padded remap's one padding entry a table."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    out = {}
    for bags, kw in (("one-hot", {}), ("padded", {"bag_sizes": BAGS, "variable_bags": True})):
        ds = Dataset(generate(root / bags, 2_000, seed=1, table_sizes=TABLES, zipf=1.2, progress=False, **kw))
        sp = np.asarray(ds.train.sparse[:1000])
        cols = np.asarray(ds.bags.col_table)
        hot = [np.unique(sp[:, cols == t][sp[:, cols == t] >= 0])[:50] for t in range(len(TABLES))]
        placement = Placement.from_hot_ids(TABLES, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8,
                                           bytes_per_row=36)  # fmt: skip
        out[bags] = (str(ds.path), placement)
    return out


def _config(store: str, cold_dir, **extra) -> TrainConfig:
    os.makedirs(cold_dir, exist_ok=True)
    cold = {"cold_store": "disk", "cold_dir": cold_dir, "cold_cache": 0} if store == "disk" else {}
    return TrainConfig(mode="hotline", optimizer="rowwise-adagrad", mini_batch_size=BATCH, lookahead=3,
                       progress=False, **ARCH, **cold, **extra)  # fmt: skip


def _measure(comm, cfg: TrainConfig, path: str, placement: Placement, out: str | None = None) -> dict:
    """This rank's per-row structures with ``STEPS`` steps fetched ahead (their claims in the book); written
    to ``out`` (.json, one per rank) when given."""
    ds = Dataset(path)
    N, r = (1, 0) if comm is None else (comm.world_size, comm.rank)
    mode = build_mode(cfg, ds, placement, comm)
    try:
        cold = mode.cold
        sparse = np.asarray(ds.train.sparse[: STEPS * BATCH])
        with cold.lookahead():
            for step in range(STEPS):
                ids = sparse[step * BATCH : (step + 1) * BATCH][r::N]
                ws = mode.dispatcher.split(ids).working_set.copy()
                w = np.empty((ws.shape[0], 8), np.float32)
                s = np.empty(mode.optimizer.state_shape(ws.shape[0]), np.float32)
                cold.fetch(ws, w, s, step=step)
            host = getattr(cold, "host", None)
            tables = [host.w, host.s] if hasattr(host, "w") else []  # a memory store's rows and state
            found = per_row_bytes(mode, ROWS // N, exclude=tables)  # a rank's 1-byte-a-row array counts too
    finally:
        mode.close()
    if out is not None:
        with open(out, "w") as f:
            json.dump(found, f)
    return found


@pytest.mark.parametrize("bags", ["one-hot", "padded"])
@pytest.mark.parametrize("store", ["disk", "memory"])
def test_one_rank_holds_at_most_eight_bytes_a_row(data, tmp_path, store, bags):
    path, placement = data[bags]
    found = _measure(None, _config(store, str(tmp_path)), path, placement)
    assert sum(found.values()) <= 8 * ROWS + ALLOWANCE, found
    # one rank keeps the dense remap (the faster split) with the rows in memory, padded or not one copy of it;
    # with the rows on disk a hot table of the hot rows (hotline.dispatch.index_for), a bit a row (pending, held
    # writes: hotline.tiers.held_rows) and 4 bytes a page (the write that last changed it)
    remaps = [p for p in found if "remap" in p]
    if store == "disk":
        pages = [p for p in found if p.endswith("file._page_stamp")]  # 4 bytes a page
        assert len(found) == 3 and len(pages) == 1 and found[pages[0]] <= ROWS // 2, found
        bits = [v for p, v in found.items() if p.endswith(("pending.bits", "held.marked"))]
        assert bits == [-(-ROWS // 8)] * 2, found
    else:
        assert len(remaps) == 1 and found[remaps[0]] <= 4 * ROWS + ALLOWANCE, found


@pytest.mark.parametrize("bags", ["one-hot", "padded"])
@pytest.mark.parametrize("store", ["disk", "memory"])
def test_two_ranks_hold_at_most_eight_bytes_a_row_together(data, tmp_path, store, bags):
    path, placement = data[bags]
    outs = [str(tmp_path / f"rank{r}.json") for r in range(2)]
    cfg = _config(store, str(tmp_path / "cold"))

    ranks.spawn(2, _rank_measure, cfg, path, placement, outs)
    found = [json.load(open(o)) for o in outs]
    total = sum(sum(f.values()) for f in found)
    assert total <= 8 * ROWS + ALLOWANCE, found
    for f in found:  # no rank holds a remap of every row: the hot table is sized by the hot rows
        assert not any("remap" in p for p in f), f


def _rank_measure(comm, cfg, path, placement, outs):
    _measure(comm, cfg, path, placement, outs[comm.rank])


class _CountedReads:
    """The training split's sparse file, counting how many times each sample is read (the real reads)."""

    def __init__(self, sparse):
        self.sparse = sparse
        self.reads = np.zeros(sparse.shape[0], np.int64)

    def __getitem__(self, rows):
        out = self.sparse[rows]
        picked = np.arange(self.sparse.shape[0])[rows]
        np.add.at(self.reads, picked, 1)
        return out

    def __getattr__(self, name):
        return getattr(self.sparse, name)


@pytest.mark.parametrize("bags", ["one-hot", "padded"])
def test_start_up_reads_the_profiled_sample_once(data, tmp_path, bags):
    from hotline.profiling.profiler import Profiler
    from hotline.training.placing import placement_for

    ds = Dataset(data[bags][0])
    cfg = _config("disk", str(tmp_path / "a"), hbm_budget=64 << 10)
    counted = ds.train.sparse = _CountedReads(ds.train.sparse)
    placement = placement_for(cfg, ds, progress=False)
    mode = build_mode(cfg, ds, placement)
    order = np.array(mode.cold.file.order)
    mode.close()
    profiler = Profiler(embedding_dim=8, optimizer="rowwise-adagrad", mini_batch_size=BATCH, seed=cfg.seed)
    sampled = profiler.sample_indices(len(ds.train))
    assert sampled is not None and counted.reads[sampled].tolist() == [1] * sampled.shape[0]
    assert counted.reads.max() == 1  # the held-out sample is another one, read once too
    assert placement.sample_order is None  # taken by start-up, not kept for the run
    # the disk file's order from the profile's counts is the one the counting pass alone makes
    loaded = Placement.load(placement.save(tmp_path / "p.npz"))
    again = build_mode(_config("disk", str(tmp_path / "b")), Dataset(data[bags][0]), loaded)
    try:
        assert np.array_equal(np.array(again.cold.file.order), order)
    finally:
        again.close()


def test_per_row_bytes_counts_huge_page_arrays_not_mapped_files(tmp_path):
    from hotline._malloc import huge_zeros

    rows = 2 << 20
    anon = huge_zeros(rows, np.int32)  # 8 MiB: an anonymous mapping of its own (memory, as a remap at scale)
    owner = anon
    while isinstance(owner, np.ndarray):
        owner = owner.base
    assert owner is not None and not isinstance(owner, mmap.mmap)  # a buffer over the mapping, not a file's
    mapped = np.lib.format.open_memmap(tmp_path / "m.npy", "w+", np.int32, (rows,))  # on disk
    found = per_row_bytes({"anon": anon, "mapped": mapped, "view": np.asarray(mapped)[1:]}, rows)
    assert found == {"mode['anon']": 4 * rows}
