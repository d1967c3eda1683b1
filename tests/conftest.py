import atexit
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# The tests import this checkout's hotline, in this process and in the subprocesses they start (``python -m
# hotline``), even where another checkout is installed in editable mode or none is installed at all.
_ROOT = str(Path(__file__).resolve().parents[1])
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

# Tests share two cores between torch and numba: keep both small and deterministic.
os.environ.setdefault("NUMBA_NUM_THREADS", "2")
# The tests' own cache (the built-in dataset, this CPU's calibration for --mode auto) for the session, never the
# user's ~/.cache/hotline: a calibration timed while the suite runs describes a busy machine, not this host, and
# every later `hotline train` on it would be priced with it.
if not os.environ.get("HOTLINE_CACHE"):
    _cache = tempfile.mkdtemp(prefix="hotline-test-cache-")
    os.environ["HOTLINE_CACHE"] = _cache
    atexit.register(shutil.rmtree, _cache, True)
# hotline before any test module's torch, as `hotline train` runs: torch's OpenMP threads then wait passively
import hotline  # noqa: E402,F401

warnings.filterwarnings("ignore", category=DeprecationWarning, module="fbgemm_gpu")
