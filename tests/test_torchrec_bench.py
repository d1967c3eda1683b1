"""The torchrec benchmark and gpu_bench's torchrec stage run (tiny sizes on the CPU) and report what they promise."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)


def test_bench_torchrec_smoke_reports_every_variant(tmp_path):
    out = tmp_path / "r.json"
    payload = __import__("bench_torchrec").main(["--smoke", "--json", str(out)])
    assert out.is_file()
    rows = {r["variant"]: r for r in payload["results"]}
    assert list(rows) == [
        "torchrec_ebc_dense",
        "torchrec_fused_ebc",
        "hotline_collection_dmp",
        "hotline_trainer",
    ]
    assert all(r["samples_per_s"] > 0 for r in rows.values())
    for label in ("hotline_collection_dmp", "hotline_trainer"):  # one placement, the same batches: one share
        assert 0 < rows[label]["hot_lookup_share"] < 1 and rows[label]["cold_rows_per_step"] > 0
    assert rows["hotline_collection_dmp"]["hot_lookup_share"] == rows["hotline_trainer"]["hot_lookup_share"]
    assert payload["ratio_hotline_dmp_to_fused"] > 0


def test_gpu_torchrec_stage_runs_exactly_and_skips_without_torchrec(monkeypatch):
    import gpu_torchrec

    out = gpu_torchrec.torchrec_stage("cpu", steps=3, batch=64, dim=8, rows=500, tables=3)
    assert out["hotline_collection_samples_per_s"] > 0 and 0 < out["hot_lookup_share"] < 1
    assert out["max_rel_table_drift"] <= 1e-6  # the same SGD steps as torchrec's EBC with dense gradients
    monkeypatch.setitem(sys.modules, "torchrec", None)  # what the GPU image without torchrec sees
    skipped = gpu_torchrec.torchrec_stage("cpu")
    assert list(skipped) == ["skipped"] and skipped["skipped"].startswith("torchrec is not importable")
