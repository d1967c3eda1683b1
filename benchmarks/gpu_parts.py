"""gpu_bench's one run in parts: each part a process of its own under its own timeout, its JSON written as it
goes and merged into the run's JSON after it ends (or is stopped), so a part that fails or overruns is
recorded and the next part still runs, and the whole run fits one window (``--budget-s``).

Parts, in order: ``layer`` (versions, the zero-copy probe and Numba's threading layer: a layer that cannot run
look-ahead is named in one line and the look-ahead modes are left out of the sweeps), ``smoke`` (small tables,
exactness), ``full`` (Kaggle-sized), ``dcnv2`` (MLPerf DLRM-DCNv2), ``calibrate`` (this host, the link and the
device's pass; skipped with ``--hardware``), ``torchrec`` and ``tests`` (a short tests/test_cuda.py subset)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PART_CAPS = {"layer": 40, "smoke": 60, "full": 200, "dcnv2": 120, "torchrec": 25, "calibrate": 45,
             "tests": 50}  # fmt: skip
"""Each part's timeout in seconds: its cap, or more where earlier parts left time unused (what is left of
``--budget-s`` less the caps of the parts after it), never more than is left: 540 s in all, 9 minutes."""
SMOKE_SLACK = 5
"""``--smoke`` runs on a CPU (the tests: small sizes, a slow shared machine): its timeouts and window are this
many times the GPU run's."""
LOOKAHEAD_MODES = ("hotline_k2", "hybrid_k2")
"""Modes that run the look-ahead executor (refused on Numba's workqueue threading layer)."""
CUDA_TESTS = "hotline and 2 or pinned or pinning or refused or sorted_update"
"""The tests/test_cuda.py subset the run ends with (``-k``): look-ahead on CUDA against device mode, pinning,
device mode's update."""


def plan(smoke: bool, no_smoke: bool, hardware: str | None) -> list[str]:
    """The parts to run, in order. ``--smoke`` (the CPU check): every part, at small sizes, the calibration left
    out (a CPU calibration takes minutes); ``--no-smoke``: no smoke part; ``--hardware``: no calibration."""
    parts = ["layer", "smoke", "full", "dcnv2", "torchrec", "calibrate", "tests"]
    if smoke:
        parts.remove("full")
    if no_smoke and not smoke:
        parts.remove("smoke")
    if hardware or smoke:
        parts.remove("calibrate")
    return parts


def orchestrate(args, argv: list[str], script: Path) -> dict:
    """Runs every part of :func:`plan` as ``script ... --part NAME`` under its timeout; returns the merged
    payload (written to ``args.json`` after every part)."""
    t_start = time.perf_counter()
    slack = SMOKE_SLACK if args.smoke else 1
    deadline = t_start + slack * args.budget_s
    payload: dict = {"stages": {}, "parts": {}, "budget_s": args.budget_s,
                     "command": " ".join(["python", "benchmarks/gpu_bench.py", *argv])}  # fmt: skip
    parts = plan(args.smoke, args.no_smoke, args.hardware)
    skipped = list(PART_CAPS.keys() - set(parts))
    payload["skipped_parts"] = sorted(skipped)
    leave_out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu_bench_parts_") as tmp:
        for part in parts:
            left = deadline - time.perf_counter()
            later = slack * sum(PART_CAPS[q] for q in parts[parts.index(part) + 1 :])
            timeout = min(max(slack * PART_CAPS[part], left - later), left)  # time saved earlier flows on
            record: dict = {"timeout_s": round(timeout, 1)}
            if timeout < 5:
                record["error"] = f"skipped: {left:.0f} s left of --budget-s {args.budget_s:.0f}"
                print(f"[{part}] {record['error']}", flush=True)
                payload["parts"][part] = record
                _write(args.json, payload)
                continue
            out = Path(tmp) / f"{part}.json"
            cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), str(script), *argv, "--part", part,
                   "--json", str(out), "--combined", str(Path(tmp) / "combined.json")]  # fmt: skip
            if leave_out:
                cmd += ["--leave-out", ",".join(leave_out)]
            t0 = time.perf_counter()
            try:
                rc = subprocess.run(cmd, timeout=timeout).returncode
                record["rc"] = rc
            except subprocess.TimeoutExpired:
                rc = None
                record["error"] = f"timed out after {timeout:.0f} s (what it wrote before is kept)"
                print(f"[{part}] {record['error']}", file=sys.stderr, flush=True)
            record["seconds"] = round(time.perf_counter() - t0, 1)
            got = _read(out)
            stage = got.get("stages", {}).get(part)
            if stage is not None:
                payload["stages"][part] = stage
                if "error" in stage and "error" not in record:
                    record["error"] = stage["error"]
            elif rc not in (0, None) and "error" not in record:
                record["error"] = f"exited with {rc} before writing anything"
            for key in ("versions", "zero_copy", "machine"):
                if key in got:
                    payload[key] = got[key]
            if part == "layer" and stage is not None and not stage.get("ok", True):
                leave_out = list(LOOKAHEAD_MODES)
                print(f"[layer] {stage['line']}: look-ahead modes left out of the sweeps", flush=True)
            payload["parts"][part] = record
            _headline(payload)
            payload["total_s"] = time.perf_counter() - t_start
            _write(args.json, payload)
            _write(Path(tmp) / "combined.json", payload)
    return payload


def _headline(payload: dict) -> None:
    """Top level: the last Kaggle-workload sweep that finished (full, else smoke): its figures and one record
    per mode."""
    from bench_pipeline import MODES

    for key in [k for k in MODES if k in payload]:
        del payload[key]
    for stage in ("full", "smoke"):
        s = payload["stages"].get(stage, {})
        if "by_mode" in s:
            payload.update({k: s[k] for k in ("ratios", "best_hotline", "sweep", "placements", "hardware")
                            if k in s})  # fmt: skip
            payload.update(s["by_mode"])
            payload["device_name"] = s.get("device_name")
            return


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path, payload: dict) -> None:
    import common

    common.write_json(path, payload)


def run_tests(timeout: float) -> dict:
    """The short tests/test_cuda.py subset (:data:`CUDA_TESTS`), its summary line and exit status; skipped
    with the reason where pytest is missing."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not installed here"}
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_cuda.py", "-k", CUDA_TESTS]  # fmt: skip
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    print(proc.stdout[-3000:], flush=True)
    return {
        "rc": proc.returncode,
        "summary": lines[-1] if lines else proc.stderr.strip()[-300:],
        "k": CUDA_TESTS,
    }
