"""A model's parameters by name, as ``--dump-params`` writes them (``model.<name>``, ``embedding.table_<t>``):
read from a .npz without pickles, and checked against the names and shapes a model expects."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping

import numpy as np

from hotline._paths import check_file


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a parameter .npz (as ``--dump-params`` writes), no pickles; ValueError if unreadable."""
    check_file(path, "--init-params")  # a FIFO would block np.load forever
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an .npz archive of named arrays")
        with z:
            return {k: z[k] for k in z.files}
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"--init-params {path}: not a readable parameter .npz ({e})") from None


def check_params(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]]) -> None:
    """Checks parameters by name against the ``expected`` names and shapes: a missing, extra or misshapen
    tensor, or one with a non-finite value, is a ValueError naming it."""
    missing = [k for k in expected if k not in arrays]
    extra = [k for k in arrays if k not in expected]
    if missing or extra:
        raise ValueError(
            f"initial parameters: missing tensor(s) {missing[:4]}, unexpected tensor(s) {extra[:4]} "
            f"(expected the names --dump-params writes for this model and dataset)"
        )
    for k, shape in expected.items():
        a = arrays[k]
        if tuple(a.shape) != shape or not np.issubdtype(a.dtype, np.floating):
            raise ValueError(
                f"initial parameters: tensor {k} is {a.dtype}{list(a.shape)}, expected float32{list(shape)}"
            )
        if not np.isfinite(a).all():
            raise ValueError(f"initial parameters: tensor {k} has non-finite values")
