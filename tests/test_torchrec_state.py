"""Hotline's collection as torchrec users keep and move models: state_dict round trips with torchrec's
EmbeddingBagCollection and FusedEmbeddingBagCollection (weights and row-wise Adagrad state), a resume in the
middle of training, apply_optimizer_in_backward, and fx tracing. One process, CPU."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_workers as w  # noqa: E402
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: E402
from torchrec.optim import RowWiseAdagrad  # noqa: E402

from hotline.placement import Placement  # noqa: E402
from hotline.torchrec_bridge import HotlineEmbeddingBagCollection  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def hotline(kind: str = "rowwise-adagrad", placement: Placement | None = None, **kwargs):
    ebc = HotlineEmbeddingBagCollection(w.configs(), placement or w.placement(), optimizer_type=w.optimizer_type(kind),
                                        optimizer_kwargs={"lr": w.LR}, **kwargs)  # fmt: skip
    model = w.dlrm(ebc)
    model.load_state_dict(w.reference_model().state_dict())  # one initial state for every model of a test
    return model


def train(model, steps: range, opt=None) -> None:
    opt = opt if opt is not None else w.combined_optimizer(model)
    for s in steps:
        loss, _ = model(w.batch(s, 16))
        loss.backward()
        opt.step()
        opt.zero_grad()


def predict(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        _, (_, logits, _) = model(w.batch(999, 16))
    model.train()
    return logits


def ebc_of(model):
    return model.model.sparse_arch.embedding_bag_collection


def assert_states_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def fused_torchrec(seed: int = 0):
    """torchrec's DLRM over its FusedEmbeddingBagCollection (fbgemm's CPU kernels, row-wise Adagrad in backward)."""
    torch.manual_seed(seed)
    ebc = FusedEmbeddingBagCollection(
        w.configs(), optimizer_type=RowWiseAdagrad, optimizer_kwargs={"lr": w.LR}
    )
    return w.dlrm(ebc)


def test_state_dict_has_torchrecs_keys_shapes_and_parameters():
    ours, ref = hotline(), w.reference_model()
    assert list(ours.state_dict()) == list(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert ours.state_dict()[k].shape == v.shape
    ebc = ebc_of(ours)
    assert sorted(ebc.embedding_bags) == ["t_0", "t_1", "t_2"]
    assert ebc.embedding_bags["t_1"].weight.shape == (w.SIZES[1], w.D)
    assert [n for n, _ in ebc.named_parameters()] == [f"embedding_bags.t_{i}.weight" for i in range(3)]
    torch.optim.SGD(ebc.parameters(), lr=0.1)  # not an empty parameter list any more


def test_hot_rows_current_values_are_in_the_state_dict_and_the_view():
    model = hotline("sgd")
    train(model, range(3))
    ebc = ebc_of(model)
    tables = ebc.export_tables()
    hot = ebc.placement.hot_ids[1]
    assert hot.size
    sd = model.state_dict()
    key = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_1.weight"
    assert torch.equal(sd[key], torch.from_numpy(tables["t_1"]))
    assert torch.equal(ebc.embedding_bags["t_1"].weight.detach(), torch.from_numpy(tables["t_1"]))


def test_round_trips_hotline_torchrec_fused_are_bit_identical():
    # torchrec's fused collection trains (fbgemm, in backward), then hands weights and accumulators to Hotline's
    fused = fused_torchrec()
    dense_opt = torch.optim.SGD(
        [p for n, p in fused.named_parameters() if "embedding_bags" not in n], lr=w.LR
    )
    for s in range(4):
        loss, _ = fused(w.batch(s, 16))
        loss.backward()
        dense_opt.step()
        dense_opt.zero_grad()
    fused_state = copy.deepcopy(fused.state_dict())
    fused_optim = copy.deepcopy(ebc_of(fused).fused_optimizer().state_dict())
    assert fused_optim["state"]  # fbgemm's row-wise accumulators are there to move

    ours = hotline(
        placement=Placement.from_hot_ids(
            w.SIZES, [np.arange(5), np.arange(30), np.arange(4)], embedding_dim=w.D
        )
    )
    ours.load_state_dict(fused_state)  # strict
    ebc_of(ours).fused_optimizer.load_state_dict(fused_optim)
    assert_states_equal(ours.state_dict(), fused_state)
    got = ebc_of(ours).fused_optimizer.state_dict()
    assert_states_equal(
        {f"{k}/{n}": t for k, s in got["state"].items() for n, t in s.items()},
        {f"{k}/{n}": t for k, s in fused_optim["state"].items() for n, t in s.items()},
    )
    # predictions: Hotline's equal torchrec's EmbeddingBagCollection's with the same state, bit for bit
    ref = w.reference_model()
    ref.load_state_dict(fused_state)
    assert torch.equal(predict(ours), predict(ref))

    # Hotline trains on, then hands everything back: to torchrec's EBC, and to a fresh fused collection
    train(ours, range(4, 8))
    ours_state = copy.deepcopy(ours.state_dict())
    ours_optim = copy.deepcopy(ebc_of(ours).fused_optimizer.state_dict())
    ref.load_state_dict(ours_state)
    assert torch.equal(predict(ref), predict(ours))
    back = fused_torchrec(seed=1)
    back.load_state_dict(ours_state)
    ebc_of(back).fused_optimizer().load_state_dict(ours_optim)
    assert_states_equal(back.state_dict(), ours_state)
    again = ebc_of(back).fused_optimizer().state_dict()
    for k, s in ours_optim["state"].items():
        for n, t in s.items():
            assert torch.equal(again["state"][k][n], t)


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad", "adagrad", "adam"])
def test_hotline_to_hotline_resume_mid_training_is_bit_identical(kind):
    """Adam's bias correction counts the collection's forwards (fbgemm's iteration): the resumed run sets
    the step it resumes at, as torchrec users do with fbgemm (``set_optimizer_step``)."""
    a = hotline(kind)
    opt_a = w.combined_optimizer(a)
    train(a, range(5), opt_a)
    saved = copy.deepcopy(a.state_dict())
    saved_optim = copy.deepcopy(opt_a.state_dict())
    train(a, range(5, 10), opt_a)

    b = hotline(kind)  # fresh initial weights and accumulators, overwritten by the checkpoint
    b.load_state_dict(saved)
    opt_b = w.combined_optimizer(b)
    opt_b.load_state_dict(saved_optim)
    opt_b.set_optimizer_step(5)
    train(b, range(5, 10), opt_b)
    assert_states_equal(b.state_dict(), a.state_dict())
    sa, sb = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert sorted(sa) == sorted(sb)
    for k in sa:
        for n in sa[k]:
            assert torch.equal(sa[k][n], sb[k][n])
    assert torch.equal(predict(a), predict(b))


def test_load_state_dict_refuses_what_does_not_fit():
    model = hotline()
    sd = model.state_dict()
    key = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_0.weight"
    bad = dict(sd)
    bad[key] = torch.zeros(3, w.D)
    with pytest.raises(RuntimeError, match=r"size mismatch for .*t_0.weight"):
        model.load_state_dict(bad)
    missing = {k: v for k, v in sd.items() if k != key}
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(missing)
    extra = dict(sd)
    extra["model.sparse_arch.embedding_bag_collection.embedding_bags.t_9.weight"] = torch.zeros(2, w.D)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        model.load_state_dict(extra)


def test_apply_optimizer_in_backward_is_honoured_and_refused_clearly():
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    fused = hotline("rowwise-adagrad")
    train(fused, range(4))
    in_bwd = hotline("sgd")
    apply_optimizer_in_backward(RowWiseAdagrad, ebc_of(in_bwd).parameters(), {"lr": w.LR})
    dense = torch.optim.SGD([p for n, p in in_bwd.named_parameters() if "embedding_bags" not in n], lr=w.LR)
    train(in_bwd, range(4), dense)  # no fused step: the tables are updated inside backward()
    assert_states_equal(in_bwd.state_dict(), fused.state_dict())

    adam = hotline("adam")  # Adam's moments: the tables are rebuilt with [rows, 2 D + 1] state
    train(adam, range(4))
    in_bwd = hotline("sgd")
    apply_optimizer_in_backward(torch.optim.Adam, ebc_of(in_bwd).parameters(), {"lr": w.LR})
    dense = torch.optim.SGD([p for n, p in in_bwd.named_parameters() if "embedding_bags" not in n], lr=w.LR)
    train(in_bwd, range(4), dense)
    assert_states_equal(in_bwd.state_dict(), adam.state_dict())
    rms = hotline("sgd")
    apply_optimizer_in_backward(torch.optim.RMSprop, ebc_of(rms).parameters(), {"lr": w.LR})
    with pytest.raises(ValueError, match="RMSprop.* not supported by Hotline's collection"):
        rms(w.batch(0, 16))
    with pytest.raises(ValueError, match="momentum"):
        HotlineEmbeddingBagCollection(
            w.configs(), optimizer_type=torch.optim.SGD, optimizer_kwargs={"momentum": 0.9}
        )


def test_fused_optimizer_lr_follows_param_groups():
    a, b = hotline("sgd"), hotline("sgd")
    ebc_of(b).fused_optimizer.param_groups[0]["lr"] = w.LR / 2
    train(a, range(1))
    train(b, range(1))
    ta, tb = ebc_of(a).export_tables()["t_1"], ebc_of(b).export_tables()["t_1"]
    t0 = ebc_of(hotline("sgd")).export_tables()["t_1"]
    changed = np.any(ta != t0, axis=1)
    assert changed.any()
    np.testing.assert_allclose(
        tb[changed] - t0[changed], (ta[changed] - t0[changed]) / 2, rtol=1e-4, atol=1e-8
    )


def test_fx_symbolic_trace_keeps_the_collection_as_a_leaf():
    import torchrec.fx

    model = hotline("sgd").model
    traced = torchrec.fx.symbolic_trace(model)
    leaves = [n.target for n in traced.graph.nodes if n.op == "call_module"]
    assert "sparse_arch.embedding_bag_collection" in leaves
    b = w.batch(3, 16)
    model.eval()
    with torch.no_grad():
        assert torch.equal(
            traced(b.dense_features, b.sparse_features), model(b.dense_features, b.sparse_features)
        )


def test_constructor_refuses_what_it_cannot_do_by_name():
    from torchrec import EmbeddingBagConfig, PoolingType

    bad_pool = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=5, pooling=PoolingType.NONE)]
    with pytest.raises(ValueError, match="table t: only sum and mean pooling"):
        HotlineEmbeddingBagCollection(bad_pool)
    twice = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=5) for _ in range(2)]
    with pytest.raises(ValueError, match="table names must be distinct"):
        HotlineEmbeddingBagCollection(twice)
    with pytest.raises(ValueError, match="placement has table sizes"):
        HotlineEmbeddingBagCollection(w.configs(), Placement.all_cold([1, 2, 3], embedding_dim=w.D))
    with pytest.raises(ValueError, match="optimizer_type .*RMSprop.* is not supported") as e:
        HotlineEmbeddingBagCollection(w.configs(), optimizer_type=torch.optim.RMSprop)
    assert "torch.optim.Adagrad or torch.optim.Adam" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="weight_decay"):  # FBGEMM's EXACT_ADAGRAD has none (its ADAM has)
        HotlineEmbeddingBagCollection(
            w.configs(), optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"weight_decay": 0.1}
        )
    with pytest.raises(ValueError, match="Adam's"):
        HotlineEmbeddingBagCollection(
            w.configs(), optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"betas": (0.8, 0.9)}
        )


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_adagrad_and_adam_train_like_fbgemm_and_move_their_state(kind):
    """Adagrad and Adam with FBGEMM's semantics (EXACT_ADAGRAD, ADAM) against their references from one
    initial state on the same batches: Adagrad against fbgemm's own CPU update (torchrec's
    FusedEmbeddingBagCollection with the same fused optimizer), Adam against FBGEMM's ADAM in plain PyTorch
    (fbgemm's CPU TBE has no ADAM). The tables and every optimizer state tensor agree to 1e-6 relative, Adam
    1e-5 (w.TOLERANCE; the
    same formulas, rounded in each one's order); the state has torchrec's names and fbgemm's shapes ([rows, D]
    per moment) and moves into Hotline's collection and back bit for bit."""
    ref, ref_optim = w.train_reference(kind, 8, 16)
    ours = hotline(kind)
    train(ours, range(8))
    theirs, mine = ref.state_dict(), ours.state_dict()
    assert sorted(theirs) == sorted(mine)
    for k, want in theirs.items():
        assert float((mine[k] - want).abs().max()) <= w.TOLERANCE[kind] * float(want.abs().max()), k
    names = ["momentum_1"] if kind == "adagrad" else ["momentum_1", "momentum_2"]
    fb = ref_optim["state"]
    got = ebc_of(ours).fused_optimizer.state_dict()["state"]
    assert sorted(got) == sorted(fb) == [f"t_{t}.weight" for t in range(len(w.SIZES))]
    for key in fb:
        assert sorted(got[key]) == sorted(fb[key]) == [f"{key}.{n}" for n in names]
        for name, want in fb[key].items():
            assert got[key][name].shape == want.shape == (w.SIZES[int(key[2])], w.D)
            assert float((got[key][name] - want).abs().max()) <= w.TOLERANCE[kind] * float(
                want.abs().max()
            ), name
            assert float(want.abs().max()) > 0  # trained: the state moved
    # the reference's state into Hotline's collection (hot rows too) and back, bit for bit
    moved = hotline(kind)
    moved.load_state_dict(theirs)
    ebc_of(moved).fused_optimizer.load_state_dict(copy.deepcopy(ref_optim))
    assert_states_equal(moved.state_dict(), theirs)
    again = ebc_of(moved).fused_optimizer.state_dict()["state"]
    for key in fb:
        for name, want in fb[key].items():
            assert torch.equal(again[key][name], want), name


def test_adam_with_rowwise_bias_correction_keeps_and_saves_each_rows_count():
    """``use_rowwise_bias_correction=True``: each row's own step count corrects its bias (Hotline's training
    rule); the counts are saved as ``row_counter`` and a resume needs no ``set_optimizer_step``."""
    kw = {"lr": w.LR, "use_rowwise_bias_correction": True}

    def model():
        ebc = HotlineEmbeddingBagCollection(w.configs(), w.placement(), optimizer_type=torch.optim.Adam,
                                            optimizer_kwargs=kw)  # fmt: skip
        m = w.dlrm(ebc)
        m.load_state_dict(w.reference_model().state_dict())
        return m

    a = model()
    opt_a = w.combined_optimizer(a)
    train(a, range(3), opt_a)
    state = ebc_of(a).fused_optimizer.state_dict()["state"]["t_1.weight"]
    assert sorted(state) == ["t_1.weight.momentum_1", "t_1.weight.momentum_2", "t_1.weight.row_counter"]
    counts = state["t_1.weight.row_counter"]
    looked_up = [
        set(w.batch(s, 16).sparse_features.to_dict()[f].values().tolist())
        for s in range(3)
        for f in ("f1", "f2")
    ]
    want = [sum(r in looked_up[2 * s] | looked_up[2 * s + 1] for s in range(3)) for r in range(w.SIZES[1])]
    assert counts.tolist() == want and max(want) > 1
    saved, saved_optim = copy.deepcopy(a.state_dict()), copy.deepcopy(opt_a.state_dict())
    train(a, range(3, 6), opt_a)
    b = model()
    b.load_state_dict(saved)
    opt_b = w.combined_optimizer(b)
    opt_b.load_state_dict(saved_optim)
    train(b, range(3, 6), opt_b)
    assert_states_equal(b.state_dict(), a.state_dict())


def test_adam_weight_decay_is_fbgemms():
    """Adam's ``weight_decay`` as FBGEMM's ADAM applies it (inside the step, on the looked-up rows only):
    equal to FBGEMM's formula in plain PyTorch to 1e-5 relative (w.TOLERANCE), and it changes the result."""
    kw = {"lr": w.LR, "weight_decay": 0.05}
    ref = w.reference_model()
    opts = [torch.optim.SGD([p for n, p in ref.named_parameters() if "embedding_bags" not in n], lr=w.LR),
            w.FbgemmAdam(ref, weight_decay=0.05)]  # fmt: skip
    for s in range(6):
        b = w.batch(s, 16)
        loss, _ = ref(b)
        loss.backward()
        opts[0].step()
        opts[1].step(b)
        for o in opts:
            o.zero_grad()
    ebc = HotlineEmbeddingBagCollection(w.configs(), w.placement(), optimizer_type=torch.optim.Adam,
                                        optimizer_kwargs=kw)  # fmt: skip
    ours = w.dlrm(ebc)
    ours.load_state_dict(w.reference_model().state_dict())
    train(ours, range(6))
    theirs, mine = ref.state_dict(), ours.state_dict()
    for k, want in theirs.items():
        assert float((mine[k] - want).abs().max()) <= w.TOLERANCE["adam"] * float(want.abs().max()), k
    plain = hotline("adam")
    train(plain, range(6))
    key = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_1.weight"
    assert not torch.equal(plain.state_dict()[key], mine[key])
