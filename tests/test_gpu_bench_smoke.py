"""The GPU benchmark (benchmarks/gpu_bench.py) run where no GPU is: from a plain copy of the checkout with only
the image's packages, a mode that raises does not stop the others, its parts are planned in order and it
calibrates only when asked (split from test_gpu_readiness.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

_ON_THE_IMAGE = """
import runpy, sys
sys.path.insert(0, ".")
import tests.test_cuda  # noqa: F401 - its imports work there
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
_NOT_ON_THE_IMAGE = ("hotline", "__editable__", "tqdm", "torchrec", "fbgemm", "pyarrow", "matplotlib",
                     "mpl_toolkits", "hypothesis", "_hypothesis")  # fmt: skip


def _image_site_packages(tmp_path: Path) -> Path:
    """This interpreter's site-packages without what the GPU image lacks (no installed hotline either): a
    folder of links to everything else, for ``python -S`` with it on PYTHONPATH (no .pth file runs)."""
    site = Path(torch.__file__).resolve().parents[1]
    view = tmp_path / "site-packages"
    view.mkdir()
    for entry in site.iterdir():
        if entry.suffix != ".pth" and not entry.name.lower().startswith(_NOT_ON_THE_IMAGE):
            (view / entry.name).symlink_to(entry)
    return view


def test_gpu_bench_smoke_from_a_plain_checkout_survives_a_mode_that_raises(tmp_path):
    """A copy of the checkout (no install, none of the extras the GPU image lacks) runs tests/test_cuda.py's
    imports and ``gpu_bench.py --smoke``; look-ahead refuses Numba's workqueue layer there (a real failure):
    hotline_k2 is recorded with its error, every other mode still runs and agrees with device mode."""
    import json

    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "checkout"
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True)
    for rel in tracked.stdout.split():
        if (root / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, copy / rel)
    if (root / "kernels" / "__pycache__").is_dir():  # Numba's cache (valid: same sources, same times)
        shutil.copytree(root / "kernels" / "__pycache__", copy / "kernels" / "__pycache__")
    (copy / "on_the_image.py").write_text(_ON_THE_IMAGE)
    env = {
        **os.environ,
        "PYTHONPATH": str(_image_site_packages(tmp_path)),
        "NUMBA_THREADING_LAYER": "workqueue",
    }
    out = tmp_path / "gpu.json"
    args = ["--smoke", "--json", str(out), "--coverages", "0.85", "--table-shares", "", "--modes",
            "device,hybrid,hotline_k0,hotline_k2,torch_embeddingbag"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-S", "on_the_image.py", "benchmarks/gpu_bench.py", *args], cwd=copy,
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["versions"]["hotline_path"] == str(copy / "hotline")
    assert payload["versions"]["kernels_path"] == str(copy / "kernels")
    layer = payload["stages"]["layer"]  # checked first, named in one line; no look-ahead run tried
    assert layer["ok"] is False and "'workqueue'" in layer["line"] and "\n" not in layer["line"]
    smoke = payload["stages"]["smoke"]
    assert smoke["skipped_modes"] == ["hotline_k2"] and smoke["failed_modes"] == [] and smoke["exact"] is True
    ran = [r["mode"] for r in smoke["sweep"]]
    assert ran == ["device", "hybrid", "hotline_k0", "torch_embeddingbag"]
    assert all(r["samples_per_s"] > 0 for r in smoke["sweep"])
    assert "hotline_k0" in payload and "hotline_k2" not in payload  # headline of what ran
    assert all("error" not in payload["parts"][p] for p in ("layer", "smoke", "dcnv2", "torchrec", "tests"))


def test_gpu_bench_plans_its_parts_in_order_and_calibrates_only_when_asked():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    plan = __import__("gpu_parts").plan

    every = ["layer", "smoke", "full", "dcnv2", "torchrec", "calibrate", "tests"]
    assert plan(smoke=False, no_smoke=False, hardware=None) == every
    assert plan(smoke=False, no_smoke=True, hardware="h200.json") == [
        p for p in every if p not in ("smoke", "calibrate")
    ]
    assert plan(smoke=True, no_smoke=False, hardware=None) == ["layer", "smoke", "dcnv2", "torchrec", "tests"]
    assert sum(__import__("gpu_parts").PART_CAPS.values()) <= 540  # one run within 9 minutes


def test_gpu_bench_smoke_records_a_failure_of_every_part_and_goes_on(tmp_path):
    """``--simulate-failure`` makes each part raise at its start: every part is recorded with its error, the
    next part still runs, and the run ends normally with its JSON."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    parts = ["layer", "smoke", "dcnv2", "torchrec", "tests"]
    out = tmp_path / "g.json"
    payload = __import__("gpu_bench").main(
        ["--smoke", "--json", str(out), "--simulate-failure", ",".join(parts)]
    )
    written = json.loads(out.read_text())
    for part in parts:
        assert f"simulated failure of part {part}" in payload["parts"][part]["error"], part
        assert written["parts"][part]["error"] == payload["parts"][part]["error"]
    assert "ratios" not in payload and set(written["parts"]) == set(parts)
