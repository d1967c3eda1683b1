"""Placement: remap arrays, greedy choice under a budget vs brute force, files, fingerprints, size parsing."""

from __future__ import annotations

import itertools
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotline.datasets.format import Dataset, DatasetWriter
from hotline.placement import FORMAT_TAG, FORMAT_WITH_REMAPS, Placement, PlacementError, bytes_per_row_for
from hotline.profiling import Profile, Profiler
from hotline.units import format_size, parse_size


def write_dataset(out, table_sizes, n=20, seed=0):
    rng = np.random.default_rng(seed)
    with DatasetWriter(out, table_sizes) as w:
        _, sparse, _ = w.create_split("train", n)
        for t, size in enumerate(table_sizes):
            sparse[:, t, 0] = rng.integers(0, size, n)
        w.finish(source={"kind": "test", "seed": seed})
    return Dataset(out)


def profile_from_counts(counts_per_table, embedding_dim=1, optimizer="sgd") -> Profile:
    """A Profile made straight from counts (the ranking and placement need nothing else)."""
    sizes = [len(c) for c in counts_per_table]
    counts = np.concatenate([np.asarray(c, dtype=np.int64) for c in counts_per_table])
    profiler = Profiler(embedding_dim=embedding_dim, optimizer=optimizer, progress=False)
    return Profile(
        counts=counts,
        table_sizes=sizes,
        num_samples=max(1, int(counts.max(initial=0))),
        pooling_factor=1,
        profiler=profiler,
    )


# ---------------------------------------------------------------- the Placement object


def test_from_hot_ids_builds_remaps_offsets_and_fused_remap():
    p = Placement.from_hot_ids(
        [4, 3, 5], [np.array([2, 0]), np.array([], dtype=np.int64), np.array([4])], embedding_dim=8
    )
    assert p.num_hot == 3 and p.bytes_per_row == 32 and p.hot_bytes == 96 and p.hbm_budget_bytes == 96
    assert p.remap[0].tolist() == [1, -1, 0, -1] and p.remap[0].dtype == np.int32
    assert p.remap[1].tolist() == [-1, -1, -1] and p.remap[2].tolist() == [-1, -1, -1, -1, 0]
    assert p.hot_offsets.tolist() == [0, 2, 2, 3] and p.hot_offsets.dtype == np.int64
    assert all(h.dtype == np.int64 for h in p.hot_ids)
    fused = p.fused_remap()
    assert fused.dtype == np.int32 and fused.tolist() == [1, -1, 0, -1, -1, -1, -1, -1, -1, -1, -1, 2]


def test_all_cold_and_all_hot():
    cold = Placement.all_cold([3, 2])
    assert cold.num_hot == 0 and cold.hbm_budget_bytes == 0 and (cold.fused_remap() == -1).all()
    hot = Placement.all_hot([3, 2], embedding_dim=4, bytes_per_row=20)
    assert hot.num_hot == 5 and hot.hot_bytes == 100 and hot.fused_remap().tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "sizes, ids, match",
    [
        ([3], [[3]], r"\[0, 3\)"),
        ([3], [[1, 1]], "duplicates"),
        ([3, 2], [[0]], "2 tables"),
        ([3], [np.array([0.5])], "integer"),
    ],
)
def test_from_hot_ids_rejects_bad_ids(sizes, ids, match):
    with pytest.raises(PlacementError, match=match):
        Placement.from_hot_ids(sizes, [np.asarray(i) for i in ids])


def test_bytes_per_row():
    assert bytes_per_row_for(16, "sgd") == 64 and bytes_per_row_for(16, "rowwise-adagrad") == 68
    assert bytes_per_row_for(16, "adagrad") == 4 * 32 and bytes_per_row_for(16, "adam") == 4 * 49
    with pytest.raises(ValueError, match="optimizer"):
        bytes_per_row_for(16, "lamb")


# ---------------------------------------------------------------- greedy placement


def brute_force_best(counts_per_table, k):
    """Max total count over every set of at most k accessed rows, and the set the tie-break rule picks."""
    rows = [(c, t, r) for t, cs in enumerate(counts_per_table) for r, c in enumerate(cs) if c > 0]
    best = 0
    for size in range(min(k, len(rows)) + 1):
        for subset in itertools.combinations(rows, size):
            best = max(best, sum(c for c, _, _ in subset))
    ranked = sorted(rows, key=lambda x: (-x[0], x[1], x[2]))[:k]
    return best, ranked


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), min_size=1, max_size=3), st.integers(0, 9)
)
def test_greedy_placement_matches_brute_force(counts_per_table, k):
    prof = profile_from_counts(counts_per_table)
    placement = prof.placement(k * prof.bytes_per_row)
    best, ranked = brute_force_best(counts_per_table, k)
    hot_counts = sum(counts_per_table[t][int(r)] for t, ids in enumerate(placement.hot_ids) for r in ids)
    assert hot_counts == best
    assert placement.num_hot == len(ranked) <= k
    for t in range(len(counts_per_table)):
        # slot order within a table is rank order
        assert placement.hot_ids[t].tolist() == [r for _, tt, r in ranked if tt == t]
    assert all(counts_per_table[t][int(r)] > 0 for t, ids in enumerate(placement.hot_ids) for r in ids)


def test_budgets_of_zero_one_row_and_more_than_all_rows():
    prof = profile_from_counts([[0, 5, 1], [5, 0], [2, 2, 9]], embedding_dim=4, optimizer="rowwise-adagrad")
    bpr = 20
    assert prof.placement(0).num_hot == 0
    assert prof.placement(bpr - 1).num_hot == 0
    one = prof.placement(bpr)
    assert one.num_hot == 1 and one.hot_ids[2].tolist() == [2]
    two = prof.placement(3 * bpr)  # the tie 5 == 5 goes to the lower table first
    assert [h.tolist() for h in two.hot_ids] == [[1], [0], [2]]
    everything = prof.placement("1GiB")
    assert everything.num_hot == 6  # the 2 rows never accessed stay cold
    assert [h.tolist() for h in everything.hot_ids] == [[1, 2], [0], [2, 0, 1]]
    assert everything.hbm_budget_bytes == 2**30 and everything.hot_bytes == 6 * bpr


def test_always_hot_tables_are_ranked_first_and_must_fit():
    prof = profile_from_counts([[9, 8], [0, 1, 3], [7]])
    p = prof.placement(4 * prof.bytes_per_row, always_hot=[1])
    assert [h.tolist() for h in p.hot_ids] == [
        [0],
        [2, 1, 0],
        [],
    ]  # never-accessed rows of a pinned table last
    with pytest.raises(PlacementError, match=r"always-hot tables \[1\] have 3 rows .* holds \(2 rows\)"):
        prof.placement(2 * prof.bytes_per_row, always_hot=[1])
    with pytest.raises(PlacementError, match="table 3 does not exist"):
        prof.placement("1MiB", always_hot=[3])


def test_a_profile_from_counts_alone_refuses_sample_figures():
    prof = profile_from_counts([[1, 2], [3]])
    assert "samples=3" in repr(prof)
    with pytest.raises(ValueError, match="counts alone"):
        prof.curve()
    with pytest.raises(ValueError, match="counts alone"):
        prof.evaluate(prof.placement(0))


# ---------------------------------------------------------------- files and fingerprints


def test_save_load_round_trip_and_fingerprint_refusal(tmp_path):
    ds = write_dataset(tmp_path / "a", [6, 4])
    other = write_dataset(tmp_path / "b", [6, 4], n=21)
    p = Placement.from_hot_ids(
        ds.table_sizes,
        [np.array([5, 1]), np.array([3])],
        dataset_fingerprint=ds.fingerprint,
        embedding_dim=16,
        bytes_per_row=68,
        hbm_budget_bytes=1000,
    )
    path = p.save(tmp_path / "placement.npz")
    q = Placement.load(path, ds)
    assert q.table_sizes == [6, 4] and q.dataset_fingerprint == ds.fingerprint
    assert (q.bytes_per_row, q.embedding_dim, q.hbm_budget_bytes) == (68, 16, 1000)
    for a, b in zip(p.hot_ids + list(p.remap), q.hot_ids + list(q.remap), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    np.testing.assert_array_equal(q.hot_offsets, p.hot_offsets)
    with np.load(path, allow_pickle=False) as z:  # plain arrays, readable without Hotline; no remaps stored
        assert z["hot_ids_0"].tolist() == [5, 1] and not [n for n in z.files if n.startswith("remap")]
    with pytest.raises(PlacementError) as e:
        Placement.load(path, other)
    assert (
        ds.fingerprint in str(e.value)
        and other.fingerprint in str(e.value)
        and "placement.npz" in str(e.value)
    )
    with pytest.raises(PlacementError, match="fingerprint"):
        q.check_dataset(other)
    resized = write_dataset(tmp_path / "c", [6, 5])
    with pytest.raises(PlacementError):
        Placement.load(path, resized)


def test_file_grows_with_the_hot_rows_not_the_row_count_and_the_first_format_loads(tmp_path):
    ids = [np.array([7, 3, 900]), np.array([2])]
    small = Placement.from_hot_ids([1000, 10], ids).save(tmp_path / "small.npz")
    big = Placement.from_hot_ids([50_000_000, 10], ids).save(tmp_path / "big.npz")
    assert abs(big.stat().st_size - small.stat().st_size) < 64  # a remap would be 200 MB (int32 a row)
    # the first format stored each table's remap too: it still loads, to the same placement
    with np.load(small, allow_pickle=False) as z:
        arrays = {n: z[n] for n in z.files}
    want = Placement.load(small)
    arrays.update(format=np.array(FORMAT_WITH_REMAPS), remap_0=want.remap[0], remap_1=want.remap[1])
    np.savez(tmp_path / "first.npz", **arrays)
    got = Placement.load(tmp_path / "first.npz")
    for a, b in zip(want.hot_ids + list(want.remap), got.hot_ids + list(got.remap), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_corrupt_truncated_and_foreign_files_are_refused(tmp_path):
    p = Placement.from_hot_ids([6, 4], [np.array([5, 1]), np.array([3])])
    path = p.save(tmp_path / "good.npz")
    data = path.read_bytes()
    cases = {
        "truncated.npz": data[: len(data) // 2],
        "garbage.npz": b"not a zip file at all",
        "empty.npz": b"",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(PlacementError, match=name):
            Placement.load(tmp_path / name)
    np.savez(tmp_path / "foreign.npz", x=np.arange(3))
    with pytest.raises(PlacementError, match="foreign.npz"):
        Placement.load(tmp_path / "foreign.npz")
    # A file of the first format (remaps stored) whose remap disagrees with its hot ids
    with zipfile.ZipFile(path) as z:
        arrays = {n[:-4]: np.load(z.open(n), allow_pickle=False) for n in z.namelist()}
    arrays["format"] = np.array(FORMAT_WITH_REMAPS)
    arrays["remap_0"] = p.remap[0]
    arrays["remap_1"] = np.array([-1, -1, -1, -1], dtype=np.int32)
    np.savez(tmp_path / "inconsistent.npz", **arrays)
    with pytest.raises(PlacementError, match="inconsistent.npz.*remap does not match"):
        Placement.load(tmp_path / "inconsistent.npz")
    # Hot ids the remaps would be made from, duplicated or out of range
    for name, ids in {"dup.npz": [5, 5], "range.npz": [6, 1]}.items():
        np.savez(tmp_path / name, **{**arrays, "format": np.array(FORMAT_TAG), "hot_ids_0": np.array(ids)})
        with pytest.raises(PlacementError, match=f"{name}.*table 0: hot ids"):
            Placement.load(tmp_path / name)
    with pytest.raises(PlacementError, match="does not exist"):
        Placement.load(tmp_path / "missing.npz")


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text, expect",
    [
        ("256MiB", 256 * 2**20),
        ("256mib", 256 * 2**20),
        ("2 GiB", 2 * 2**30),
        ("1.5KiB", 1536),
        ("4096", 4096),
        ("4096B", 4096),
        ("1GB", 10**9),
        ("0.1GB", 10**8),
        ("3kb", 3000),
        ("7MB", 7 * 10**6),
        ("1TiB", 2**40),
        ("0", 0),
        (".5KiB", 512),
        (12, 12),
    ],
)
def test_parse_size(text, expect):
    assert parse_size(text) == expect


@pytest.mark.parametrize("text", ["", "MiB", "-1", "12 parsecs", "1e9", "1.2.3GB", "0x10", True, -5])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size():
    assert format_size(0) == "0 B" and format_size(1023) == "1023 B"
    assert format_size(1536) == "1.5 KiB" and format_size(256 * 2**20) == "256 MiB"
    assert format_size(3 * 2**30 + 2**29) == "3.5 GiB"
    assert parse_size(format_size(256 * 2**20).replace(" ", "")) == 256 * 2**20


def test_fused_hot_ids_follow_hot_slot_order():
    p = Placement.from_hot_ids([4, 3, 5], [np.array([2, 0]), np.zeros(0, np.int64), np.array([4])])
    assert p.fused_hot_ids().tolist() == [2, 0, 11]  # table 2 starts at fused row 7
    remap = p.fused_remap()
    assert [remap[r] for r in p.fused_hot_ids()] == [0, 1, 2]
    assert Placement.all_cold([3]).fused_hot_ids().shape == (0,)
