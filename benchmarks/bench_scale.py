"""Benchmark: MLPerf DLRM-DCNv2's table sizes on the disk store, inside a memory limit below the table bytes.

Data: a synthetic dataset with the 26 MLPerf tables (204,184,588 rows; ``--rows`` scales every table down
in proportion, for a run that fits a busy machine) and their multi-hot bag sizes (214 ids per sample), Zipf
ids, ``--samples`` training samples. The run: ``--mode hotline --cold-store disk`` (look-ahead ``--lookahead``,
``--hbm-budget`` of hot rows, row-wise Adagrad, dim ``--dim``) for ``--steps`` steps of ``--batch`` samples.

Everything after the data runs in a child process inside a memory cgroup limited to ``--limit`` (cgroup v1,
made under this process's own memory cgroup where the machine lets it; else the child runs unlimited and the
JSON says so in ``limit.how``). Printed, and written as JSON to ``--json``:

- ``per_row_host_bytes``: the host structures that grow with the row count
  (:func:`hotline.training.host_memory.per_row_bytes` on the built mode, mid look-ahead), per row;
- ``peak_bytes``: the cgroup's ``memory.max_usage_in_bytes`` (page cache included) and the child's peak
  resident set (``ru_maxrss``);
- ``first_step_s``: seconds from the Trainer's construction (profile, placement, the file's fill) to the end of
  the first step; ``samples_per_s`` over the steps after it;
- ``checkpoint_s`` and ``checkpoint_mb_per_s``: one ``save_checkpoint`` at the half-way step (its rows
  streamed into the rows file beside it), beside ``disk_write_mb_per_s``, the disk's sequential write rate
  timed on a scratch file of the same size just before (written in 64 MiB blocks, fsynced);
  ``checkpoint_peak_rss_bytes``: the child's peak resident set during the save (``VmHWM``, reset before it
  through ``/proc/self/clear_refs``), beside ``rss_before_checkpoint_bytes``; ``load_s``: the resume's load;
- ``resume_exact``: whether a second run, resumed from that checkpoint, ends bit-identical to the first
  (the SHA-256 of the dense parameters and of every record of the store's file, the hot rows' from the hot
  tier: streamed, as the tables are never whole in memory);
- ``baseline``: what a user would otherwise try at the same limit: the same rows as one memory-mapped float32
  table under ``nn.EmbeddingBag`` (sparse gradients, SGD), the same batches' ids, forward, backward and
  step of the embedding alone: its samples/s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # puts this checkout's hotline first on sys.path
import memlimit
import numpy as np

MLPERF_ROWS = 204_184_588


def table_sizes(rows: int) -> list[int]:
    """The MLPerf table sizes scaled to about ``rows`` rows in all (each table at least one row)."""
    from hotline.datasets.mlperf import MLPERF_TABLE_SIZES

    return [max(1, round(s * rows / MLPERF_ROWS)) for s in MLPERF_TABLE_SIZES]


def _config(args, cold_dir: str, steps: int):
    from hotline import TrainConfig

    Path(cold_dir).mkdir(exist_ok=True)
    return TrainConfig(
        mode="hotline", cold_store="disk", cold_dir=cold_dir, cold_cache=0, optimizer="rowwise-adagrad",
        learning_rate=0.01, embedding_dim=args.dim, bottom_mlp=[13, 64, args.dim], top_mlp=[64, 1],
        mini_batch_size=args.batch, num_batches=steps, lookahead=args.lookahead, hbm_budget=args.hbm_budget,
        progress=False, quiet=True,
    )  # fmt: skip


def _digest(trainer) -> str:
    """SHA-256 of the run's state, streamed (the tables never whole in memory): the dense model's parameters,
    then every record of the disk store's file in its order, the hot rows' records from the hot tier."""
    h = hashlib.sha256()
    for name, p in sorted(trainer.model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    mode = trainer.mode
    f = mode.cold.host.file
    hot_pos = f.positions[mode.hot_rows].astype(np.int64)
    H = hot_pos.shape[0]
    hot = np.concatenate([mode.hot_w.cpu().numpy(), mode.hot_s.cpu().numpy().reshape(H, -1)], axis=1)
    lo = 0
    for _, rec in f.read_all():
        n = rec.shape[0]
        mine = (hot_pos >= lo) & (hot_pos < lo + n)
        rec[hot_pos[mine] - lo] = hot[mine]
        h.update(rec.tobytes())
        lo += n
    return h.hexdigest()


def _baseline(args, ds, work: Path) -> dict:
    """The memory-mapped table under nn.EmbeddingBag: samples/s of the embedding's forward, backward and step."""
    import torch

    from hotline.table_layout import TableLayout

    layout = TableLayout(ds.table_sizes)
    path = work / "mmap-table.f32"
    table = np.lib.format.open_memmap(path, "w+", np.float32, (layout.num_rows, args.dim))
    for lo in range(0, layout.num_rows, 1 << 22):  # the file written once, sequentially
        hi = min(layout.num_rows, lo + (1 << 22))
        table[lo:hi] = np.random.default_rng(lo).uniform(-0.01, 0.01, (hi - lo, args.dim))
    table.flush()
    bag = torch.nn.EmbeddingBag.from_pretrained(
        torch.from_numpy(table), freeze=False, mode="sum", sparse=True
    )
    opt = torch.optim.SGD(bag.parameters(), lr=0.01)
    offsets = np.repeat(layout.offsets, ds.bags.bag_sizes)  # each column's table offset
    sparse = ds.train.sparse
    steps = min(args.steps, len(ds.train) // args.batch)
    t0 = time.perf_counter()
    for s in range(steps):
        ids = (
            np.asarray(sparse[s * args.batch : (s + 1) * args.batch]).reshape(args.batch, -1).astype(np.int64)
        )
        fused = torch.from_numpy(ids + offsets)
        out = bag(fused.reshape(-1), torch.arange(0, fused.numel(), ids.shape[1]))
        out.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    del bag, opt, table
    path.unlink()
    return {"what": "one memory-mapped float32 table, nn.EmbeddingBag(sparse=True), SGD: the embedding only",
            "steps": steps, "samples_per_s": steps * args.batch / seconds if seconds else 0.0}  # fmt: skip


def _vm(field: str) -> int | None:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``), or None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Resets this process's ``VmHWM`` to its resident set now (Linux ``clear_refs`` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _disk_write_rate(directory: Path, size: int) -> float:
    """MB/s of writing ``size`` bytes sequentially to a scratch file in ``directory`` (64 MiB blocks, fsync),
    as the checkpoint writes its rows file."""
    block = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
    path = directory / "disk-rate.scratch"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for lo in range(0, size, len(block)):
            f.write(block[: min(len(block), size - lo)])
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return size / 1e6 / seconds


def _export_stage(ckpt: Path, work: Path, disk_mb_per_s: float) -> dict:
    """``hotline export --format dcp`` of the checkpoint ``ckpt`` (its rows streamed into row order through a
    scratch file, then into a torch.distributed.checkpoint directory): seconds, MB/s of the export's bytes
    beside the disk's sequential write rate, the peak resident set during it (``VmHWM``, reset before it)."""
    import shutil

    from hotline.training.export import export_torchrec_dlrm

    out = work / "export-dcp"
    shutil.rmtree(out, ignore_errors=True)
    reset = _reset_peak_rss()
    t0 = time.perf_counter()
    export_torchrec_dlrm(ckpt, out, format="dcp")
    seconds = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.iterdir())
    hwm = _vm("VmHWM") if reset else None
    shutil.rmtree(out)
    print(f"export (dcp): {size / 1e6:,.0f} MB in {seconds:.1f} s, {size / 1e6 / seconds:,.0f} MB/s (the disk's "
          f"sequential write: {disk_mb_per_s:,.0f} MB/s; the export also writes and reads a scratch copy); "
          f"peak RSS {'n/a' if hwm is None else f'{hwm / (1 << 30):.2f} GiB'}", flush=True)  # fmt: skip
    return {"seconds": seconds, "bytes": size, "mb_per_s": size / 1e6 / seconds, "peak_rss_bytes": hwm}


def child(args) -> dict:
    """Everything that runs under the limit: the run, its checkpoint, the resumed run, the baseline."""
    from hotline.datasets.format import Dataset
    from hotline.training.checkpoint import load_checkpoint, save_checkpoint
    from hotline.training.host_memory import per_row_bytes
    from hotline.training.trainer import Trainer

    ds = Dataset(args.data)
    work = Path(args.work)
    half = args.steps // 2
    out: dict = {"rows": ds.total_rows, "dim": args.dim}
    t0 = time.perf_counter()
    tr = Trainer(_config(args, str(work / "cold-a"), args.steps), ds)
    stats = tr.progress(tr.batches())
    next(stats)
    out["first_step_s"] = time.perf_counter() - t0
    mode = tr.mode
    found = per_row_bytes(mode, ds.total_rows)  # mid run: the look-ahead's claims are in the book
    out["per_row_host_bytes"] = sum(found.values()) / ds.total_rows
    out["per_row_structures"] = {k: v / ds.total_rows for k, v in found.items()}
    t1 = time.perf_counter()
    for _ in range(half - 1):
        next(stats)
    stats.close()  # the look-ahead drains: steps [0, half) done
    out["samples_per_s"] = (half - 1) * args.batch / (time.perf_counter() - t1) if half > 1 else 0.0
    record = tr.mode.cold.host.file.record
    out["disk_write_mb_per_s"] = _disk_write_rate(work, ds.total_rows * (record + 4))
    out["rss_before_checkpoint_bytes"] = _vm("VmRSS")
    reset = _reset_peak_rss()
    t2 = time.perf_counter()
    ckpt = save_checkpoint(tr, work / "ckpt")
    out["checkpoint_s"] = time.perf_counter() - t2
    out["checkpoint_peak_rss_bytes"] = _vm("VmHWM") if reset else None
    size = sum(p.stat().st_size for p in ckpt.parent.glob(ckpt.name + "*"))
    out["checkpoint_bytes"] = size
    out["checkpoint_mb_per_s"] = size / 1e6 / out["checkpoint_s"]
    out["export"] = _export_stage(ckpt, work, out["disk_write_mb_per_s"])
    for _ in tr.progress(tr.batches(tr.step_count)):
        pass
    straight = _digest(tr)
    tr.close()
    del tr, mode, stats
    tr = Trainer(_config(args, str(work / "cold-b"), args.steps), ds)
    t3 = time.perf_counter()
    start = load_checkpoint(tr, work / "ckpt")
    out["load_s"] = time.perf_counter() - t3
    for _ in tr.progress(tr.batches(start)):
        pass
    out["resume_exact"] = _digest(tr) == straight
    tr.close()
    del tr
    out["baseline"] = _baseline(args, ds, work)
    out["ru_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main(argv=None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--rows", type=int, default=MLPERF_ROWS, help="rows in all (the 26 tables scaled alike)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--samples", type=int, default=40_000, help="training samples generated")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lookahead", type=int, default=2)
    p.add_argument("--hbm-budget", type=int, default=256 << 20, help="bytes of hot rows")
    p.add_argument("--limit", type=int, default=3 << 30, help="the memory limit in bytes (cgroup v1)")
    p.add_argument(
        "--work", default="bench-scale", help="a directory on local disk for the data, files and checkpoint"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        Path(args.json).write_text(json.dumps(child(args)))
        return 0
    from hotline.datasets.mlperf import MLPERF_BAG_SIZES
    from hotline.datasets.synthetic import generate

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = table_sizes(args.rows)
    data = work / "data"
    if not (data / "meta.json").exists():
        generate(
            data,
            args.samples,
            seed=0,
            table_sizes=sizes,
            bag_sizes=MLPERF_BAG_SIZES,
            zipf=1.1,
            progress=False,
        )
    result_file = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child",
           "--data", str(data), "--json", str(result_file)]  # fmt: skip
    parent, group, how = (
        memlimit._v1_group(),
        None,
        "not limited: no cgroup v1 memory hierarchy this process may use",
    )
    if parent is not None:
        group = parent / f"bench-scale-{os.getpid()}"
        try:
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(args.limit))
            how = f"cgroup v1 {group / 'memory.limit_in_bytes'} = {args.limit}"
        except OSError as e:
            how, group = f"not limited: cannot make a memory cgroup under {parent} ({e})", None
    procs = None if group is None else group / "cgroup.procs"
    t0 = time.perf_counter()
    run = subprocess.run(cmd, preexec_fn=(lambda: procs.write_text(str(os.getpid()))) if procs else None)
    wall = time.perf_counter() - t0
    peak = failcnt = None
    if group is not None:
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        failcnt = int((group / "memory.failcnt").read_text())
        group.rmdir()
    if run.returncode != 0:
        result_file.unlink(missing_ok=True)
        print(f"bench_scale: the run failed (exit {run.returncode}) under {how}", file=sys.stderr)
        return 1
    out = json.loads(result_file.read_text())
    result_file.unlink()
    table_bytes = out["rows"] * 4 * (args.dim + 1)
    out.update({"limit": {"bytes": args.limit, "how": how}, "table_bytes": table_bytes, "wall_s": wall,
                "cgroup_peak_bytes": peak, "cgroup_failcnt": failcnt, "steps": args.steps, "batch": args.batch,
                "lookahead": args.lookahead, "hbm_budget": args.hbm_budget})  # fmt: skip
    gib = 1 << 30
    print(
        f"{out['rows']:,} rows at dim {args.dim}, row-wise Adagrad: {table_bytes / gib:.2f} GiB of rows and state"
    )
    print(f"memory limit: {how}")
    print(f"per-row host bytes: {out['per_row_host_bytes']:.2f} ({out['per_row_structures']})")
    peak_text = "n/a" if peak is None else f"{peak / gib:.2f} GiB"
    print(f"peak: cgroup {peak_text} (failcnt {failcnt}), child RSS {out['ru_maxrss_bytes'] / gib:.2f} GiB")
    print(f"first step after {out['first_step_s']:.1f} s; {out['samples_per_s']:,.0f} samples/s")
    hwm = out["checkpoint_peak_rss_bytes"]
    print(f"checkpoint: {out['checkpoint_bytes'] / 1e6:,.0f} MB in {out['checkpoint_s']:.1f} s, "
          f"{out['checkpoint_mb_per_s']:,.0f} MB/s (the disk's sequential write: "
          f"{out['disk_write_mb_per_s']:,.0f} MB/s); RSS {out['rss_before_checkpoint_bytes'] / gib:.2f} GiB "
          f"before it, peak {'n/a' if hwm is None else f'{hwm / gib:.2f} GiB'} during it; load "
          f"{out['load_s']:.1f} s; resumed bit-identically: {out['resume_exact']}")  # fmt: skip
    print(f"baseline ({out['baseline']['what']}): {out['baseline']['samples_per_s']:,.0f} samples/s")
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
