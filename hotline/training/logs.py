"""What a training run prints while it runs: a progress bar on a terminal, else one line per report (like the
reference DLRM's ``Finished training it ...`` lines), and a note before Numba compiles the kernels."""

from __future__ import annotations

import importlib
import os
import sys

# The kernel modules a training step calls (their first call compiles, unless Numba's cache has them).
STEP_KERNELS = ("hotline.kernels.sparse_update", "hotline.kernels.dispatch", "hotline.kernels.gather")


def kernels_need_compiling(modules: tuple[str, ...] = STEP_KERNELS) -> bool:
    """Whether a kernel module of ``modules`` has none of its kernels compiled, in this process or in Numba's
    on-disk cache: the state after installing (or after editing the module), when the first step compiles.
    A module some of whose kernels are cached was compiled before (the rest are variants this run may not
    call), so it does not count."""
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return False
    for name in modules:
        module = importlib.import_module(name)
        kernels = [k for k in vars(module).values() if isinstance(k, CPUDispatcher)]
        cached = [_compiled_or_cached(k) for k in kernels]
        if kernels and not any(cached):
            return True
    return False


COMPILE_NOTE = "compiling kernels, once (about 30 s on 2 cores; later runs reuse Numba's cache) ..."


def note_first_compile(modules: tuple[str, ...], stream=None, terminal_only: bool = False) -> bool:
    """Prints :data:`COMPILE_NOTE` on ``stream`` (stderr) if a kernel module of ``modules`` will compile now;
    returns whether it did. A first run otherwise sits silent (a progress bar at 0%) while Numba compiles.
    ``terminal_only``: only where a person watches (a command whose input checks come after this point must
    keep its error a single line in logs and pipes)."""
    stream = stream if stream is not None else sys.stderr
    if terminal_only and not getattr(stream, "isatty", lambda: False)():
        return False
    if not kernels_need_compiling(modules):
        return False
    print(COMPILE_NOTE, file=stream, flush=True)
    return True


def _compiled_or_cached(kernel) -> bool:
    if kernel.signatures:
        return True
    index = getattr(getattr(getattr(kernel, "_cache", None), "_cache_file", None), "_index_path", None)
    return index is None or os.path.exists(index)  # no cache=True: not a first-run matter


def format_line(rec: dict, total: int) -> str:
    """One report as a log line: step, loss, samples/s, ms/step, and the tier figures the record has."""
    parts = [
        f"step {rec['step']}/{total}",
        f"loss {rec['loss']:.4f}",
        f"{rec['samples_per_s']:,.0f} samples/s",
    ]
    if "ms_per_step" in rec:
        parts.append(f"{rec['ms_per_step']:.2f} ms/step")
    if "hot_lookup_share" in rec:
        parts.append(f"hit rate {rec['hot_lookup_share']:.1%}")
    popular = rec.get("popular_sample_share")
    if popular is not None and (popular or "overlap_ratio" in rec):  # not hybrid's 0: it has no popular batch
        parts.append(f"popular {rec['popular_sample_share']:.1%}")
    if "overlap_ratio" in rec:
        parts.append(f"overlap {rec['overlap_ratio']:.2f}")
    return "  ".join(parts)


class LogLines:
    """Rank 0's running output: a bar when asked for and stderr is a terminal, else a line per report."""

    def __init__(self, enabled: bool, bar: bool, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = enabled and bar and isatty
        self.lines = enabled and not self.bar
        self._steps_seen = 0

    def before_first_step(self) -> None:
        if self.enabled:
            note_first_compile(STEP_KERNELS, self.stream)

    def after_step(self, bar, step: int) -> None:
        """After the run's first step (compilation, warm-up) the bar's clock restarts: no ETA from it."""
        self._steps_seen += 1
        if self._steps_seen == 1 and self.bar:
            bar.reset(total=bar.total)
            bar.initial = bar.n = bar.last_print_n = step
            bar.refresh()

    def report(self, rec: dict, total: int) -> None:
        if self.lines:
            print(format_line(rec, total), file=self.stream, flush=True)
