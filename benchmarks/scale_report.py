"""bench_scale's printed report: the figures of the stages that ran, hotline and the baseline side by side, and
what bounds a step (the disk's random read rate against the pages a step reads from disk, past the hot rows and
the DRAM tier)."""

from __future__ import annotations

GIB = 1 << 30


def print_report(out: dict, dim: int, batch: int) -> None:
    """Everything :func:`bench_scale.main` gathered in ``out``, as lines a person reads (stages not run: left
    out)."""
    print(
        f"{out['rows']:,} rows at dim {dim}, row-wise Adagrad: {out['table_bytes'] / GIB:.2f} GiB of rows and state"
    )
    print(f"memory limit: {out['limit']['how']}")
    peak, failcnt = out["cgroup_peak_bytes"], out["cgroup_failcnt"]
    peak_text = "n/a" if peak is None else f"{peak / GIB:.2f} GiB"
    print(f"peak: cgroup {peak_text} (failcnt {failcnt}), child RSS {out['ru_maxrss_bytes'] / GIB:.2f} GiB; "
          f"disk: {out['disk_peak_bytes'] / 1e9:,.1f} GB at most beside the data")  # fmt: skip
    if "samples_per_s" in out:
        print(f"per-row host bytes: {out['per_row_host_bytes']:.2f} ({out['per_row_structures']}); the file's "
              f"positions {out['positions_bytes'] / 1e6:,.1f} MB; DRAM tier (--cold-cache "
              f"{out['cold_cache_flag']}) {out['dram_tier_bytes'] / GIB:.2f} GiB, {out['dram_tier_rows']:,} rows")  # fmt: skip
        print(f"first step after {out['first_step_s']:.1f} s; {out['samples_per_s']:,.0f} samples/s")
        if out.get("cpu_in_steps"):  # what else the machine did meanwhile: a noisy run shows here
            cpu, f, vm = out["cpu_in_steps"], out["faults_per_step"], out.get("vmstat_in_steps", {})
            print("in the timed steps: CPU " + ", ".join(f"{k} {v:.0%}" for k, v in cpu.items() if v >= 0.005)
                  + f"; page faults a step {f['minor']:,.0f} minor, {f['major']:,.0f} major; cgroup limit reached "
                  f"{out['cgroup_in_steps'].get('failcnt', 0):,} times; kernel: {vm}")  # fmt: skip
        if out.get("held"):
            h = out["held"]
            print(f"held writes: {h['bytes'] / 2**20:,.0f} MiB for {h['capacity_rows']:,} rows, {h['rows_added_per_step']:,.0f} "
                  f"added a step: a sweep every {h['steps_per_sweep']:,.0f} steps; one sweep of the {h['rows_held']:,} "
                  f"held after the timed steps {h['sweep_s']:.1f} s, a long run's at most {h['sweep_bound_s']:.1f} s (the "
                  f"file read and written at the sequential rate); samples/s with sweeps spread: "
                  f"{h['samples_per_s_measured_sweep']:,.0f} (this sweep), {h['samples_per_s_sweep_bound']:,.0f} (the bound)")  # fmt: skip
        su, rate = out["startup_s"], out["disk_write_mb_per_s"]
        print("start-up: " + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in su.items()) + f"; bound 2 x file / "
              f"seq-rate + profile = {out['first_step_bound_s']:.1f} s ({out['file_bytes'] / 1e9:.2f} GB at "
              f"{rate:,.0f} MB/s)")  # fmt: skip
        hwm = out["checkpoint_peak_rss_bytes"]
        print(f"checkpoint: {out['checkpoint_bytes'] / 1e6:,.0f} MB written in {out['checkpoint_s']:.1f} s "
              f"(rows never written: a bit each), the table's {out['table_bytes'] / 1e6:,.0f} MB at "
              f"{out['table_bytes'] / 1e6 / out['checkpoint_s']:,.0f} MB/s, "
              f"{out['checkpoint_mb_per_s']:,.0f} MB/s written (the disk's sequential write: "
              f"{out['disk_write_mb_per_s']:,.0f} MB/s); RSS {out['rss_before_checkpoint_bytes'] / GIB:.2f} GiB "
              f"before it, peak {'n/a' if hwm is None else f'{hwm / GIB:.2f} GiB'} during it")  # fmt: skip
        print(f"delta checkpoint {out['delta_checkpoint_steps']} steps later (the rows written since the full "
              f"one): {out['delta_checkpoint_bytes'] / 1e6:,.1f} MB in {out['delta_checkpoint_s']:.1f} s")  # fmt: skip
    if "written" in out:
        w, per = out["written"], out["written"]["phases"]["counters_per_step"]
        ph = ", ".join(
            f"{k} {v * 1e3:.1f}" for k, v in sorted(out["written"]["phases"]["seconds_per_step"].items())
        )
        h = w.get("held") or {}
        print(f"rows written first (--no-cold-lazy): first step after {w['first_step_s']:.1f} s (fill "
              f"{w['startup_s'].get('fill_s', 0):.1f} s); {w['samples_per_s']:,.0f} samples/s, disk rows a step "
              f"{per.get('disk_rows', 0):,.0f}, read {per.get('disk_pages', 0):,.0f} pages in "
              f"{per.get('disk_reads', 0):,.0f} reads, drawn {per.get('drawn_rows', 0):,.0f}; a sweep of "
              f"{h.get('rows_held', 0):,} held {h.get('sweep_s', 0):.1f} s, every {h.get('steps_per_sweep', 0):,.0f} "
              f"steps; phases (ms) {ph}")  # fmt: skip
    if "load_s" in out:
        print(f"resume: load {out['load_s']:.1f} s; resumed bit-identically: {out['resume_exact']}")
    if "export" in out:
        e = out["export"]
        print(f"export (dcp): {e['bytes'] / 1e6:,.0f} MB in {e['seconds']:.1f} s, {e['mb_per_s']:,.0f} MB/s (the "
              f"rows file read once); peak RSS {(e['peak_rss_bytes'] or 0) / GIB:.2f} GiB")  # fmt: skip
    _print_stages(out)
    if "samples_per_s" in out and "baseline" in out:
        _print_side_by_side(out, batch)


def _print_stages(out: dict) -> None:
    for name in ("evaluate", "predict"):
        if name not in out["stages"]:
            continue
        st = out["stages"][name]
        print(f"hotline {name} on the checkpoint: exit {st['exit']}, {st['seconds']:.1f} s, peak RSS "
              f"{st['peak_rss_bytes'] / 2**30:.2f} GiB: {out[name]['last_line'][:120]}")  # fmt: skip
    if "phases" not in out:
        return
    ph = out["phases"]
    print(
        f"hotline's step, mean of {ph['steps']} steps (ms; dispatch/gather/disk_read run ahead on the "
        "look-ahead thread, write_back on its own, stall is what the step waited for them):"
    )
    print("  " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ph["seconds_per_step"].items()))
    keep = (
        "disk_pages",
        "disk_reads",
        "disk_rows",
        "drawn_rows",
        "working_set_rows",
        "stale_rows",
        "rows_touched",
    )
    print("  per step: " + ", ".join(f"{k} {ph['counters_per_step'][k]:,.0f}" for k in keep
                                     if k in ph["counters_per_step"]))  # fmt: skip


def _print_side_by_side(out: dict, batch: int) -> None:
    """hotline and the baseline from this one run, the ceiling's parts, and what bounds a step."""
    m, b, c = out["measured"], out["baseline"], out["ceiling"]
    print(f"baseline: {b['what']}")
    print(f"{'':>22} {'hotline':>12} {'baseline':>12}")
    print(
        f"{'samples/s':>22} {out['samples_per_s']:>12,.0f} {b['samples_per_s']:>12,.0f}"
        f"   hotline/baseline {out['samples_per_s'] / max(b['samples_per_s'], 1e-9):.2f}x"
    )
    if out.get("held"):
        bound = out["held"]["samples_per_s_sweep_bound"]
        print(f"{'with sweeps (bound)':>22} {bound:>12,.0f} {b['samples_per_s']:>12,.0f}"
              f"   hotline/baseline {bound / max(b['samples_per_s'], 1e-9):.2f}x")  # fmt: skip
    w = out.get("written")
    if w:  # every row written first: each disk row a step asks for is read, none drawn (a long run's steps)
        rate = (w.get("held") or {}).get("samples_per_s_measured_sweep", w["samples_per_s"])
        for name, v in (("rows written first", w["samples_per_s"]), ("  with sweeps (measured)", rate)):
            print(f"{name:>22} {v:>12,.0f} {b['samples_per_s']:>12,.0f}"
                  f"   hotline/baseline {v / max(b['samples_per_s'], 1e-9):.2f}x")  # fmt: skip
    print(
        f"{'first step s':>22} {out['first_step_s']:>12.1f} {b['fill_s'] + b['first_step_s']:>12.1f}"
        f"   (baseline: {b['fill_s']:.1f} s of writing its files, then the step)"
    )
    hw = out["hotline_peak_rss_bytes"]
    print(f"{'peak RSS GiB':>22} {(hw or 0) / GIB:>12.2f} {(b['peak_rss_bytes'] or 0) / GIB:>12.2f}")
    print(
        f"coverage (lookups on hot rows) {m.get('hot_lookup_share', 0):.3f}, popular samples "
        f"{m.get('popular_sample_share', 0):.3f}, cold rows per step {m.get('cold_rows_per_step', 0):,.0f}, "
        f"of them from the DRAM tier {m['dram_row_share']:.3f} and from disk {m['disk_rows_per_step']:,.0f}; "
        f"disk pages per step {m['disk_pages_per_step']:,.0f} ({m['rows_per_page']:.0f} rows a page)"
    )
    r1, r32 = c["random_4k_reads_per_s_depth1"], c["random_4k_reads_per_s_depth32"]
    disk = m["disk_pages_per_step"] / max(r32, 1e-9)
    held = bool(out.get("held"))
    print(
        f"ceiling with the DRAM tier: random 4 KiB reads {r1:,.0f}/s at depth 1, {r32:,.0f}/s at depth 32 -> the "
        f"disk reads of a step {disk * 1e3:.0f} ms at depth 32 (once every row is on disk, not drawn), "
        + ("the writes held and swept in order" if held else "as many pages written back")
        + f"; dense compute alone {c['dense_step_s'] * 1e3:.0f} ms; ceiling "
        f"{batch / max(disk, c['dense_step_s'], 1e-9):,.0f} samples/s (reads alone), "
        f"{batch / max(2 * disk, c['dense_step_s'], 1e-9):,.0f} (reads and page writes at that rate)"
    )
