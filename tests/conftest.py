import os
import warnings

# Tests share two cores between torch and numba: keep both small and deterministic.
os.environ.setdefault("NUMBA_NUM_THREADS", "2")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="fbgemm_gpu")
