"""``apply_optimizer_in_backward`` through torchrec's own ``TrainPipelineSparseDist`` on 2 gloo ranks: Hotline's
collection under DMP against torchrec's sharded EmbeddingBagCollection (table-wise, fbgemm's fused CPU kernels)
on the same global batches, within a measured noise floor.

The floor, as in tests/reference.py: torchrec's run repeated with each global batch's samples permuted (the same
maths, rounded in another order, :data:`ORDERS` orders) stands some distance from its run in file order; the
largest of these distances (parameters: max |a - b| / max |a| over every tensor; losses: relative, per step),
at least float32's epsilon, is the floor. Hotline's run must stand within ``reference.NOISE_FACTOR`` floors of
torchrec's file-order run: a real error (an update lost, the default optimizer left in place, a stale row) is
orders of magnitude larger.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_idiom_workers as iw  # noqa: E402
from ranks import spawn  # noqa: E402
from reference import NOISE_FACTOR  # noqa: E402

STEPS, BATCH, ORDERS = 10, 16, 3
KINDS = ("sgd", "rowwise-adagrad", "adagrad")
"""The optimizers fbgemm's CPU kernels have (not Adam: "Optimizer adam is not supported in CPU mode")."""


def distance(a: dict, b: dict) -> float:
    """The largest max |a - b| / max |a| over the tensors of two state dicts."""
    assert sorted(a) == sorted(b)
    return max(float((b[k] - a[k]).abs().max()) / max(float(a[k].abs().max()), 1e-30) for k in a)


def loss_distance(a: list[float], b: list[float]) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(b - a) / np.abs(a)))


def test_apply_optimizer_in_backward_through_train_pipeline_sparse_dist_equals_torchrec(tmp_path):
    jobs = [
        (side, kind, order, STEPS, BATCH, str(tmp_path / f"{side}_{kind}_{order}.pt"))
        for kind in KINDS
        for side, order in [("hotline", None), ("torchrec", None), *[("torchrec", o) for o in range(ORDERS)]]
    ]
    spawn(2, iw.train_pipelined, jobs)
    got = {(side, kind, order): torch.load(out) for side, kind, order, _, _, out in jobs}
    eps = float(np.finfo(np.float32).eps)
    for kind in KINDS:
        ref = got[("torchrec", kind, None)]
        floor = max(
            [eps] + [distance(ref["state"], got[("torchrec", kind, o)]["state"]) for o in range(ORDERS)]
        )
        loss_floor = max(
            [eps]
            + [loss_distance(ref["losses"], got[("torchrec", kind, o)]["losses"]) for o in range(ORDERS)]
        )
        ours = got[("hotline", kind, None)]
        err, loss_err = distance(ref["state"], ours["state"]), loss_distance(ref["losses"], ours["losses"])
        print(f"{kind}: params {err:.2e} (floor {floor:.2e}), losses {loss_err:.2e} (floor {loss_floor:.2e})")
        assert err <= NOISE_FACTOR * floor, (kind, err, floor)
        assert loss_err <= NOISE_FACTOR * loss_floor, (kind, loss_err, loss_floor)
