"""Soak: a long hotline training run (look-ahead 2) whose memory (RSS) and thread count are sampled over time.

Data: a synthetic dataset (``hotline.datasets.synthetic.generate``: the 26 Criteo Kaggle tables capped at
``--max-rows-per-table`` rows, ``--rows`` rows) generated into a temporary directory, or ``--data DIR``.
Placement: ``hotline.profile`` hot rows under ``--budget-share`` of the embedding bytes (``TrainConfig.hbm_budget``).
The run is ``hotline.Trainer`` with ``TrainConfig(mode="hotline", lookahead=2)`` over ``--steps`` steps
of ``--batch`` samples (epochs repeat the training split as often as needed), driven by
``trainer.progress(trainer.batches())``: the pipelined executor with its producer and write-back threads.

Every ``--sample-every`` steps it records ``VmRSS``, ``RssAnon`` and ``RssFile`` (the memory-mapped dataset's
pages count in RSS; they stop growing once the first epoch has touched them) and ``Threads`` from
``/proc/self/status``, plus the live Python threads named ``hotline-*``. Verdict: RSS after warm-up is
*flat* when the largest VmRSS in the last half of the run is within ``--tolerance`` (5%) of the VmRSS at the
end of warm-up (``--warmup-share`` of the steps, default 10%). After the run it checks that no ``hotline-*``
thread is left. ``--json FILE`` writes every sample and the verdict.
"""

from __future__ import annotations

import gc
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import common

STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads")


def proc_status() -> dict[str, int]:
    """Memory figures (MiB) and the OS thread count of this process, from ``/proc/self/status``."""
    out: dict[str, int] = {}
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:  # not Linux: the soak still runs, with the figures it can get
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            number = int(value.split()[0])
            out[key] = number if key == "Threads" else number / 1024  # kB -> MiB
    return out


def hotline_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("hotline-"))


def verdict(samples: list[dict], steps: int, warmup_steps: int, tolerance: float) -> dict:
    """Compares the largest VmRSS of the last half of the run with the VmRSS at the end of warm-up."""
    after_warmup = [s for s in samples if s["step"] >= warmup_steps]
    last_half = [s for s in samples if s["step"] > steps / 2]
    if not after_warmup or not last_half or "VmRSS" not in after_warmup[0]:
        return {"rss_flat": None, "reason": "not enough samples (or no /proc/self/status)"}
    base = after_warmup[0]
    peak = max(last_half, key=lambda s: s["VmRSS"])
    growth = peak["VmRSS"] / base["VmRSS"] - 1.0
    return {
        "warmup_step": base["step"],
        "rss_after_warmup_mib": round(base["VmRSS"], 1),
        "rss_max_last_half_mib": round(peak["VmRSS"], 1),
        "rss_max_last_half_step": peak["step"],
        "rss_growth": round(growth, 4),
        "anon_growth_mib": round(peak.get("RssAnon", 0) - base.get("RssAnon", 0), 1),
        "tolerance": tolerance,
        "rss_flat": bool(growth <= tolerance),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__)
    parser.add_argument("--steps", type=int, default=20_000, help="training steps")
    parser.add_argument("--batch", type=int, default=256, help="mini-batch size")
    parser.add_argument("--rows", type=int, default=600_000, help="rows of the generated dataset")
    parser.add_argument("--max-rows-per-table", type=int, default=50_000, help="cap of every table")
    parser.add_argument("--data", type=Path, default=None, help="use this dataset directory instead")
    parser.add_argument("--budget-share", type=float, default=0.1, help="hot share of the embedding bytes")
    parser.add_argument("--lookahead", type=int, default=2, help="look-ahead of the pipelined executor")
    parser.add_argument("--sample-every", type=int, default=0, help="steps between samples (0: steps/100)")
    parser.add_argument("--warmup-share", type=float, default=0.1, help="share of the steps that is warm-up")
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed RSS growth after warm-up")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rows, args.max_rows_per_table = min(args.steps, 300), 5_000, 500
    if args.steps < 1 or args.batch < 1:
        parser.error("--steps and --batch must be positive")
    threads = common.setup_threads(args.threads)

    from hotline import TrainConfig, Trainer
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    with tempfile.TemporaryDirectory(prefix="hotline-soak-") as tmp:
        t0 = time.perf_counter()
        if args.data is not None:
            ds = Dataset(args.data)
        else:
            ds = Dataset(
                generate(
                    Path(tmp) / "ds",
                    args.rows,
                    seed=args.seed,
                    max_rows_per_table=args.max_rows_per_table,
                    progress=False,
                )
            )
        data_s = time.perf_counter() - t0
        per_epoch = ds.train.num_batches(args.batch)
        dim = 16
        budget = int(args.budget_share * ds.total_rows * dim * 4)
        cfg = TrainConfig(
            mode="hotline",
            lookahead=args.lookahead,
            embedding_dim=dim,
            bottom_mlp=[13, 64, dim],
            top_mlp=[64, 1],
            mini_batch_size=args.batch,
            nepochs=max(1, math.ceil(args.steps / max(per_epoch, 1))),
            num_batches=args.steps,
            hbm_budget=budget,
            seed=args.seed,
            progress=False,
        )
        every = args.sample_every or max(1, args.steps // 100)
        warmup_steps = max(1, int(args.steps * args.warmup_share))
        start_status = proc_status()
        trainer = Trainer(cfg, ds)
        samples: list[dict] = []
        losses = 0.0
        seen = 0
        during: set[str] = set()
        t0 = time.perf_counter()
        try:
            for step, stats in enumerate(trainer.progress(trainer.batches()), 1):
                losses += float(stats.loss_sum)
                seen += stats.samples
                if step % every == 0 or step == args.steps:
                    during.update(hotline_threads())
                    samples.append(
                        {
                            "step": step,
                            "seconds": round(time.perf_counter() - t0, 2),
                            "loss": losses / max(seen, 1),
                            **proc_status(),
                            "hotline_threads": len(hotline_threads()),
                        }
                    )
                    losses, seen = 0.0, 0
        finally:
            trainer.close()
        train_s = time.perf_counter() - t0
        steps_done = trainer.step_count
        del trainer
        gc.collect()
        end_status = proc_status()
        left = hotline_threads()

    result = verdict(samples, args.steps, warmup_steps, args.tolerance)
    result.update(
        {
            "steps": steps_done,
            "steps_per_s": round(steps_done / train_s, 1) if train_s > 0 else None,
            "threads_max": max((s.get("Threads", 0) for s in samples), default=None),
            "threads_min": min((s.get("Threads", 0) for s in samples), default=None),
            "threads_before": start_status.get("Threads"),
            "threads_after": end_status.get("Threads"),
            "hotline_threads_seen": sorted(during),
            "hotline_threads_left": left,
        }
    )
    marks = {max(1, round(args.steps * q / 10)) for q in range(11)} | {warmup_steps}
    shown = [s for s in samples if any(abs(s["step"] - m) < every for m in marks)]
    columns = [
        ("step", "step", ""),
        ("seconds", "s", ".1f"),
        ("loss", "loss", ".4f"),
        ("VmRSS", "RSS MiB", ".1f"),
        ("RssAnon", "anon MiB", ".1f"),
        ("RssFile", "file MiB", ".1f"),
        ("Threads", "OS threads", ""),
        ("hotline_threads", "hotline-*", ""),
    ]
    common.print_table(
        shown,
        columns,
        title=f"soak: {steps_done} hotline steps (look-ahead {args.lookahead}, batch {args.batch}) on "
        f"{ds.path.name} ({len(ds.train):,} train rows, {per_epoch} steps/epoch), {train_s:.0f} s",
    )
    if result["rss_flat"] is None:
        print(f"RSS verdict: {result['reason']}")
    else:
        print(
            f"RSS after warm-up (step {result['warmup_step']}): {result['rss_after_warmup_mib']} MiB; max in the "
            f"last half: {result['rss_max_last_half_mib']} MiB (step {result['rss_max_last_half_step']}): "
            f"growth {result['rss_growth']:+.2%} -> {'FLAT' if result['rss_flat'] else 'GROWING'} "
            f"(tolerance {args.tolerance:.0%}); anonymous memory {result['anon_growth_mib']:+.1f} MiB"
        )
    print(
        f"OS threads {result['threads_min']}..{result['threads_max']} during the run "
        f"({result['threads_before']} before, {result['threads_after']} after); "
        f"hotline-* threads left after the run: {left or 'none'}"
    )
    report = {
        "benchmark": "soak",
        "config": {
            k: getattr(args, k)
            for k in ("steps", "batch", "rows", "max_rows_per_table", "budget_share", "lookahead", "seed")
        }
        | {"sample_every": every, "warmup_steps": warmup_steps, "data_seconds": round(data_s, 2)},
        "machine": common.machine_info(threads),
        "result": result,
        "samples": samples,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    report = main()
    sys.exit(
        0 if report["result"]["rss_flat"] is not False and not report["result"]["hotline_threads_left"] else 1
    )
