"""The pipeline and GPU benchmarks run (tiny --smoke sizes on the CPU) and report what they promise."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.parametrize("script", ["bench_pipeline", "gpu_bench"])
def test_smoke(script, tmp_path):
    module = __import__(script)
    out = tmp_path / "r.json"
    payload = module.main(["--smoke", "--json", str(out)])
    assert out.is_file()
    for mode in ("device", "hybrid", "hotline_k0", "hotline_k2"):
        assert payload[mode]["samples_per_s"] > 0
    assert 0 <= payload["hotline_k2"]["stall_share"] <= 1
    assert payload["ratios"]
