"""Sharded checkpoints of Hotline's collection under DMP with torch.distributed.checkpoint (gloo, CPU).

Under DMP ``state_dict()`` holds each table as a row-wise ShardedTensor (each rank its block of rows, no rank a
whole table) and the fused optimizer's state likewise, with torchrec's sharded keys
(``embedding_bags.<table>.weight``; ``<table>.momentum1``, Adam's ``<table>.exp_avg_sq``). So
torch.distributed.checkpoint saves them, loads them on another world size (it reshards), and moves them both
ways between torchrec's own sharded EmbeddingBagCollection (table-wise, fbgemm's fused CPU kernels) and
Hotline's, resharding on the way (torchrec's 2 ranks to Hotline's 3, Hotline's 2 to torchrec's 1). Adam moves
between world sizes but not between backends here: fbgemm's CPU kernels have no Adam, so torchrec's sharded
collection cannot be built with it on a CPU. Every run here trains STOP steps of the same global batches with a checkpoint after START, resumed on
1, 2 or 3 ranks or by the other backend, and is compared with the uninterrupted one-process reference of
tests/test_torchrec_dmp.py within torchrec_workers.TOLERANCE (1e-6 relative; Adam 1e-5).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_workers as w  # noqa: E402
from ranks import spawn  # noqa: E402
from test_torchrec_dmp import assert_matches_reference  # noqa: E402

START, STOP, BATCH = 5, 10, 12  # a global batch of 12 splits over 1, 2 and 3 ranks
KINDS = ("rowwise-adagrad", "adagrad", "adam")
CROSS = (
    "rowwise-adagrad",
    "adagrad",
)  # fbgemm's CPU kernels have no Adam: torchrec's side cannot be built with it


@pytest.fixture(scope="module")
def references() -> dict:
    return w.reference_results(KINDS, STOP, BATCH)


def test_dcp_saves_on_two_ranks_and_resumes_on_one_two_and_three_and_across_backends(references, tmp_path):
    ckpt = {
        (side, kind): str(tmp_path / f"ckpt_{side}_{kind}")
        for side in ("hotline", "torchrec")
        for kind in KINDS
    }
    out = {}

    def job(side, kind, load_from, world):
        out[(side, kind, load_from, world)] = str(tmp_path / f"{side}_{kind}_{load_from}_{world}.pt")
        return (
            side,
            kind,
            START,
            STOP,
            BATCH,
            ckpt[(load_from, kind)],
            None,
            out[(side, kind, load_from, world)],
        )

    save = [("hotline", kind, 0, START, BATCH, None, ckpt[("hotline", kind)], None) for kind in KINDS]
    save += [("torchrec", kind, 0, START, BATCH, None, ckpt[("torchrec", kind)], None) for kind in CROSS]
    resume2 = [job("hotline", kind, "hotline", 2) for kind in KINDS]
    resume2 += [
        job("hotline", "rowwise-adagrad", "torchrec", 2),
        job("torchrec", "rowwise-adagrad", "hotline", 2),
    ]
    spawn(2, w.train_dcp, save + resume2)
    # across backends and world sizes: torchrec's 2-rank checkpoint resumed by Hotline on 3 ranks, Hotline's by
    # torchrec on 1 (weights and optimizer state, row-wise and per-element)
    spawn(1, w.train_dcp, [job("hotline", kind, "hotline", 1) for kind in KINDS] +
          [job("torchrec", kind, "hotline", 1) for kind in CROSS])  # fmt: skip
    spawn(3, w.train_dcp, [job("hotline", kind, "hotline", 3) for kind in KINDS] +
          [job("hotline", kind, "torchrec", 3) for kind in CROSS])  # fmt: skip
    for (side, kind, load_from, world), path in out.items():
        got = torch.load(path)
        drift = assert_matches_reference(got, *references[kind], w.TOLERANCE[kind])
        print(side, kind, "from", load_from, "on", world, "max drift", f"{max(drift.values()):.2e}")
