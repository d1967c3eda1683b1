"""HotlineEmbeddingBagCollection against torchrec's EmbeddingBagCollection inside torchrec's DLRM: forward,
backward (pooled-embedding and dense gradients) and one SGD step, for jagged bags and any placement."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.models.dlrm import DLRM  # noqa: E402

from hotline.placement import Placement  # noqa: E402
from hotline.tiers.sparse_optim import SparseOptimizer  # noqa: E402
from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection, kjt_from_sparse  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

D, B, LR = 8, 6, 0.1
SIZES = [30, 50, 9]


def configs() -> list[EmbeddingBagConfig]:
    # table t_1 is shared by two features: its output keys and gradients must match torchrec's
    return [
        EmbeddingBagConfig(name="t_0", embedding_dim=D, num_embeddings=SIZES[0], feature_names=["f0"]),
        EmbeddingBagConfig(name="t_1", embedding_dim=D, num_embeddings=SIZES[1], feature_names=["f1", "f2"]),
        EmbeddingBagConfig(name="t_2", embedding_dim=D, num_embeddings=SIZES[2], feature_names=["f3"]),
    ]


FEATURE_TABLE = {"f0": 0, "f1": 1, "f2": 1, "f3": 2}


def make_kjt(seed: int, weighted: bool = False) -> KeyedJaggedTensor:
    """Jagged bags (empty ones and repeated ids included), keys in an order unlike the configs'."""
    rng = np.random.default_rng(seed)
    keys = ["f3", "f1", "f0", "f2"]
    lengths = rng.integers(0, 5, size=(len(keys), B))
    lengths[0, 0] = 0
    values = [
        rng.integers(0, SIZES[FEATURE_TABLE[k]] // 3 + 1, size=int(lengths[i].sum()))
        for i, k in enumerate(keys)
    ]
    kw = {}
    if weighted:
        kw["weights"] = torch.from_numpy(rng.random(int(lengths.sum())).astype(np.float32))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(lengths.reshape(-1)),
        **kw,
    )


def placements() -> dict[str, Placement]:
    rng = np.random.default_rng(1)
    mixed = [rng.permutation(n)[: n // 3] for n in SIZES]
    mixed[2] = np.arange(SIZES[2])  # one table all hot
    return {
        "mixed": Placement.from_hot_ids(SIZES, mixed, embedding_dim=D),
        "all_cold": Placement.all_cold(SIZES, embedding_dim=D),
        "all_hot": Placement.all_hot(SIZES, embedding_dim=D),
    }


def make_pair(placement: Placement, weighted: bool = False, **kwargs):
    """torchrec's DLRM with its EBC, and the same DLRM (same weights) with our module."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs(), is_weighted=weighted, device=torch.device("cpu"))
    ref = DLRM(embedding_bag_collection=ebc, dense_in_features=5, dense_arch_layer_sizes=[16, D],
               over_arch_layer_sizes=[16, 1])  # fmt: skip
    kwargs.setdefault("optimizer_kwargs", {"lr": LR})
    ours_ebc = HotlineEmbeddingBagCollection.from_embedding_bag_collection(ebc, placement, **kwargs)
    ours = DLRM(embedding_bag_collection=ours_ebc, dense_in_features=5, dense_arch_layer_sizes=[16, D],
                over_arch_layer_sizes=[16, 1])  # fmt: skip
    ours.load_state_dict(ref.state_dict())  # strict: torchrec's keys
    return ref, ours


def capture_pooled(model) -> list:
    """Keeps the pooled embeddings (KeyedTensor values) of each forward, with their gradients."""
    out = []

    def hook(module, inputs, kt):
        kt.values().retain_grad()
        out.append(kt)

    model.sparse_arch.embedding_bag_collection.register_forward_hook(hook)
    return out


def step(model, kjt, dense, labels):
    logits = model(dense, kjt).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    loss.backward()
    return logits, loss


def ref_tables(ref) -> dict[str, np.ndarray]:
    bags = ref.sparse_arch.embedding_bag_collection.embedding_bags
    return {name: bag.weight.detach().numpy() for name, bag in bags.items()}


@pytest.mark.parametrize("name", ["mixed", "all_cold", "all_hot"])
def test_dlrm_with_our_module_equals_torchrec(name):
    ref, ours = make_pair(placements()[name])
    kt_ref, kt_ours = capture_pooled(ref), capture_pooled(ours)
    rng = np.random.default_rng(2)
    dense = torch.from_numpy(rng.random((B, 5), dtype=np.float32))
    labels = torch.from_numpy((rng.random(B) < 0.5).astype(np.float32))
    kjt = make_kjt(3)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=LR)  # dense SGD, EBC weights included
    opt_ours = torch.optim.SGD(ours.parameters(), lr=LR)  # the tables have no .grad: the dense layers only
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]

    logits_ref, _ = step(ref, kjt, dense, labels)
    logits_ours, _ = step(ours, kjt, dense, labels)
    torch.testing.assert_close(logits_ours, logits_ref, rtol=0, atol=1e-6)
    assert kt_ours[0].keys() == kt_ref[0].keys() == ["f0", "f1", "f2", "f3"]
    torch.testing.assert_close(kt_ours[0].values(), kt_ref[0].values(), rtol=0, atol=1e-6)
    torch.testing.assert_close(kt_ours[0].values().grad, kt_ref[0].values().grad, rtol=0, atol=1e-7)
    dense_ref = {n: p for n, p in ref.named_parameters() if "embedding_bags" not in n}
    for n, p in ours.named_parameters():
        if "embedding_bags" in n:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, dense_ref[n].grad, rtol=0, atol=1e-7)

    opt_ref.step()
    opt_ours.step()
    module = ours.sparse_arch.embedding_bag_collection
    touched = module.sparse_step()
    assert touched == len(np.unique(module_lookups(kjt)))
    ours_tables, want = module.export_tables(), ref_tables(ref)
    for t in want:
        np.testing.assert_allclose(ours_tables[t], want[t], rtol=0, atol=1e-7)
    # and the next forward sees the updated rows in both tiers
    torch.testing.assert_close(ours(dense, make_kjt(4)), ref(dense, make_kjt(4)), rtol=0, atol=1e-6)


def module_lookups(kjt) -> np.ndarray:
    """Fused (table offset + id) row of every lookup of the KJT."""
    offsets = np.concatenate([[0], np.cumsum(SIZES[:-1])])
    parts = [kjt[k].values().numpy() + offsets[FEATURE_TABLE[k]] for k in kjt.keys()]
    return np.concatenate(parts)


def test_last_stats_describe_the_split():
    placement = placements()["mixed"]
    module = HotlineEmbeddingBagCollection(configs(), placement)
    kjt = make_kjt(5)
    module(kjt)
    rows = module_lookups(kjt)
    hot = placement.fused_remap()[rows] >= 0
    s = module.last_stats
    assert s["lookups"] == rows.size and s["hot_lookups"] == int(hot.sum())
    assert s["working_set_rows"] == np.unique(rows[~hot]).size
    assert 0 <= s["popular_samples"] <= s["samples"] == B


def test_weighted_bags_equal_torchrec():
    ref, ours = make_pair(placements()["mixed"], weighted=True)
    dense = torch.ones((B, 5))
    labels = torch.zeros(B)
    kjt = make_kjt(6, weighted=True)
    torch.testing.assert_close(ours(dense, kjt), ref(dense, kjt), rtol=0, atol=1e-6)
    step(ref, kjt, dense, labels)
    step(ours, kjt, dense, labels)
    with torch.no_grad():
        for p in ref.sparse_arch.parameters():
            p -= LR * p.grad
    ours.sparse_arch.embedding_bag_collection.sparse_step()
    got, want = ours.sparse_arch.embedding_bag_collection.export_tables(), ref_tables(ref)
    for t in want:
        np.testing.assert_allclose(got[t], want[t], rtol=0, atol=1e-7)


def test_update_in_backward_equals_sparse_step_and_placement_does_not_matter():
    """Two row-wise Adagrad steps: the same tables whatever the placement, with either way of updating."""
    results = []
    for name, in_backward in [("all_hot", False), ("mixed", True), ("all_cold", False)]:
        _, ours = make_pair(
            placements()[name],
            optimizer=SparseOptimizer("rowwise-adagrad", lr=LR),
            update_in_backward=in_backward,
        )
        module = ours.sparse_arch.embedding_bag_collection
        for seed in (7, 8):
            step(ours, make_kjt(seed), torch.ones((B, 5)), torch.ones(B))
            if not in_backward:
                module.sparse_step()
            assert module.sparse_step() == 0  # nothing pending any more
        results.append(module.export_tables())
    for other in results[1:]:
        for t in results[0]:
            np.testing.assert_allclose(other[t], results[0][t], rtol=0, atol=1e-6)


def test_eval_forward_between_backward_and_update_changes_nothing():
    ref, ours = make_pair(placements()["mixed"])
    module = ours.sparse_arch.embedding_bag_collection
    kjt, dense, labels = make_kjt(9), torch.ones((B, 5)), torch.ones(B)
    step(ref, kjt, dense, labels)
    step(ours, kjt, dense, labels)
    with torch.no_grad():
        ours(dense, make_kjt(10))  # gathers another working set into fresh buffers
        for p in ref.sparse_arch.parameters():
            p -= LR * p.grad
    module.sparse_step()
    got, want = module.export_tables(), ref_tables(ref)
    for t in want:
        np.testing.assert_allclose(got[t], want[t], rtol=0, atol=1e-7)


def test_forgotten_update_and_bad_input_raise_clear_errors():
    module = HotlineEmbeddingBagCollection(configs(), placements()["mixed"])
    module(make_kjt(11)).values().sum().backward()
    with pytest.raises(RuntimeError, match="sparse_step"):
        module(make_kjt(12))
    module.sparse_step()

    bad = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1", "f2", "f3"], values=torch.tensor([1, 2, 50, 3]), lengths=torch.tensor([1, 1, 1, 1])
    )
    with pytest.raises(IndexError, match=r"feature 'f2': id 50 out of range \[0, 50\) of table t_1"):
        module(bad)
    missing = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0"], values=torch.tensor([1]), lengths=torch.tensor([1])
    )
    with pytest.raises(KeyError, match="feature 'f1'"):
        module(missing)
    with pytest.raises(ValueError, match="table sizes"):
        HotlineEmbeddingBagCollection(configs(), Placement.all_cold([30, 50], embedding_dim=D))
    with pytest.raises(ValueError, match="embedding dim"):
        HotlineEmbeddingBagCollection(configs(), Placement.all_cold(SIZES, embedding_dim=4))


def test_dispatcher_grows_for_large_batches():
    module = HotlineEmbeddingBagCollection(configs(), placements()["mixed"], max_lookups=4)
    ebc = EmbeddingBagCollection(tables=configs(), device=torch.device("cpu"))
    with torch.no_grad():
        for name, w in module.export_tables().items():
            ebc.embedding_bags[name].weight.copy_(torch.from_numpy(w))
    kjt = make_kjt(13)
    torch.testing.assert_close(module(kjt).values(), ebc(kjt).values(), rtol=0, atol=1e-6)


def test_kjt_from_sparse_lays_out_features_then_samples():
    sparse = np.arange(2 * 3 * 2, dtype=np.int32).reshape(2, 3, 2)  # B=2, T=3, L=2
    kjt = kjt_from_sparse(sparse, ["a", "b", "c"])
    assert kjt.keys() == ["a", "b", "c"] and kjt.stride() == 2
    for t, key in enumerate(["a", "b", "c"]):
        assert kjt[key].values().tolist() == sparse[:, t, :].reshape(-1).tolist()
        assert kjt[key].lengths().tolist() == [2, 2]
    with pytest.raises(ValueError, match=r"\[B, 2, L\]"):
        kjt_from_sparse(sparse, ["a", "b"])
