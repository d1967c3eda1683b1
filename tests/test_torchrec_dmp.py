"""Hotline's collection under torchrec's DistributedModelParallel with Hotline's sharder (gloo, CPU), against
torchrec's own DLRM over torchrec's EmbeddingBagCollection trained in one process with dense gradients.

Each rank trains on its slice of every global batch; DDP averages the dense gradients and the sharded
collection divides the embedding gradients by the world size (torchrec's gradient division), so N ranks train
like one process on the global batch. Where the sums are the same the results are bit-identical; elsewhere the
difference is floating-point reassociation, bounded here by 1e-6 relative (Adam 1e-5: torchrec_workers.TOLERANCE):
- an embedding row looked up several times in a batch: torch's EmbeddingBag backward and Hotline's sparse
  kernel add the lookups' gradients in different orders;
- two ranks: every gradient is a sum of two per-rank sums (DDP's all-reduce, the owners' sums) where the
  reference sums the global batch in one pass;
- row-wise Adagrad: Hotline computes ``w - g * (lr / (sqrt(s) + eps))``, torchrec's RowWiseAdagrad
  ``w - lr * g / (sqrt(s) + eps)``;
- Adagrad (FBGEMM's EXACT_ADAGRAD): the reference is fbgemm's own CPU update, torchrec's
  FusedEmbeddingBagCollection trained with the same fused optimizer; Adam (FBGEMM's ADAM, which fbgemm's CPU
  TBE does not have): FBGEMM's formula in plain PyTorch (``torchrec_workers.FbgemmAdam``). Each rounds the
  same formulas in its own order.
Through torchrec's TrainPipelineSparseDist and the prefetch pipeline (whose prefetch hook fetches the next
batch's cold rows early, under the claim rule) training is bit-identical to the plain loop.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_workers as w  # noqa: E402
from ranks import spawn  # noqa: E402

STEPS, BATCH = 20, 16
JOBS = [("sgd", "plain"), ("rowwise-adagrad", "plain"), ("sgd", "sparse_dist"), ("sgd", "prefetch"),
        ("rowwise-adagrad", "prefetch"), ("adagrad", "plain"), ("adam", "plain"), ("adam", "prefetch")]  # fmt: skip
KINDS = ("sgd", "rowwise-adagrad", "adagrad", "adam")


def run(world: int, tmp_path) -> dict:
    jobs = [(kind, pipe, STEPS, BATCH, str(tmp_path / f"{world}_{kind}_{pipe}.pt")) for kind, pipe in JOBS]
    spawn(world, w.train_dmp, jobs)
    return {(kind, pipe): torch.load(out) for kind, pipe, _, _, out in jobs}


@pytest.fixture(scope="module")
def references() -> dict:
    out = {}
    for kind in KINDS:
        model, optim = w.train_reference(kind, STEPS, BATCH)  # optim: fbgemm's (or FbgemmAdam's) state
        model.eval()
        with torch.no_grad():
            _, (_, logits, _) = model(w.batch(999, BATCH))
        out[kind] = (model.state_dict(), logits.reshape(-1), optim)
    return out


def assert_matches_reference(
    got: dict, ref_state: dict, ref_logits: torch.Tensor, tol: float = 1e-6
) -> dict[str, float]:
    """Every key of torchrec's state_dict, within ``tol`` relative (see the module docstring); the drift per key."""
    assert sorted(got["state"]) == sorted(ref_state)
    drift = {}
    for k, want in ref_state.items():
        have = got["state"][k]
        assert have.shape == want.shape, k
        scale = max(float(want.abs().max()), 1e-30)
        drift[k] = float((have - want).abs().max()) / scale
        assert drift[k] <= tol, (k, drift[k])
    logit_drift = float((got["logits"] - ref_logits).abs().max()) / float(ref_logits.abs().max())
    assert logit_drift <= tol
    return drift


def assert_pipelines_equal_plain(results: dict) -> None:
    for kind, pipe in JOBS:
        plain = results[(kind, "plain")]
        got = results[(kind, pipe)]
        for k, v in plain["state"].items():
            assert torch.equal(got["state"][k], v), (kind, pipe, k)
        assert torch.equal(got["logits"], plain["logits"])
        for key, state in plain["optim"]["state"].items():
            for name, t in state.items():
                assert torch.equal(got["optim"]["state"][key][name], t), (kind, pipe, name)
    for kind in (
        "sgd",
        "rowwise-adagrad",
        "adam",
    ):  # the look-ahead really read rows an earlier step was to update
        assert results[(kind, "prefetch")]["refreshed"] > 0
        assert results[(kind, "plain")]["refreshed"] == 0


@pytest.mark.parametrize("world", [1, 2])
def test_dmp_with_hotline_sharder_trains_like_torchrec(world, references, tmp_path):
    results = run(world, tmp_path)
    for kind in KINDS:
        drift = assert_matches_reference(results[(kind, "plain")], *references[kind][:2], w.TOLERANCE[kind])
        if world == 1 and kind == "sgd":  # one rank, SGD: every dense layer is bit-identical
            assert all(v == 0.0 for k, v in drift.items() if "embedding_bags" not in k), drift
    # row-wise Adagrad's accumulators as torchrec's sharded collection keys them (whole tables: the ranks' blocks)
    prefix = "model.sparse_arch.embedding_bag_collection.embedding_bags"
    optim = results[("rowwise-adagrad", "plain")]["optim"]["state"]
    assert optim[f"{prefix}.t_1.weight"]["t_1.momentum1"].shape == (w.SIZES[1],)
    assert results[("sgd", "plain")]["optim"]["state"] == {}
    # Adagrad's accumulators and Adam's moments: [rows, D] each, named as torchrec's sharded collection names
    # them (fbgemm's momentum1, exp_avg_sq), equal to fbgemm's
    for kind, names in (("adagrad", ["momentum_1"]), ("adam", ["momentum_1", "momentum_2"])):
        optim, fbgemm = results[(kind, "plain")]["optim"]["state"], references[kind][2]["state"]
        for t in range(len(w.SIZES)):
            ours = optim[f"{prefix}.t_{t}.weight"]
            sharded = {"momentum_1": "momentum1", "momentum_2": "exp_avg_sq"}
            assert sorted(ours) == sorted(f"t_{t}.{sharded[n]}" for n in names)
            for name in names:
                have, want = ours[f"t_{t}.{sharded[name]}"], fbgemm[f"t_{t}.weight"][f"t_{t}.weight.{name}"]
                assert have.shape == want.shape == (w.SIZES[t], w.D), (kind, name)
                bound = w.TOLERANCE[kind] * float(want.abs().max())
                assert float((have - want).abs().max()) <= bound, (kind, name)
    assert_pipelines_equal_plain(results)
