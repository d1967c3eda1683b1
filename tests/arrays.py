"""Named arrays the tests compare: a run's trained parameters and optimizer state, and the check that two sets
are the same bit for bit. Tests import it as ``arrays`` (pytest puts tests/ on ``sys.path``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def assert_equal_arrays(a: Mapping, b: Mapping, where: object = "") -> None:
    """``a`` and ``b`` (dicts, or ``np.load`` of an .npz) hold the same names, each with the same array, bit for
    bit; a failure names the array (and ``where``, when given)."""
    assert set(a.keys()) == set(b.keys()), (where, sorted(a.keys()), sorted(b.keys()))
    for k in a.keys():
        assert np.array_equal(a[k], b[k]), (where, k) if where else k


TIMING = ("step_end_s", "stale_rows", "bytes_sent")
"""What a run's dump (``ranks.train_and_dump``) holds that depends on timing: how far ahead it fetched."""


def assert_equal_runs(a: Mapping, b: Mapping) -> None:
    """Two runs' dumps hold the same names and the same arrays bit for bit, but for their :data:`TIMING`."""
    assert sorted(a.keys()) == sorted(b.keys()), (sorted(a.keys()), sorted(b.keys()))
    for k in a.keys():
        if k not in TIMING:
            assert np.array_equal(a[k], b[k]), k


def fitted_arrays(ds, cfg) -> dict:
    """Trains ``cfg`` on ``ds`` to the end (``Trainer.fit``) and returns its named arrays; the trainer is closed."""
    from hotline import Trainer

    tr = Trainer(cfg, ds)
    try:
        tr.fit()
        return tr.named_arrays()
    finally:
        tr.close()
