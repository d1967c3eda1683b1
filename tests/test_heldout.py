"""Held-out profiles against what training measures, on data where the in-sample figures are far off.

Many rows per table and a 1% profile sample: most rows the sample touched it touched once, so once the budget
holds every row the sample saw, the in-sample figures say 100% coverage and 100% popular samples. Training
then sees about two thirds coverage. The held-out figures (a disjoint 10% of the same split) must land within
2 percentage points (coverage) and 15% relative (popular share) of what the tiered run counts over the split.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import hotline
from hotline import TrainConfig, Trainer
from hotline.datasets.synthetic import generate

B = 512


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from small_data import write_zipf_dataset

    return write_zipf_dataset(
        tmp_path_factory.mktemp("ds") / "small", 3000, [50, 400, 3, 2000], pooling_factor=2
    )


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    root = tmp_path_factory.mktemp("heldout")
    path = generate(root / "data", 60_000, table_sizes=[300_000] * 4, zipf=1.2, seed=1, progress=False)
    prof = hotline.profile(
        path, sample_fraction=0.01, heldout_fraction=0.1, mini_batch_size=B, embedding_dim=8, progress=False
    )
    return root, path, prof


def _train(path, placement, mode="hotline", lookahead=0) -> dict:
    cfg = TrainConfig(mode=mode, embedding_dim=8, bottom_mlp=[13, 8], top_mlp=[8, 1], mini_batch_size=B,
                      placement_path=str(placement), progress=False, eval_max_samples=512,
                      lookahead=lookahead)  # fmt: skip
    trainer = Trainer(cfg, path)
    try:
        return trainer.fit()
    finally:
        trainer.close()


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_heldout_estimate_matches_training(skewed, share):
    root, path, prof = skewed
    budget = int(prof.num_accessed * share) * prof.bytes_per_row
    summary = prof.summary(budget)
    held = summary["heldout"]
    placement = prof.placement(budget).save(root / f"placement-{share}.npz")
    measured = _train(path, placement)

    # The in-sample figures are clearly off (the ranking graded on its own sample) ...
    assert summary["access_coverage"] - measured["hot_lookup_share"] > 0.10
    assert summary["popular_sample_share"] > 2 * measured["popular_sample_share"]
    # ... the held-out ones are not.
    assert held["samples"] == round(0.1 * len(hotline.Dataset(path).train))
    assert abs(held["access_coverage"] - measured["hot_lookup_share"]) <= 0.02
    rel = (
        abs(held["popular_sample_share"] - measured["popular_sample_share"])
        / measured["popular_sample_share"]
    )
    assert rel <= 0.15
    assert held["unique_cold_rows_per_batch"] == pytest.approx(measured["cold_rows_per_step"], rel=0.1)
    assert measured["cold_bytes_per_step"] == pytest.approx(measured["cold_rows_per_step"] * 32)


def test_summary_of_tiered_runs_carries_what_they_saw(skewed):
    root, path, prof = skewed
    placement = prof.placement(prof.num_accessed * prof.bytes_per_row).save(root / "p-hybrid.npz")
    hybrid = _train(path, placement, mode="hybrid")
    assert hybrid["hot_lookup_share"] == 0.0 and hybrid["popular_sample_share"] == 0.0
    assert hybrid["cold_rows_per_step"] > 0
    k2 = _train(path, placement, lookahead=2)
    k0 = _train(path, placement, lookahead=0)
    for key in ("hot_lookup_share", "popular_sample_share", "cold_rows_per_step"):
        assert k2[key] == k0[key], key  # the same batches, the same placement: the same counts
    device = _train(path, placement, mode="device")
    assert "hot_lookup_share" not in device


def test_heldout_samples_are_disjoint_and_sized():
    p = hotline.Profiler(sample_fraction=0.1, seed=3, progress=False)
    idx = p.sample_indices(1000)
    held = p.heldout_indices(1000, idx, idx.size)
    assert held.size == idx.size and not np.intersect1d(held, idx).size
    assert np.all(np.diff(held) > 0)
    big = hotline.Profiler(sample_fraction=0.7, progress=False)
    idx = big.sample_indices(1000)
    assert big.heldout_indices(1000, idx, idx.size).size == 300  # what is left
    batches = hotline.Profiler(sample_batches=3, mini_batch_size=10, progress=False)
    np.testing.assert_array_equal(batches.heldout_indices(1000, None, 30), np.arange(30, 60))
    assert hotline.Profiler(sample_fraction=1.0).heldout_indices(1000, None, 1000).size == 0
    with pytest.raises(ValueError, match="heldout"):
        hotline.Profiler(heldout="later")


def test_heldout_scan_equals_a_direct_count(small):
    """Every held-out curve column equals a plain numpy computation over the held-out samples."""
    prof = hotline.profile(small.path, sample_fraction=0.2, mini_batch_size=16, seed=2, progress=False)
    h = prof.heldout
    ids = np.asarray(small.train.sparse[h.indices]).reshape(h.num_samples, -1).astype(np.int64)
    offsets = np.repeat(prof.offsets[:-1], small.pooling_factor)
    rank = prof.rank[ids + offsets]
    curve = prof.curve()
    for k, row in zip(curve.hot_rows, curve.itertuples()):
        assert row.heldout_access_coverage == pytest.approx((rank < k).mean())
        assert row.heldout_popular_sample_share == pytest.approx((rank.max(axis=1) < k).mean())
        full = (h.num_samples // 16) * 16
        fused = (ids + offsets)[:full].reshape(-1, 16 * ids.shape[1])
        cold = [np.unique(b[prof.rank[b] >= k]).size for b in fused]
        assert row.heldout_unique_cold_rows_per_batch == pytest.approx(np.mean(cold))
    assert curve.heldout_access_coverage.is_monotonic_increasing


@pytest.mark.parametrize("batches_per_chunk", [1, 2, 7])
@pytest.mark.parametrize("window", [1, 3, 9])
def test_stale_rows_are_those_other_batches_look_up(batches_per_chunk, window):
    """``stale_suffix[k] / num_batches``: the rows of rank >= k one mini-batch shares with ``window`` others,
    averaged over every choice of the mini-batch and of the others (a set-by-set count over all of them);
    chunks split the mini-batches anywhere, a partial last one counts none, and a window wider than the
    mini-batches held out takes all the others."""
    from hotline.profiling.heldout import scan

    rng = np.random.default_rng(batches_per_chunk * 10 + window)
    sizes, bs, n = [30, 8, 50], 6, 6 * 7 + 4  # seven full batches and a partial one
    ids = np.stack([rng.zipf(1.5, (n, 2)) % t for t in sizes], axis=1).astype(np.int64)  # [n, T, L=2]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    A = 40
    rank = np.minimum(rng.permutation(offsets[-1]), A).astype(np.int32)  # rows beyond A: never hot
    step = bs * batches_per_chunk
    chunks = (ids[i : i + step] for i in range(0, n, step))
    _, _, cold, batches, _, stale = scan(chunks, sizes, rank, A, bs, window=window)
    assert batches == 7
    fused = ids + offsets[:-1][None, :, None]
    rows = [set(fused[b * bs : (b + 1) * bs].ravel().tolist()) for b in range(7)]
    w = min(window, 6)
    for k in range(A + 1):
        counts = [
            sum(rank[r] >= k and any(r in rows[o] for o in others) for r in rows[b])
            for b in range(7)
            for others in itertools.combinations([o for o in range(7) if o != b], w)
        ]
        assert stale[k] / batches == pytest.approx(np.mean(counts)), k
        assert stale[k] <= cold[k] + 1e-9
    assert stale[0] > stale[A] > 0  # the case that matters happened: rows shared between batches


def test_fraction_one_falls_back_to_validation(skewed, small):
    _, path, _ = skewed
    prof = hotline.profile(path, sample_fraction=1.0, progress=False)
    assert prof.heldout.split == "val" and prof.heldout.num_samples == len(hotline.Dataset(path).val)
    assert hotline.profile(path, heldout="none", progress=False).heldout is None
    whole = hotline.profile(small.path, sample_fraction=1.0, progress=False)  # no validation split either
    assert whole.heldout is None and whole.summary("1KiB")["heldout"] is None
    assert "heldout_access_coverage" not in whole.curve().columns


def test_profile_json_has_heldout(small, tmp_path, capsys):
    from hotline.cli import main

    out = tmp_path / "p.json"
    assert (
        main(["profile", str(small.path), "--hbm-budget", "4KiB", "--json", str(out), "--no-progress"]) == 0
    )
    text = capsys.readouterr().out
    assert text.index("held-out") < text.index("in-sample")
    held = json.loads(out.read_text())["heldout"]
    for key in ("access_coverage", "popular_sample_share", "unique_cold_rows_per_batch"):
        assert 0 <= held[key] and np.isfinite(held[key])
    assert held["access_coverage"] <= 1 and held["popular_sample_share"] <= 1


def test_epoch_estimate_mixes_in_the_profiled_samples(skewed):
    """A quarter of the split profiled: an epoch trains those samples too, at their in-sample figures. The
    epoch estimate (in-sample on that quarter, held-out on the rest) is what training counts."""
    root, path, _ = skewed
    prof = hotline.profile(path, sample_fraction=0.25, mini_batch_size=B, embedding_dim=8, progress=False)
    budget = prof.num_accessed * prof.bytes_per_row // 2
    held = prof.summary(budget)["heldout"]
    epoch = held["epoch_estimate"]
    assert epoch["profiled_share_of_split"] == pytest.approx(0.25, abs=1e-3)
    measured = _train(path, prof.placement(budget).save(root / "p-quarter.npz"))
    assert abs(epoch["access_coverage"] - measured["hot_lookup_share"]) <= 0.01
    assert epoch["popular_sample_share"] == pytest.approx(measured["popular_sample_share"], rel=0.1)
    # the held-out figure alone describes unseen data: here below what the epoch counts
    assert held["popular_sample_share"] < 0.9 * measured["popular_sample_share"]
