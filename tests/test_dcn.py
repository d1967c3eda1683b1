"""DLRM-DCNv2 (``--arch-interaction-op dcn``): the cross net against torchrec's, the DCN model in every mode
against device mode, re-placement, checkpoints and resume, evaluate / predict, and export to torchrec's
``DLRM_DCN``.

Every mode against the independent reference (tests/reference.py, which has its own cross net) is in
tests/test_reference.py (``op = dcn``: device, hybrid, hotline K = 0 / 1 / 2 / 4, split and fused, 2 ranks).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arrays import fitted_arrays
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.models.crossnet import LowRankCrossNet
from hotline.models.dlrm import DLRM, DLRMConfig

TABLES = [30, 200, 12, 500, 60, 5]
DIM, BATCH, STEPS = 8, 32, 30
ARCH = {"embedding_dim": DIM, "bottom_mlp": [13, 16, DIM], "top_mlp": [16, 1], "interaction": "dcn",
        "dcn_num_layers": 3, "dcn_low_rank_dim": 5}  # fmt: skip
CLI_ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1",
            "--arch-interaction-op", "dcn", "--dcn-num-layers", "2", "--dcn-low-rank-dim", "4"]  # fmt: skip


# -- the cross net against torchrec's ----------------------------------------------------------------------
def test_crossnet_forward_and_backward_equal_torchrecs_on_the_same_weights():
    from torchrec.modules.crossnet import LowRankCrossNet as TorchrecLowRankCrossNet

    N, layers, rank, B = 24, 3, 5, 7
    ours = LowRankCrossNet(N, layers, rank, torch.Generator().manual_seed(0))
    with torch.no_grad():  # non-zero biases, so that their use is checked too
        for b in ours.bias:
            b.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    theirs = TorchrecLowRankCrossNet(in_features=N, num_layers=layers, low_rank=rank)
    assert {k: v.shape for k, v in theirs.state_dict().items()} == {
        k: v.shape for k, v in ours.state_dict().items()
    }
    theirs.load_state_dict(ours.state_dict())  # strict: the same names
    x = torch.randn(B, N, generator=torch.Generator().manual_seed(2))
    upstream = torch.randn(B, N, generator=torch.Generator().manual_seed(3))
    outputs, grads = [], []
    for module in (ours, theirs):
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        y.backward(upstream)
        outputs.append(y.detach())
        grads.append([xi.grad, *(p.grad for p in module.parameters())])
    assert torch.equal(outputs[0], outputs[1])  # the same operations in the same order: bit for bit
    assert len(grads[0]) == len(grads[1]) == 1 + 3 * layers
    for g_ours, g_theirs in zip(*grads):
        assert torch.equal(g_ours, g_theirs)
    assert outputs[0].abs().max() > 0 and all(g.abs().max() > 0 for g in grads[0])


def test_crossnet_initialisation_is_torchrecs():
    """Xavier-normal kernels (std sqrt(2 / (fan_in + fan_out))), zero biases, drawn from the model's seed."""
    N, rank = 400, 100
    net = LowRankCrossNet(N, 2, rank, torch.Generator().manual_seed(0))
    std = (2.0 / (N + rank)) ** 0.5
    for w in [*net.W_kernels, *net.V_kernels]:
        assert abs(float(w.detach().std()) / std - 1) < 0.02 and abs(float(w.detach().mean())) < 0.05 * std
    assert all(float(b.detach().abs().max()) == 0 for b in net.bias)
    again = LowRankCrossNet(N, 2, rank, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), again.parameters()))


def test_crossnet_draws_torchrecs_initial_weights_for_the_same_seed():
    """torchrec draws every W, then every V, from the global generator; ours from the model's generator in the
    same order: the same seed gives the same initial weights, bit for bit."""
    from torchrec.modules.crossnet import LowRankCrossNet as TorchrecLowRankCrossNet

    N, layers, rank = 24, 3, 5
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(4)
        theirs = TorchrecLowRankCrossNet(in_features=N, num_layers=layers, low_rank=rank).state_dict()
    finally:
        torch.random.set_rng_state(state)
    ours = LowRankCrossNet(N, layers, rank, torch.Generator().manual_seed(4)).state_dict()
    assert list(ours) == list(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_dcn_model_has_torchrecs_shapes_and_names():
    from torchrec.models.dlrm import DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    cfg = DLRMConfig(table_sizes=[5, 7, 3], **ARCH)
    ours = DLRM(cfg)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{t}"])
            for t, n in enumerate(cfg.table_sizes)
        ]  # fmt: skip
    )
    theirs = DLRM_DCN(ebc, dense_in_features=13, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1],
                      dcn_num_layers=3, dcn_low_rank_dim=5)  # fmt: skip
    want = {k: v.shape for k, v in theirs.inter_arch.state_dict().items()}
    assert {k: v.shape for k, v in ours.inter_arch.state_dict().items()} == want
    assert want["crossnet.W_kernels.0"] == (4 * DIM, 5) and want["crossnet.V_kernels.2"] == (5, 4 * DIM)
    assert cfg.interaction_width == 4 * DIM  # the over-arch reads the cross net's [B, F * D] output


def test_bad_dcn_shapes_are_refused_with_the_flag(tmp_path, capsys):
    with pytest.raises(ValueError, match="--dcn-num-layers"):
        DLRMConfig(table_sizes=[3], embedding_dim=4, bottom_mlp=[13, 4], interaction="dcn", dcn_num_layers=0)
    with pytest.raises(ValueError, match="--dcn-low-rank-dim"):
        TrainConfig(dcn_low_rank_dim=0)
    assert (
        main(["train", str(tmp_path / "nothing"), "--arch-interaction-op", "dcn", "--dcn-num-layers", "0"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        err.startswith("hotline train: error:") and "--dcn-num-layers" in err and len(err.splitlines()) == 1
    )


# -- every mode equals device mode ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcn")
    ds = zipf_dataset(
        root / "ds", BATCH * STEPS + 600, 11, TABLES, 1.2, pooling_factor=2, drift_days=3, drift_rate=0.6
    )
    places = {}
    for opt in ("sgd", "rowwise-adagrad"):
        bpr = 4 * DIM + (4 if opt != "sgd" else 0)
        places[opt] = hot_placement(
            ds, root / f"p-{opt}.npz", 1 / 3, BATCH * 6, embedding_dim=DIM, bytes_per_row=bpr
        )
    return ds, places


def _run(data, mode, optimizer, **kw):
    ds, places = data
    cfg = TrainConfig(mode=mode, optimizer=optimizer, learning_rate=0.05, mini_batch_size=BATCH, num_batches=STEPS,
                      progress=False, print_freq=1, placement_path=places[optimizer] if mode == "hotline" else None,
                      **ARCH, **kw)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        stats = list(tr.progress(tr.batches()))
        replaced = [r for r in tr.history if r.get("kind") == "replace"]
        return np.array([s.loss_sum for s in stats]), tr.named_arrays(), stats, replaced
    finally:
        tr.close()


_device: dict = {}


def _device_run(data, optimizer):
    if optimizer not in _device:
        _device[optimizer] = _run(data, "device", optimizer)
    return _device[optimizer]


def _assert_equivalent(ref, got, rtol=1e-5):
    """Every step's loss and every parameter within ``rtol`` of each tensor's scale (as test_equivalence)."""
    assert len(got[0]) == len(ref[0]) == STEPS
    np.testing.assert_allclose(got[0], ref[0], rtol=rtol)
    assert ref[1].keys() == got[1].keys()
    assert any(k.startswith("model.inter_arch.crossnet.") for k in ref[1])
    for name, a in ref[1].items():
        scale = max(float(np.abs(a).max()), 1e-12)
        err = float(np.abs(got[1][name] - a).max())
        assert err <= rtol * scale, f"{name}: max difference {err:.3e} > {rtol} x scale {scale:.3e}"


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("lookahead", [0, 2])
def test_hotline_dcn_equals_device(data, optimizer, lookahead):
    """K = 0 (split micro-batches: equal up to reassociation) and K = 2 (one fused pass: bit-identical)."""
    device = _device_run(data, optimizer)
    got = _run(data, "hotline", optimizer, lookahead=lookahead)
    stats = got[2]
    assert 0 < sum(s.counters["hot_lookups"] for s in stats) < sum(s.counters["lookups"] for s in stats)
    _assert_equivalent(device, got)
    if lookahead:
        assert np.array_equal(got[0], device[0])
        for name, a in device[1].items():
            assert np.array_equal(got[1][name], a), name


def test_hybrid_and_replacing_hotline_dcn_equal_device(data):
    device = _device_run(data, "rowwise-adagrad")
    for kw in ({"mode": "hybrid"}, {"mode": "hotline", "lookahead": 2, "replace_every": 8}):
        got = _run(data, kw.pop("mode"), "rowwise-adagrad", **kw)
        if "replace_every" in kw:
            assert len(got[3]) == STEPS // 8 - (STEPS % 8 == 0) and sum(r["promoted"] for r in got[3]) > 0
        for name, a in device[1].items():  # fused pass / all rows in host memory: bit for bit
            assert np.array_equal(got[1][name], a), (kw, name)


def _fit(data, **kw):
    ds, places = data
    cfg = TrainConfig(mode="hotline", optimizer="rowwise-adagrad", learning_rate=0.05, mini_batch_size=BATCH,
                      progress=False, placement_path=places["rowwise-adagrad"], lookahead=2, eval_max_samples=32,
                      **{**ARCH, **kw})  # fmt: skip
    return fitted_arrays(ds, cfg)


def test_resume_of_a_dcn_run_is_bit_identical(data, tmp_path):
    straight = _fit(data, num_batches=24)
    ck = str(tmp_path / "ck")
    _fit(data, num_batches=12, checkpoint_dir=ck, checkpoint_every=6)
    resumed = _fit(data, num_batches=24, checkpoint_dir=ck, resume=True)
    assert any(k.startswith("model.inter_arch.crossnet.") for k in straight)
    for name, a in straight.items():
        assert np.array_equal(resumed[name], a), name
    with pytest.raises(ValueError, match="the --arch-\\* flags"):  # another cross-net shape: another run
        _fit(data, num_batches=24, checkpoint_dir=ck, resume=True, dcn_low_rank_dim=6)


# -- checkpoint, evaluate, predict, export --------------------------------------------------------------
@pytest.mark.parametrize("pooling", [1, 3])
def test_export_to_torchrec_dlrm_dcn_predicts_what_hotline_predicts(tmp_path, capsys, pooling):
    from torchrec.models.dlrm import DLRM_DCN

    from hotline.training.export import keyed_jagged, load_torchrec_dlrm
    from hotline.training.inference import trainer_from_checkpoint

    ds = str(generate(tmp_path / "ds", 3000, seed=5, table_sizes=[40, 70, 9, 120], pooling_factor=pooling,
                      zipf=1.2, progress=False))  # fmt: skip
    ckpt = tmp_path / "run.pt"
    assert main(["train", ds, *CLI_ARCH, "--mode", "hotline", "--hbm-budget", "2KiB", "--lookahead", "2",
                 "--optimizer", "rowwise-adagrad", "--num-batches", "20", "--no-progress", "--save", str(ckpt),
                 "--eval-max-samples", "200"]) == 0  # fmt: skip
    assert main(["evaluate", ds, "--load", str(ckpt), "--split", "test"]) == 0
    scores = capsys.readouterr().out
    assert "auc" in scores
    preds = tmp_path / "p.npy"
    assert main(["predict", ds, "--load", str(ckpt), "--split", "test", "--out", str(preds)]) == 0
    out = tmp_path / "dcn.pt"
    assert main(["export", str(out), "--load", str(ckpt)]) == 0
    assert "torchrec DLRM_DCN" in capsys.readouterr().err

    module, config = load_torchrec_dlrm(out)
    assert isinstance(module, DLRM_DCN) and config["dcn_num_layers"] == 2 and config["dcn_low_rank_dim"] == 4
    test = Dataset(ds).test
    trainer = trainer_from_checkpoint(ds, ckpt, progress=False)
    try:
        assert (
            trainer.config.interaction == "dcn" and trainer.config.dcn_low_rank_dim == 4
        )  # from the checkpoint
        ours, _ = trainer.predict(test)
    finally:
        trainer.close()
    np.testing.assert_array_equal(np.load(preds)["probability"], ours)
    with torch.no_grad():
        kjt = keyed_jagged(np.asarray(test.sparse), config["feature_names"])
        theirs = torch.sigmoid(module(torch.from_numpy(np.array(test.dense)), kjt)).squeeze(1).numpy()
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-6)
    assert np.abs(ours - ours.mean()).max() > 1e-3  # not a constant model: the comparison means something
    # the checkpoint's cross net, not the flags' default, and a contradicting flag is refused
    assert main(["evaluate", ds, "--load", str(ckpt), "--dcn-low-rank-dim", "8"]) == 2
    assert "dcn_low_rank_dim" in capsys.readouterr().err
