"""The memory a disk-store checkpoint's load takes beside the run: its hot rows move a chunk at a time, records
move between page buffers without an index of each byte, and the DRAM tier is read at the first step, not
during the load (while the checkpoint's payload is still alive), so the tier ``--cold-cache auto`` sized is
what the resumed run holds; the bitmap of the rows written since a checkpoint is a per-row structure, counted
as one and by the preflight."""

import numpy as np
from arrays import assert_equal_arrays
from test_checkpoint_rows import BOUND, _config, _million_rows

from hotline import Trainer
from hotline.tiers.disk_pages import get_records, put_records
from hotline.training.checkpoint import load_checkpoint, save_checkpoint
from hotline.training.host_memory import per_row_bytes
from hotline.training.preflight import memory_needed, per_row_structures, positions_bytes
from tests.test_placement_memory import _peak as _traced  # fn()'s result and tracemalloc's peak


def test_records_move_between_pages_without_an_index_of_each_byte():
    """Getting or putting U records of R bytes allocates the U x R bytes of the records, not an int64 index of
    each byte (8 x U x R: 2.1 GB for the 2 million hot rows of a 256 MiB hot tier at dim 32)."""
    rng = np.random.default_rng(0)
    record, n = 132, 40_000  # dim 32 + one state float
    buffer = rng.integers(0, 255, n * record + 4096, dtype=np.uint8)
    offsets = np.sort(rng.choice(n, n // 2, replace=False)) * record + 17  # records straddle pages
    expected = np.stack([buffer[o : o + record] for o in offsets])
    got, peak = _traced(lambda: get_records(buffer, offsets, record))
    assert np.array_equal(got, expected)
    assert peak < expected.nbytes + (64 << 10), (peak, expected.nbytes)
    new = rng.standard_normal((offsets.shape[0], record // 4)).astype(np.float32)
    want = buffer.copy()
    for o, r in zip(offsets, new.view(np.uint8)):
        want[o : o + record] = r
    _, peak = _traced(lambda: put_records(buffer, offsets, new))
    assert np.array_equal(buffer, want)
    assert peak < (64 << 10), peak


def test_a_load_moves_the_hot_rows_a_chunk_at_a_time_and_leaves_the_tier_to_the_first_step(
    tmp_path, monkeypatch
):
    """A checkpoint whose hot tier is 30% of 1M rows (10.8 MB of weights and state) loads with a 64 KiB chunk
    allocating (tracemalloc) a few chunks and the digest's blocks: the hot rows go to the file a chunk at a
    time (they once went whole, with an index of each byte: about 9x their bytes). The DRAM tier is not read
    by the load; its rows are read at the first step. The resumed run equals the saved one."""
    ds, placement, cold, cold2 = _million_rows(tmp_path, 0.3, monkeypatch)
    tier = 1 << 20
    tr = Trainer(_config(placement, cold, steps=3, cold_cache=tier), ds)
    try:
        tr.fit()
        hot_bytes = tr.mode.hot_w.numpy().nbytes + tr.mode.hot_s.numpy().nbytes
        save_checkpoint(tr, tmp_path / "step-000000003.pt")
        expected = tr.named_arrays()
    finally:
        tr.close()
    tr = Trainer(_config(placement, cold2, steps=3, cold_cache=tier), ds)
    try:
        f = tr.mode.cold.host.file
        _, peak = _traced(lambda: load_checkpoint(tr, tmp_path / "step-000000003.pt"))
        assert f.cache_rows > 0 and f.cache.size == 0  # the tier: not read by the load
        assert_equal_arrays(expected, tr.named_arrays())
        f.read_rows(np.arange(4))
        assert f.cache.shape[0] == f.cache_rows  # read by the first step's access
    finally:
        tr.close()
    assert hot_bytes > BOUND
    assert peak < BOUND, (peak, hot_bytes)


def test_the_written_rows_bitmap_is_a_per_row_structure_the_preflight_counts(tmp_path):
    """After a checkpoint the disk store's file keeps a bit a row (the rows written since: what the next delta
    writes). ``per_row_bytes`` finds it (an eighth of a byte a row, under the byte a row it looks for
    otherwise) and the preflight's per-row figure, in ``memory_needed``, holds it beside lazy initialization's
    bitmap of the rows not written yet and the held writes' (hotline.tiers.held_rows)."""
    ds, placement, cold, _ = _million_rows(tmp_path, 0.001)
    cfg = _config(placement, cold, steps=2)
    tr = Trainer(cfg, ds)
    try:
        tr.fit()
        before = per_row_bytes(tr.mode, ds.total_rows)
        save_checkpoint(tr, tmp_path / "step-000000002.pt")
        after = per_row_bytes(tr.mode, ds.total_rows)
    finally:
        tr.close()
    bitmap = -(-ds.total_rows // 8)
    new = {k: v for k, v in after.items() if k not in before}
    assert list(new.values()) == [bitmap] and next(iter(new)).endswith("file.written_rows.bits"), new
    stamps = 4 * -(
        -ds.total_rows * tr.mode.cold.host.file.record // 4096
    )  # a page's last write, 4 bytes a page
    # and the pending rows', the held writes'
    assert per_row_structures(cfg, ds) == positions_bytes(cfg, ds) + 3 * bitmap + stamps
    assert memory_needed(cfg, ds) >= per_row_structures(cfg, ds) + (cfg.hbm_budget or 0)
