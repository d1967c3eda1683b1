"""Checks before the first training step: every output can be written, the input data is finite.

A run that would fail after hours (an unwritable ``--dump-params``, a ``--checkpoint-dir`` below a file) fails
here, before any step, with one clear line naming the flag. Every output is treated the same way: its
directory is created if missing (as the writers do), and a real temporary file (a name only Hotline uses) is
created and removed in it, so permissions, read-only mounts and full disks are all seen.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from hotline._io import temporary_name


def _probe(directory: Path, flag: str, path: str | os.PathLike) -> None:
    """Creates the directory if missing and writes and removes a temporary file in it (ValueError if not)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = temporary_name(directory / "preflight")
        with open(probe, "wb") as f:
            f.write(b"\0")
        probe.unlink()
    except OSError as e:
        blocker = next((a for a in (directory, *directory.parents) if a.exists() and not a.is_dir()), None)
        why = f"{blocker} is a file, not a directory" if blocker is not None else (e.strerror or str(e))
        raise ValueError(f"{flag} {path}: cannot write there ({why})") from None


def check_outputs(outputs: dict[str, str | os.PathLike | None], directories: dict | None = None) -> None:
    """Raises ValueError naming the flag unless every file in ``outputs`` (flag -> path) and every directory
    in ``directories`` (flag -> path) can be written; None entries are skipped."""
    for flag, path in outputs.items():
        if path is None:
            continue
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"{flag} {path} is a directory: give a file name")
        _probe(p.parent, flag, path)
    for flag, path in (directories or {}).items():
        if path is None:
            continue
        p = Path(path)
        if p.exists() and not p.is_dir():
            raise ValueError(f"{flag} {path} exists and is not a directory")
        _probe(p, flag, path)


def check_train_outputs(config, save: str | os.PathLike | None = None) -> None:
    """The outputs of a training run (``--metrics``, ``--dump-params``, ``--save``, ``--checkpoint-dir``)."""
    files = {"--metrics": config.metrics_path, "--dump-params": config.dump_params_path, "--save": save}
    check_outputs(files, {"--checkpoint-dir": config.checkpoint_dir})


def check_finite(dataset_path, split, start: int, dense: np.ndarray, labels: np.ndarray) -> None:
    """Raises DatasetError naming the file and row if a dense feature or label of rows ``start..`` of
    ``split`` is NaN or infinite (it would turn the loss into NaN much later)."""
    from hotline.datasets.format import DatasetError

    for kind, a in (("dense", dense), ("labels", labels)):
        bad = ~np.isfinite(a)
        if bad.any():
            where = np.argwhere(bad)[0]
            row = start + int(where[0])
            column = f", column {int(where[1])}" if a.ndim > 1 else ""
            raise DatasetError(
                f"{Path(dataset_path) / f'{split.name}_{kind}.npy'}, row {row}{column}: the value is {float(a[tuple(where)])}; "
                f"the input data must be finite (regenerate or clean the dataset)"
            )


def finite_json(record) -> str:
    """``record`` as strict JSON: NaN and infinities (an empty split's AUC) become null."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(record), allow_nan=False)
