"""Hotline's collection under torchrec's DistributedModelParallel with Hotline's sharder (gloo, CPU), against
torchrec's own DLRM over torchrec's EmbeddingBagCollection trained in one process with dense gradients.

Each rank trains on its slice of every global batch; DDP averages the dense gradients and the sharded
collection divides the embedding gradients by the world size (torchrec's gradient division), so N ranks train
like one process on the global batch. Where the sums are the same the results are bit-identical; elsewhere the
difference is floating-point reassociation, bounded here by 1e-6 relative:
- an embedding row looked up several times in a batch: torch's EmbeddingBag backward and Hotline's sparse
  kernel add the lookups' gradients in different orders;
- two ranks: every gradient is a sum of two per-rank sums (DDP's all-reduce, the owners' sums) where the
  reference sums the global batch in one pass;
- row-wise Adagrad: Hotline computes ``w - g * (lr / (sqrt(s) + eps))``, torchrec's RowWiseAdagrad
  ``w - lr * g / (sqrt(s) + eps)``.
Through torchrec's TrainPipelineSparseDist and the prefetch pipeline (whose prefetch hook fetches the next
batch's cold rows early, under the claim rule) training is bit-identical to the plain loop.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_workers as w  # noqa: E402

from hotline.distributed.launcher import spawn  # noqa: E402

STEPS, BATCH = 20, 16
JOBS = [("sgd", "plain"), ("rowwise-adagrad", "plain"), ("sgd", "sparse_dist"), ("sgd", "prefetch"),
        ("rowwise-adagrad", "prefetch")]  # fmt: skip


def run(world: int, tmp_path) -> dict:
    jobs = [(kind, pipe, STEPS, BATCH, str(tmp_path / f"{world}_{kind}_{pipe}.pt")) for kind, pipe in JOBS]
    spawn(world, w.train_dmp, jobs)
    return {(kind, pipe): torch.load(out) for kind, pipe, _, _, out in jobs}


@pytest.fixture(scope="module")
def references() -> dict:
    out = {}
    for kind in ("sgd", "rowwise-adagrad"):
        model = w.train_reference(kind, STEPS, BATCH)
        model.eval()
        with torch.no_grad():
            _, (_, logits, _) = model(w.batch(999, BATCH))
        out[kind] = (model.state_dict(), logits.reshape(-1))
    return out


def assert_matches_reference(got: dict, ref_state: dict, ref_logits: torch.Tensor) -> dict[str, float]:
    """Every key of torchrec's state_dict, within 1e-6 relative (see the module docstring); the drift per key."""
    assert sorted(got["state"]) == sorted(ref_state)
    drift = {}
    for k, want in ref_state.items():
        have = got["state"][k]
        assert have.shape == want.shape, k
        scale = max(float(want.abs().max()), 1e-30)
        drift[k] = float((have - want).abs().max()) / scale
        assert drift[k] <= 1e-6, (k, drift[k])
    logit_drift = float((got["logits"] - ref_logits).abs().max()) / float(ref_logits.abs().max())
    assert logit_drift <= 1e-6
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
    for kind in ("sgd", "rowwise-adagrad"):  # the look-ahead really read rows an earlier step was to update
        assert results[(kind, "prefetch")]["refreshed"] > 0
        assert results[(kind, "plain")]["refreshed"] == 0


@pytest.mark.parametrize("world", [1, 2])
def test_dmp_with_hotline_sharder_trains_like_torchrec(world, references, tmp_path):
    results = run(world, tmp_path)
    for kind in ("sgd", "rowwise-adagrad"):
        drift = assert_matches_reference(results[(kind, "plain")], *references[kind])
        if world == 1 and kind == "sgd":  # one rank, SGD: every dense layer is bit-identical
            assert all(v == 0.0 for k, v in drift.items() if "embedding_bags" not in k), drift
    # row-wise Adagrad's accumulators, in torchrec's FusedEmbeddingBagCollection convention
    optim = results[("rowwise-adagrad", "plain")]["optim"]["state"]
    key = "model.sparse_arch.embedding_bag_collection.t_1.weight"
    rows = len(range(w.SIZES[0], w.SIZES[0] + w.SIZES[1], world))  # rank 0's rows of t_1 (all on one rank)
    assert optim[key]["t_1.weight.momentum_1"].shape == (rows,)
    assert results[("sgd", "plain")]["optim"]["state"] == {}
    assert_pipelines_equal_plain(results)
