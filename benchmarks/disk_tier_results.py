"""What bench_disk_tier.py's runs say (it runs them; this prices and reports): each disk row priced by the cost
model at the disk beside it, the typical round of a row, two disk calibrations pooled, ``--mode auto``'s choice
and its margin (paired round by round), and the tables, targets and reasons printed from them."""

from __future__ import annotations

import tempfile

import common

TARGETS = {"hybrid_disk": 2.0, "mmap_dram": 3.0, "device": 0.6}
"""K>=2 on disk at 90% against each baseline. The mmap target is judged on ``mmap_dram`` (its page cache held to
the disk store's DRAM budget, as the issue's tables "several times the DRAM budget the run is given"); where
no memory cgroup can be made, on ``mmap`` (said in the output). ``mmap`` with the machine's whole memory is
printed beside it for reference: a table that fits in memory ends up cached."""


def config(args, **kw):
    """The runs' training configuration (every row trains the same model on the same batches)."""
    from hotline import TrainConfig

    return TrainConfig(embedding_dim=args.dim, bottom_mlp=[13, 64, args.dim], top_mlp=[64, 1],
                       mini_batch_size=args.batch, learning_rate=0.01, optimizer="sgd", progress=False,
                       threads=args.threads, num_batches=args.profile_batches + args.steps + args.warmup_steps,
                       **kw)  # fmt: skip


def predict(rec: dict, hybrid: dict | None, dataset, args, hw: dict):
    """The cost model's prediction for a disk row, from the run's measured figures (None for the others), with
    the disk figures of ``hw`` (the row's own: :func:`row_probe`)."""
    from hotline.costmodel import DiskTier, Stats, predict

    if rec.get("coverage") is None or hybrid is None:
        return None
    mode = {"hybrid_disk": "hybrid", "hotline_k0_disk": "hotline_k0"}.get(rec["mode"], "hotline_k1")
    w = workload(dataset, args)
    ahead = mode == "hotline_k1"
    s = Stats(rec["coverage"], rec["popular_share"], rec["cold_rows_per_step"], hybrid["cold_rows_per_step"],
              rec.get("stale_rows_per_step", 0.0) if ahead else 0.0)  # fmt: skip
    reread = rec.get("reread_share") if ahead else 0.0
    pages = rec["disk_bytes_per_step"] / 4096  # the fetch's: its requests over its pages
    disk = DiskTier(pages_per_cold_row=rec["pages_per_disk_row"], reread_share=max(0.0, reread or 0.0),
                    cached_share=min(1.0, max(0.0, rec["cached_share"])),
                    skipped_share=min(1.0, max(0.0, rec.get("skipped_share", 0.0))) if ahead else 0.0,
                    calls_per_page=min(1.0, rec["disk_reads_per_step"] / pages) if pages else 1.0,
                    held_rows=rec.get("held_rows", 0), file_rows=rec.get("file_rows", 0))  # fmt: skip
    return predict(mode, w, s, hw, disk)


def row_probe(rec: dict, hw: dict) -> dict | None:
    """The probe a disk row is priced at: per direction, the median of the two probes beside it and the
    calibration's own, so that a probe moves the price only as far as both agree. A stall of the disk during
    one probe, between two rows (a probe several times the others), then does not price the rows beside it.
    None where the row or the calibration has no probe."""
    import numpy as np

    ref, p = hw.get("disk", {}).get("step", {}).get("probe"), rec.get("disk_probe")
    if ref is None or p is None:
        return None
    return {k: float(np.median([p["before"][k], p["after"][k], ref[k]])) for k in ("read_us", "write_us")}


def price(r: dict, hybrid: dict | None, dataset, args, hw: dict) -> None:
    """A disk row's (one round's) prediction, at the disk beside it (the calibration's step fits scaled by how
    the disk timed the calibration's probe beside the row against during the calibration), in its record."""
    from hotline.costmodel.disk_calibrate import at_probe

    if "error" in r:
        return
    at, row_hw = row_probe(r, hw), hw
    if at is not None:
        r["disk_probe"]["priced_at"] = at
        row_hw = {**hw, "disk": at_probe(hw["disk"], at)}
        r["probe_scale"] = row_hw["disk"]["step"]["at_probe"]["read"]
    p = predict(r, hybrid, dataset, args, row_hw)
    if p is None:
        return
    r["predicted_samples_per_s"] = p.samples_per_s
    r["predicted_ratio"] = p.samples_per_s / r["samples_per_s"]
    r["predicted_exposed_ms"] = 1e3 * exposed_s(p)
    ms = {k: 1e3 * v for k, v in p.phases_s.items()}
    r["predicted_ms"] = ms | {"step": 1e3 * p.step_s}
    lane = (
        "lane: disk beside compute"
        if "lane: disk beside compute" in ms
        else "lane: disk (reads beside writes)"
    )
    device = ("assemble", "compute", "sparse_update", "dense_update")
    r.update(pred_disk_read=ms["disk_read"], pred_disk_write=ms["disk_write"], pred_step=1e3 * p.step_s,
             pred_disk_lane=ms.get(lane, ms["disk_read"] + ms["disk_write"]),
             pred_device=ms.get("lane: device (compute + updates)", sum(ms[k] for k in device)))  # fmt: skip


def typical(rounds: list[dict]) -> dict:
    """The round of a disk row that stands for it: its median by samples/s (the lower middle of an even count;
    a row whose every round raised: the first error), with every round's samples/s and predicted/measured
    beside it (``rounds_samples_per_s``, ``rounds_predicted_ratio``)."""
    rec = common.kept_round(rounds, "median")
    ok = [r for r in rounds if "error" not in r]
    if ok and all("predicted_ratio" in r for r in ok):
        rec["rounds_predicted_ratio"] = [r["predicted_ratio"] for r in ok]
    return rec


def exposed_s(p) -> float:
    """What a predicted step spends outside its compute: the sequential step's reads and write-back (what the
    benchmark measures as exposed), or the pipelined step beyond its device lane: the main thread's wait for
    the producer (the exposed time measured) plus the compute's slowdown beside the I/O threads on shared
    cores (measured as compute, not as the wait)."""
    ph = p.phases_s
    if p.mode != "hotline_k1":
        return sum(ph.get(k, 0.0) for k in ("write_back", "disk_read", "disk_write"))
    return max(0.0, p.step_s - ph["lane: device (compute + updates)"] - ph["lane: hand-over"])


def workload(dataset, args):
    """The cost model's workload: the model the runs train."""
    from hotline.costmodel import Workload, arch_of

    return Workload(batch_size=args.batch, num_tables=dataset.num_tables, pooling_factor=dataset.pooling_factor,
                    embedding_dim=args.dim, **arch_of(config(args)))  # fmt: skip


def mean_of(a, b):
    """Two calibrations' figures averaged field by field (numbers; anything else, and numbers both give alike, such
    as the I/O depth or the record's bytes, as in ``b``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: mean_of(a[k], v) if k in a else v for k, v in b.items()}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(b, bool) and a != b:
        return (a + b) / 2
    return b


def pool_penalties(step: dict, *calibrations: dict) -> None:
    """The overlap penalties of ``step`` (the mean of two calibrations') from every pair both timed, pooled as
    one calibration of twice the pairs (:func:`~hotline.costmodel.fitting.pooled_penalty`; reads beside
    write-backs, fitted to the timed look-ahead pipelines, at the pooled compute penalty:
    :func:`~hotline.costmodel.disk_overlap.pipeline_penalty`), not the mean of the two priced figures: a gain
    one calibration shows beyond its noise and the other does not is weighed by its pairs, not taken at half its
    size."""
    from hotline.costmodel.disk_overlap import BESIDE_SHARES, beside_name, penalty_curve, pipeline_penalty
    from hotline.costmodel.fitting import pooled_penalty

    def pairs(name: str) -> list | None:
        parts = [c.get("penalties_measured", {}).get(name, {}).get("pairs") for c in calibrations]
        return [tuple(pair) for part in parts for pair in part] if all(parts) else None

    measured = {}
    beside = [beside_name(share) for share in BESIDE_SHARES]
    for name in (*beside, "read_write_pair"):
        # calibrations from before the pairs were kept (or before the shorter compute was timed): their mean stands
        if (got := pairs(name)) is not None:
            measured[name] = pooled_penalty(got)
    if "compute" in measured:
        step["compute_penalty"] = measured["compute"]["penalty"]
    if all(name in measured for name in beside) and "compute_penalties" in step:
        step["compute_penalties"] = penalty_curve(measured)
    got = pairs("read_write")
    if got is not None and all(len(t) == 4 for t in got):  # (pipelined, reads, compute, write-backs)
        measured["read_write"] = pipeline_penalty(got, step.get("compute_penalties", step["compute_penalty"]))
        step["read_write_penalty"] = measured["read_write"]["penalty"]
    if measured:
        step.setdefault("penalties_measured", {}).update(measured)


def auto_row(rows: list[dict], prof, dataset, args, hw: dict, dram: int, placements: list[dict]) -> dict:
    """What ``--mode auto`` chooses from the same calibration, priced with the disk store and the runs' DRAM
    tier among the measured budgets (so its choice is a measured row), and its margin to the fastest disk row."""
    from hotline.costmodel import Stats
    from hotline.costmodel.choose import ColdDisk, choose
    from hotline.costmodel.machine import device_memory

    w = workload(dataset, args)
    choice = choose(dataset.total_rows * w.row_bytes, device_memory("cpu"), hw, w,
                    lambda b: Stats.from_profile(prof, int(b), batch_size=args.batch),
                    [pl["budget_bytes"] for pl in placements], lookaheads=(0, args.lookahead),
                    disk=ColdDisk(args.cold_dir or tempfile.gettempdir(), dram))  # fmt: skip
    name = "hybrid_disk" if choice.mode == "hybrid" else f"hotline_k{choice.lookahead}_disk"
    chosen = next((r for r in rows if r["mode"] == name and r.get("budget_bytes") == choice.hbm_budget), None)
    fastest = max((r for r in rows if r["mode"].endswith("_disk")), key=lambda r: r["samples_per_s"])
    out = {"choice": name, "target": None if chosen is None else chosen.get("target"),
           "hbm_budget": choice.hbm_budget, "predicted_samples_per_s": choice.predicted_samples_per_s,
           "reason": choice.reason, "measured": chosen is not None, "fastest": fastest["mode"],
           "fastest_target": fastest.get("target"), "fastest_samples_per_s": fastest["samples_per_s"]}  # fmt: skip
    if chosen is not None:
        out.update(measured_samples_per_s=chosen["samples_per_s"],
                   margin=1.0 - chosen["samples_per_s"] / fastest["samples_per_s"])  # fmt: skip
    return out


def paired_margin(rounds: list[list[dict]], choice: str, budget: int | None) -> dict | None:
    """Auto's margin with the rounds paired. Each round runs every disk row once, one after another, so a slow
    spell of the disk lands on one round of several rows; within a round, each row's samples/s over the chosen
    row's, per row their geometric mean over the rounds both ran (:func:`common.over_choice`), and how far the
    choice lies below the row with the highest mean. The median-round margin compares two rows' medians drawn
    from different rounds, which a spell in one round can tip either way. None where the choice was not measured."""
    per_round: dict[int, dict[str, float]] = {}
    chosen = None
    for got in rounds:
        for r in got:
            if "error" in r:
                continue
            name = common.config_name(r)
            if r["mode"] == choice and r.get("budget_bytes") == budget:
                chosen = name
            per_round.setdefault(r["round"], {})[name] = r["samples_per_s"]
    ratios: dict[str, list[float]] = {}
    for row in per_round.values():
        if chosen in row:
            for name, v in row.items():
                ratios.setdefault(name, []).append(v / row[chosen])
    if not ratios:
        return None
    table, margin = common.over_choice(ratios)
    return {"choice": chosen, "rows": table, "fastest": table[0]["configuration"], "margin": margin}


def _at(target) -> str:
    return "" if target is None else f" at {target:.0%}"


COLUMNS = [
    ("mode", "mode", ""),
    ("target", "target", ".2f"),
    ("coverage", "coverage", ".3f"),
    ("popular_share", "popular", ".3f"),
    ("cold_rows_per_step", "cold rows", ".0f"),
    ("disk_pages_per_step", "pages/step", ".0f"),
    ("skipped_share", "unread", ".2f"),
    ("disk_bytes_per_step", "fetch B/step", ".0f"),
    ("disk_reads_per_step", "reads/step", ".0f"),
    ("samples_per_s", "samples/s", ".0f"),
    ("step_ms", "ms/step", ".1f"),
    ("exposed_read_ms", "exposed read ms", ".1f"),
    ("predicted_ratio", "pred/meas", ".2f"),
]


MODEL_COLUMNS = [
    ("mode", "mode", ""),
    ("target", "target", ".2f"),
    ("disk_read_ms", "read", ".1f"),
    ("write_back_ms", "write-back", ".1f"),
    ("exposed_read_ms", "exposed", ".1f"),
    ("step_ms", "step", ".1f"),
    ("pred_disk_read", "pred read", ".1f"),
    ("pred_disk_write", "pred write", ".1f"),
    ("pred_disk_lane", "pred disk lane", ".1f"),
    ("pred_device", "pred compute", ".1f"),
    ("predicted_exposed_ms", "pred exposed", ".1f"),
    ("pred_step", "pred step", ".1f"),
    ("probe_scale", "disk now/cal", ".2f"),
]


def _mib(x: float | None) -> str:
    return "unknown" if x is None else f"{x / 2**20:,.1f} MiB"


def _share(x: float | None) -> str:
    return "unknown (mincore failed)" if x is None else f"{x:.0%}"


def io_summary(mmap: dict | None, k2: dict | None) -> str:
    """What the mmap baseline and the disk store read from storage, measured by the kernel's counters."""
    lines = []
    if mmap is not None:
        by_step = mmap["os_read_bytes_by_step"]
        res = mmap.get("resident_share_after")
        lines.append(
            f"{mmap['mode']} baseline (page cache {mmap['page_cache'].removeprefix('used (mmap), ')}; readahead "
            f"{mmap['readahead']}) read from "
            f"disk {_mib(mmap['os_read_bytes_per_step'])}/step "
            f"(first step {_mib(by_step[0] if by_step else None)}, last {_mib(by_step[-1] if by_step else None)}), "
            f"{mmap['major_faults_per_step']:,.0f} major faults/step; of its table ({_mib(mmap['table_bytes'])}) "
            f"in the page cache: {_share(mmap.get('resident_share_before'))} after the drop, "
            f"{_share(res)} at the end"
        )  # fmt: skip
    if k2 is not None:
        lines.append(
            f"{k2['mode']} at {k2['target']:.0%} read {_mib(k2['os_read_bytes_per_step'])}/step from disk "
            f"(the store's fetch {_mib(k2['disk_bytes_per_step'])} of the "
            f"{_mib(4096 * k2.get('disk_pages_per_step', 0.0))} its rows span: the pages only stale rows need are "
            f"left to the refresh and the write-back), the page cache {k2['page_cache']}"
        )
    return "\n".join(lines)


def why_missed(base: str, k2: dict, k0: dict | None, other: dict, hw: dict | None) -> str:
    """Why hotline K>=2 on disk missed its target against ``base``, in the run's measured figures."""
    from hotline.costmodel.disk_overlap import beside_penalties

    io = f"{k2['disk_read_ms']:.0f} ms of reads and {k2['write_back_ms']:.0f} ms of write-back per step"
    step = f"{k2['mode'].split('_')[1].upper()} takes {k2['step_ms']:.0f} ms/step, {k2['exposed_read_ms']:.0f} ms of it waiting for reads"
    pen, res = "", other.get("resident_share_after")
    if hw is not None and "step" in hw.get("disk", {}):
        t = hw["disk"]["step"]
        pen = (f"; calibrated: reads beside writes cost {t['read_write_penalty']:.2f} of the shorter, the I/O "
               f"beside compute {beside_penalties(t)}")  # fmt: skip
    if base.startswith("mmap"):
        by_step = other["os_read_bytes_by_step"]
        return (
            f"the {other['mode']} baseline read {_mib(other['os_read_bytes_per_step'])}/step from disk (first timed step "
            f"{_mib(by_step[0] if by_step else None)}, last {_mib(by_step[-1] if by_step else None)}; "
            f"{other['major_faults_per_step']:,.0f} major faults/step) and ended with {_share(res)} of its "
            f"{_mib(other['table_bytes'])} table in the page cache ({_share(other.get('resident_share_before'))} "
            f"after the drop): it reads through the page cache; the disk store's page cache is "
            f"{k2['page_cache']}, {_mib(k2['os_read_bytes_per_step'])}/step read ({io}); {step}"
        )
    if base == "device":
        return (f"device mode reads nothing from disk ({other['step_ms']:.0f} ms/step); {step}, the disk "
                f"store's I/O being {io}{pen}")  # fmt: skip
    k0_s = (
        ""
        if k0 is None
        else f" (K=0: {k0['disk_read_ms']:.0f} + {k0['write_back_ms']:.0f} ms, {k0['step_ms']:.0f} ms/step)"
    )
    return (f"hybrid's step is {other['step_ms']:.0f} ms; {step}: {io}{k0_s}, the reads beside the write-backs "
            f"and beside the compute on this machine's cores{pen}")  # fmt: skip


def summarize(rows: list[dict], rounds: list[list[dict]], hw: dict | None, prof, dataset, args, dram: int,
              placements: list[dict]) -> dict:  # fmt: skip
    """Every round priced and each disk row's typical round added to ``rows``; the tables, the targets (and why
    one was missed), auto's choice and the cost model's range printed; the report's figures returned."""
    # the typical round of each disk row stands for it (as bench_costmodel compares a prediction of a typical
    # step with the median round); every round is priced at the probes beside it
    hybrid = next((r for r in rounds[0] if "error" not in r), None)  # its cold rows: the same every round
    for got in rounds:
        if hw is not None:
            for r in got:
                price(r, hybrid, dataset, args, hw)
        rows.append(typical(got))
    by = {r["mode"]: r for r in rows if "target" not in r}
    common.print_table(rows, COLUMNS, title="disk tier (SGD; load average in the JSON: figures under load)")
    if any("predicted_ms" in r for r in rows):
        common.print_table([r for r in rows if "predicted_ms" in r], MODEL_COLUMNS,
                           title="measured and predicted ms per step (the model's disk phases and lanes)")  # fmt: skip
    target = min(args.coverages, key=lambda c: abs(c - 0.9))
    k2 = next(
        (r for r in rows if r["mode"] == f"hotline_k{args.lookahead}_disk" and r["target"] == target), None
    )
    k0 = next((r for r in rows if r["mode"] == "hotline_k0_disk" and r["target"] == target), None)
    print(io_summary(by.get("mmap"), k2))
    held = by.get("mmap_dram", {})
    targets = dict(TARGETS)
    if held.get("page_cache_limit_bytes") is None:  # no cgroup, or its run ended: judged on the unlimited run
        why = held.get("error") or held.get("page_cache", "not run")
        print(f"mmap_dram: {why}; the mmap target is judged on mmap (the page cache unlimited)")
        targets["mmap"] = targets.pop("mmap_dram")
    else:
        print(io_summary(held, None))
    verdict = {}
    for base, need in targets.items():
        if k2 is not None and base in by:
            ratio = k2["samples_per_s"] / by[base]["samples_per_s"]
            met = ratio >= need
            verdict[f"hotline_k{args.lookahead}_disk/{base}"] = {
                "ratio": ratio,
                "target": need,
                "met": met,
                "why": None if met else why_missed(base, k2, k0, by[base], hw),
            }
            print(f"hotline K={args.lookahead} disk at {target:.0%} / {base}: {ratio:.2f}x (target >= {need}x): "
                  f"{'met' if met else 'NOT met'}")  # fmt: skip
            if not met:
                print(f"  why: {verdict[f'hotline_k{args.lookahead}_disk/{base}']['why']}")
    auto = None
    if hw is not None:  # --mode auto from the same calibration (none in --smoke without --hardware)
        auto = auto_row(rows, prof, dataset, args, hw, dram, placements)
        if auto["measured"]:
            print(f"--mode auto (the same calibration, the disk store) chose {auto['choice']}{_at(auto['target'])}: "
                  f"predicted {auto['predicted_samples_per_s']:,.0f}, measured {auto['measured_samples_per_s']:,.0f} "
                  f"samples/s; fastest disk row {auto['fastest']}{_at(auto['fastest_target'])} "
                  f"({auto['fastest_samples_per_s']:,.0f}): margin {auto['margin']:.1%} (median rounds)")  # fmt: skip
            paired = auto["paired"] = paired_margin(rounds, auto["choice"], auto["hbm_budget"])
            if paired is not None:
                print(f"  rounds paired (each row over the choice in the same round, geometric mean over "
                      f"{max(t['draws'] for t in paired['rows'])} rounds): fastest {paired['fastest']}, margin "
                      f"{paired['margin']:.1%}; " + ", ".join(f"{t['configuration']} {t['mean_over_choice']:.2f} "
                      f"({t['lowest']:.2f}-{t['highest']:.2f})" for t in paired["rows"][:3]))  # fmt: skip
        else:
            print(f"--mode auto chose {auto['choice']}, a configuration this run did not measure")
    preds = [r["predicted_ratio"] for r in rows if r.get("predicted_ratio")]
    if preds:
        inside = all(0.8 <= x <= 1.25 for x in preds)
        print(f"cost model predicted/measured: {min(preds):.2f}..{max(preds):.2f} "
              f"({'all' if inside else 'NOT all'} within 0.8-1.25)")  # fmt: skip
    return {
        "results": rows,
        "targets": verdict,
        "target_met": bool(verdict) and all(v["met"] for v in verdict.values()),
        "cost_model_within_0.8_1.25": bool(preds) and all(0.8 <= x <= 1.25 for x in preds),
        "hardware_disk": hw.get("disk") if hw else None,
        "auto": auto,
    }
