"""Hotline: train DLRM with popular embedding rows in device memory and the rest in host memory.

The package imports lazily: ``import hotline`` is cheap, and ``hotline.profile`` / ``hotline.Dataset`` pull
in numpy, numba or torch only when first used.
"""

from __future__ import annotations

import importlib
import os
import sys

# torch and Numba both run OpenMP thread teams, and Hotline's look-ahead worker runs a second team beside the
# main thread's. With OpenMP's default wait policy (libgomp: spin 300,000 times, about 10 ms on the 2-core test
# machine), idle teams burn the cores the busy one needs: on a 2-core machine with any other load a 2-thread step
# measured 4x slower than a 1-thread one. A team that never spins (OMP_WAIT_POLICY=PASSIVE alone) pays instead
# a wake-up at each parallel region: 47-62 us for a Numba region that follows another, about a third of a
# one-hot split's time, and the main job trained at 0.6x. So Hotline waits passively after a short spin
# (GOMP_SPINCOUNT, libgomp's count, 0.1 ms there): regions that follow each other within it start at once, and an
# idle team gives its core back within it (benchmarks/bench_omp_wait.py measures all three). It only takes
# effect if set before torch or Numba loads; a wait policy of the user's (either variable) wins.
_WAIT_POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""The environment variables by which a user sets OpenMP's wait policy themselves."""
_SPIN_COUNT = 3000
"""``GOMP_SPINCOUNT`` set on import when the user set no wait policy: spins before an idle OpenMP thread sleeps."""
_USER_WAIT_POLICY = bool(set(_WAIT_POLICY_VARS) & set(os.environ))
_TORCH_SPINS = "torch" in sys.modules and not _USER_WAIT_POLICY
"""True when torch was imported before this package, with no wait policy of the user's: its OpenMP runtime read
the default (spinning) policy when it loaded, and setting it now changes nothing. The look-ahead executor warns
(:func:`hotline.pipeline.threads.spinning_warning`)."""
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if not _USER_WAIT_POLICY:
    os.environ["GOMP_SPINCOUNT"] = str(_SPIN_COUNT)

__version__ = "0.1.0"

# In a source checkout (no install, or one of several worktrees beside an editable install) the kernels live in
# the top-level folder kernels/, installed as hotline.kernels: let the import system find them there, so that
# ``hotline.kernels`` is always this checkout's (the GPU image runs tests and benchmarks from a plain checkout).
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(__file__), "kernels")) and os.path.isfile(
    os.path.join(_checkout, "kernels", "__init__.py")
):
    __path__.append(_checkout)  # noqa: F821 (a package's __path__)


def _writable(folder: str) -> bool:
    """Whether a file can be made in ``folder`` (made first if missing), as Numba's cache locators probe it."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _numba_cache() -> None:
    """Numba caches compiled kernels beside their source (``kernels/__pycache__``) or in the user's cache
    folder; where neither can be written (a read-only install, no writable HOME) and no ``NUMBA_CACHE_DIR`` is
    set, every ``cache=True`` kernel failed to import ("no locator available"). Then the kernels are compiled
    without a cache, said once on stderr (once for a run's ranks too). An empty or relative ``XDG_CACHE_HOME``
    is ignored, as the XDG rule says (Numba would otherwise cache into ``./numba`` of the working folder)."""
    if os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("NUMBA_DISABLE_JIT"):
        return
    import importlib.util

    spec = importlib.util.find_spec("hotline.kernels")
    if spec is None or not spec.submodule_search_locations:
        return
    kernels = os.path.join(list(spec.submodule_search_locations)[0], "__pycache__")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG rule: an empty or relative XDG_CACHE_HOME is ignored (Numba would cache into ./numba instead)
    user = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    if _writable(kernels):
        return
    if _writable(os.path.join(user, "numba")):
        if "XDG_CACHE_HOME" in os.environ and user != xdg:
            os.environ["NUMBA_CACHE_DIR"] = os.path.join(user, "numba")  # read when numba is first imported
            if "numba" in sys.modules:
                sys.modules["numba"].config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
        return
    from numba.core.dispatcher import Dispatcher

    Dispatcher.enable_caching = lambda self: None  # compiled once per process, not kept
    if not os.environ.get("HOTLINE_SAID_NO_CACHE"):
        os.environ["HOTLINE_SAID_NO_CACHE"] = "1"
        print(f"hotline: neither {kernels} nor {user} can be written: the kernels are compiled on every run "
              "(no cache); set NUMBA_CACHE_DIR to a writable folder to keep them", file=sys.stderr)  # fmt: skip


_numba_cache()

_LAZY = {
    "Dataset": "hotline.datasets.format",
    "DatasetError": "hotline.datasets.format",
    "profile": "hotline.profiling.profiler",
    "Profile": "hotline.profiling.profile",
    "Profiler": "hotline.profiling.profiler",
    "Placement": "hotline.placement",
    "TableLayout": "hotline.table_layout",
    "TrainConfig": "hotline.training.config",
    "Trainer": "hotline.training.trainer",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotline' has no attribute {name!r}")


__all__ = sorted(_LAZY)
