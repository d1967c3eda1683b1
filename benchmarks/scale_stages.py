"""bench_scale's stages: which run (``--stages``), each run as a process inside the memory cgroup, and the most disk
the work directory holds while they run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common


def run_stage(
    script: str, args, argv, data: Path, work: Path, group: Path | None, stage: str
) -> tuple[int, dict]:
    """Runs one stage as a process in the memory cgroup ``group``, emptied of the page cache the stages before
    left charged to it and its peak reset first, as a new container would start: ``script``'s own stages, or
    ``evaluate`` / ``predict`` (``python -m hotline evaluate|predict`` of this checkout on the checkpoint,
    the last line it printed kept). Returns its exit code and results, with its seconds, peak resident set
    (``wait4``) and the cgroup's peak and failcnt."""
    result_file = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    cmd = [sys.executable, script, *(argv if argv is not None else sys.argv[1:]), "--child", "--stage", stage,
           "--data", str(data), "--json", str(result_file)]  # fmt: skip
    env = None
    if stage in ("evaluate", "predict"):
        cmd = [sys.executable, "-m", "hotline", stage, str(data), "--load", str(work / "ckpt"), "--threads",
               str(args.threads), "--no-progress"]  # fmt: skip
        if stage == "predict":
            cmd += ["--out", str(work / "predictions.npy"), "--force"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([common._ROOT, os.environ.get("PYTHONPATH", "")]))
    procs = None if group is None else group / "cgroup.procs"
    if group is not None:
        (group / "memory.force_empty").write_text("0")
        (group / "memory.max_usage_in_bytes").write_text("0")
        (group / "memory.failcnt").write_text("0")
    t0 = time.perf_counter()
    with open(work / f"{stage}.out", "wb") as log, open(work / f"{stage}.err", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=log, stderr=None if env is None else err, env=env,
                                preexec_fn=(lambda: procs.write_text(str(os.getpid()))) if procs else None)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if env is None:
        out = json.loads(result_file.read_text()) if code == 0 else {}
    else:
        said = [(work / f"{stage}.{k}").read_text().strip().splitlines() for k in ("out", "err")]
        lines = said[0] or said[1] or [""]
        out = {stage: {"last_line": lines[-1]}}
        (work / "predictions.npy").unlink(missing_ok=True)
    result_file.unlink(missing_ok=True)
    # train resets its VmHWM before the checkpoint (clear_refs), which lowers wait4's ru_maxrss too: its peak
    # before the reset is hotline_peak_rss_bytes
    peak = max(usage.ru_maxrss * 1024, out.get("hotline_peak_rss_bytes") or 0)
    out.update({"exit": code, "seconds": seconds, "peak_rss_bytes": peak,
                "cgroup_peak_bytes": None, "cgroup_failcnt": None})  # fmt: skip
    if group is not None:
        out["cgroup_peak_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
        out["cgroup_failcnt"] = int((group / "memory.failcnt").read_text())
    print(
        f"stage {stage}: exit {code}, {seconds:.0f} s, peak RSS {out['peak_rss_bytes'] / 2**30:.2f} GiB, "
        f"cgroup peak {(out['cgroup_peak_bytes'] or 0) / 2**30:.2f} GiB (page cache included)",
        flush=True,
    )
    return code, out


STAGES = ("train", "resume", "evaluate", "predict", "export", "baseline", "written")
"""The stages in the order they run; ``resume``, ``evaluate``, ``predict`` and ``export`` read train's checkpoint
(``written``: the train stage's steps on a store written whole at start-up, :mod:`scale_written`)."""


def data_for(work: Path, sizes: list[int], samples: int) -> Path:
    """The benchmark's dataset under ``work``: made once, and made again where the one there has other table
    sizes or another sample count (another ``--rows`` or ``--samples`` in the same ``--work``)."""
    from hotline.datasets.mlperf import MLPERF_BAG_SIZES
    from hotline.datasets.synthetic import generate

    data = work / "data"
    if (data / "meta.json").exists():
        meta = json.loads((data / "meta.json").read_text())
        if meta.get("table_sizes") == list(sizes) and sum(meta.get("splits", {}).values()) == samples:
            return data
        shutil.rmtree(data)
    generate(data, samples, seed=0, table_sizes=sizes, bag_sizes=MLPERF_BAG_SIZES, zipf=1.1, progress=False)
    return data


def apply_smoke(args) -> None:
    """``--smoke``: sizes small enough that every stage runs in seconds (the suite's check that they run), most
    cold rows on disk (every path a full run takes)."""
    if args.smoke:
        args.rows, args.samples, args.steps, args.baseline_steps = 400_000, 6_000, 8, 4
        args.hbm_budget, args.cold_cache = 1 << 20, "1MiB"


def parse_stages(text: str) -> list[str]:
    """The ``--stages`` asked for, in run order; SystemExit with one line for an unknown one or a stage whose
    checkpoint no stage makes."""
    asked = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in asked if x not in STAGES]
    if bad or not asked:
        raise SystemExit(f"bench_scale: --stages takes some of {','.join(STAGES)}, got {text!r}")
    if "train" not in asked and any(x not in ("baseline", "written") for x in asked):
        raise SystemExit("bench_scale: --stages resume, evaluate, predict and export read train's checkpoint")
    return [x for x in STAGES if x in asked]


class DiskPeak:
    """The most disk the files under ``directory`` took beyond those there when made (the data), sampled every
    0.2 s on a thread while it lives: the store's file, the checkpoint, the export, the baseline's files (their
    allocated blocks, so a file reserved but not yet written counts whole)."""

    def __init__(self, directory: Path):
        import threading

        self._dir, self.peak = directory, 0
        self._base = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _used(self) -> int:
        total = 0
        for root, _, files in os.walk(self._dir):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
                except OSError:  # removed meanwhile
                    pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._used() - self._base)

    def close(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak
