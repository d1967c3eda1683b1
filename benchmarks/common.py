"""Shared helpers of the benchmarks: flags, thread setup, timing (warm-up + median of repeats), table, JSON.

A benchmark script does::

    parser = common.parser(__doc__)              # --json, --threads, --smoke, --repeats, --seed
    args = parser.parse_args(argv)               # --json judged by the output policy: refused before any work
    common.setup_threads(args.threads)           # torch and numba, on purpose
    t = common.timeit(fn, repeats=args.repeats)  # warm-up calls (Numba compile) are not timed
    common.print_table(rows, columns)
    common.write_json(args.json, {"results": rows, ...})  # adds the machine's load and library versions
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# A benchmark imports this checkout's hotline, installed or not (the GPU image runs a plain checkout): its root
# goes on sys.path right after the benchmarks folder, before any installed copy.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)
# tests/ranks.py starts the ranks of a multi-rank benchmark as it does a test's (`from ranks import spawn`): tests/
# goes last on sys.path, so no module of its shadows one of the benchmarks' or an installed package.
_TESTS = str(Path(_ROOT) / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

# Hotline's process settings, made on its import, before torch or Numba loads (its OpenMP wait policy: an
# OpenMP runtime reads it once, when it loads): a benchmark runs under the settings `hotline train` runs
# under. Imported after torch, torch's OpenMP team would spin for milliseconds after every parallel region
# (measured here: 4-8 ms of CPU during a 20 ms pause after a matmul, against 0.05 ms with hotline first).
import hotline  # noqa: E402

INPUT_FLAGS = ("data", "hardware", "host", "pool", "from_json")
"""Flags (argparse dests) whose paths a benchmark reads: its ``--json`` is never one of them nor inside one (a
calibration read and then overwritten by the results, a JSON written into a dataset directory the run reads).
Scratch folders (``--dir``, ``--cold-dir``) are not inputs: a benchmark's scratch goes into a fresh temporary
folder inside them, so a JSON beside it is safe."""

OUTPUT_FLAGS = ("json", "hardware_out")
"""Flags (argparse dests) of the files a benchmark writes."""


class Parser(argparse.ArgumentParser):
    """The benchmarks' ArgumentParser: :meth:`parse_args` also judges the outputs (:func:`judge_outputs`), so a
    bad ``--json`` is refused with one line (exit 2) before any work starts."""

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's, plus judge_outputs
        ns = super().parse_args(args, namespace)
        judge_outputs(self, ns)
        return ns


def judge_outputs(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Every output flag of ``ns`` (:data:`OUTPUT_FLAGS`) judged by the project's output policy
    (:func:`hotline.outputs.judge`) against every input flag (:data:`INPUT_FLAGS`) and the other outputs: an
    output that is or lies inside an input, two outputs on one file, a directory, a FIFO, a file in the way of
    its folder, or a file another live run writes is refused through ``p.error``. An existing results file is
    replaced (``force``: a benchmark's JSON is its own to rewrite, as ``run_all`` does every run); a link is
    followed, and its target written."""
    from hotline.outputs import Output, judge

    def flag(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    inputs = []
    for dest in INPUT_FLAGS:
        value = getattr(ns, dest, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                inputs.append((flag(dest), v))
    outputs = [Output(flag(d), getattr(ns, d)) for d in OUTPUT_FLAGS if getattr(ns, d, None) is not None]
    try:
        targets = judge(outputs, inputs=inputs, force=True)
    except ValueError as e:  # OutputError: one line, exit 2
        p.error(str(e))
    for dest in OUTPUT_FLAGS:
        if flag(dest) in targets:
            setattr(ns, dest, targets[flag(dest)])


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An ArgumentParser with the flags every benchmark has (description: the docstring's first line); its
    ``parse_args`` judges ``--json`` (:class:`Parser`)."""
    p = Parser(
        description=(doc or "").strip().splitlines()[0] if doc else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")
    p.add_argument("--threads", type=int, default=2, help="torch and numba threads")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (for the tests): checks it runs")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (Numba compile, caches)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    return p


def setup_threads(threads: int) -> int:
    """Sets torch's and numba's thread counts to ``threads`` (capped by numba's maximum); returns it."""
    import numba
    import torch

    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    return threads


@dataclass
class Timing:
    """Wall seconds of the timed runs of one measurement."""

    median_s: float
    """Median of the timed runs: the figure reported."""
    min_s: float
    """Fastest run (the least disturbed by other work on the machine)."""
    runs_s: list[float]
    """Every timed run, in order."""
    cpu_median_s: float
    """Median CPU seconds of the process per run (all threads; spin-waiting included): on a loaded
    machine, wall time grows with other work's share of the cores, CPU time much less."""


def timeit(
    fn: Callable[[], object],
    repeats: int = 7,
    warmup: int = 2,
    setup: Callable[[], object] | None = None,
) -> Timing:
    """Times ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones (``setup()`` before each call,
    untimed, e.g. to restore state an in-place update changed)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    runs, cpu = [], []
    for _ in range(repeats):
        if setup is not None:
            setup()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return Timing(statistics.median(runs), min(runs), runs, statistics.median(cpu))


def cpu_ticks() -> list[int] | None:
    """This machine's cumulative CPU ticks (``/proc/stat``'s first line: user, nice, system, idle, iowait, irq,
    softirq, steal); None where ``/proc`` does not say (not Linux)."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Share of the CPU ticks between two :func:`cpu_ticks` that the hypervisor gave to other guests (steal): on
    a virtual machine, the part of a run's time its cores were taken away (None where not known)."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    ticks = sum(after) - sum(before)
    return (after[7] - before[7]) / ticks if ticks > 0 else 0.0


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where the OS does not say)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# Environment variables that change how parallel regions behave on a busy machine (recorded with results).
THREAD_ENV = (
    "OMP_WAIT_POLICY",
    "OMP_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "NUMBA_THREADING_LAYER",
    "GOMP_SPINCOUNT",
)


def wait_policy() -> str:
    """The OpenMP wait policy in this process's environment, as ``VAR=value`` pairs ('' when none is set): what
    an OpenMP runtime that loads now reads (``hotline`` sets it on import unless the user did)."""
    return " ".join(f"{k}={os.environ[k]}" for k in hotline._WAIT_POLICY_VARS if k in os.environ)


def machine_info(threads: int) -> dict:
    """Where the figures come from: CPU count, threads, load, threading settings, library versions."""
    import numba
    import numpy
    import torch

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        layer = None
    return {
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "load_average": load_average(),
        "numba_threading_layer": layer,
        "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
        "source": source_version(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "numpy": numpy.__version__,
    }


def source_version() -> dict:
    """The git commit the code ran from and the library files changed since it (empty where not a checkout)."""
    root = Path(__file__).resolve().parent.parent

    def git(*cmd: str) -> str:
        try:
            run = subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return run.stdout if run.returncode == 0 else ""

    changed = git("status", "--porcelain", "--untracked-files=no", "--", "hotline", "kernels")
    return {"commit": git("rev-parse", "HEAD").strip(), "changed": [x[3:] for x in changed.splitlines()]}


def _cell(value: object, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and fmt:
        return format(value, fmt)
    return str(value)


def print_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]], title: str = "") -> str:
    """Prints ``rows`` as an aligned table and returns the text. ``columns``: (key, header, format spec);
    text columns are left-aligned, numbers right-aligned."""
    cells = [[_cell(r.get(k), f) for k, _, f in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(columns)]
    numeric = [
        all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows) for k, _, _ in columns
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    out = [title] if title else []
    out += [line([h for _, h, _ in columns]), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in cells]
    text = "\n".join(out)
    print(text, flush=True)
    return text


def kept_round(rounds: list[dict], keep: str = "median") -> dict:
    """The round of a run, made several times, that stands for it: ``fastest`` or ``median`` by samples/s (the
    lower middle of an even count), with every round's samples/s added to it (``rounds_samples_per_s``: the
    record itself, as a caller that logged it holds it); a run whose every round raised: its first error.
    Rounds that raised are left out."""
    if keep not in ("fastest", "median"):
        raise ValueError(f"keep must be 'fastest' or 'median', got {keep!r}")
    ok = sorted((r for r in rounds if "error" not in r), key=lambda r: r["samples_per_s"])
    if not ok:
        return rounds[0]
    rec = ok[-1] if keep == "fastest" else ok[(len(ok) - 1) // 2]
    rec["rounds_samples_per_s"] = [r["samples_per_s"] for r in rounds if "error" not in r]
    return rec


def config_name(run: dict) -> str:
    """A measured run's configuration as the pooled tables name it: its mode, and its coverage target if any."""
    target = run.get("target")
    return run["mode"] if target is None else f"{run['mode']} at {target:.0%}"


def over_choice(ratios: dict[str, list[float]]) -> tuple[list[dict], float]:
    """Configurations pooled against ``--mode auto``'s choice: ``ratios`` maps each configuration to its
    samples/s over the choice's, one ratio per draw (a run, or a round); per configuration, the geometric mean
    of them and their range (``mean_over_choice``, ``lowest``, ``highest``), fastest first; and the margin, how
    far the choice lies below the configuration with the highest mean (0 when none is above it)."""
    import math
    import statistics

    table = [
        {"configuration": name, "draws": len(v), "mean_over_choice": math.exp(statistics.fmean(map(math.log, v))),
         "lowest": min(v), "highest": max(v)}
        for name, v in ratios.items()
    ]  # fmt: skip
    table.sort(key=lambda t: -t["mean_over_choice"])
    return table, max(0.0, 1.0 - 1.0 / table[0]["mean_over_choice"])


def write_json(path: Path | None, payload: dict) -> None:
    """Writes ``payload`` to ``path`` (if given) as indented JSON, atomically; dataclasses become dicts."""
    if path is None:
        return
    from hotline._io import write_text  # atomic: a run killed mid-write leaves the previous JSON whole

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(payload, indent=2, default=_jsonable) + "\n")


def _jsonable(x: object) -> object:
    if isinstance(x, os.PathLike):  # a dataset or hardware path in a stage's args
        return os.fspath(x)
    if hasattr(x, "__dataclass_fields__"):
        return asdict(x)
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")


# A run whose lookups hit hot rows this often is device mode plus a dispatch: never a hotline result.
SATURATED_COVERAGE = 0.999


def budgets_for_coverage(prof, targets: Sequence[float], heldout: bool = False) -> list[dict]:
    """For each target access coverage, the smallest budget (in rows of ``prof``'s ranking) whose coverage
    reaches it: over the profiled sample (``heldout=False``: when the profile is the run's own data, what the
    run touches) or the profile's held-out samples. Targets above what any budget reaches are dropped (with a
    note). Returns dicts: target, hot_rows, budget_bytes, profiled_coverage."""
    import numpy as np

    if heldout and prof.heldout is not None:
        cov = prof.heldout.hits_cum / max(1, prof.heldout.total_lookups)
    else:
        cov = prof._cum_counts / max(1, prof.total_lookups)
    out = []
    for t in targets:
        k = int(np.searchsorted(cov, float(t) - 1e-12))
        if k >= cov.shape[0]:
            print(f"coverage target {t:.0%} is out of reach (at most {cov[-1]:.1%}): skipped", flush=True)
            continue
        out.append(
            {
                "target": float(t),
                "hot_rows": k,
                "budget_bytes": k * prof.bytes_per_row,
                "profiled_coverage": float(cov[k]),
            }
        )
    return out


def measured(counters: dict, samples: int, steps: int) -> dict:
    """What a tiered run saw, from its summed step counters: coverage (lookups that hit hot rows), popular
    share, unique cold rows per step, and whether it was saturated (coverage >= SATURATED_COVERAGE)."""
    if not counters.get("lookups"):
        return {"coverage": None, "popular_share": None, "cold_rows_per_step": None, "saturated": None}
    coverage = counters["hot_lookups"] / counters["lookups"]
    return {
        "coverage": coverage,
        "popular_share": counters["popular_samples"] / max(1, samples),
        "cold_rows_per_step": counters["working_set_rows"] / max(1, steps),
        "saturated": coverage >= SATURATED_COVERAGE,
    }
