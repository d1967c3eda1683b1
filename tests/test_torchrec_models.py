"""What torchrec users expect of a collection, against torchrec's EmbeddingBagCollection with the same weights:
mean pooling, a dim per table, weighted features, features sharing a table; and torchrec's DLRM_DCN and a
two-tower retrieval model (built from torchrec modules) training with Hotline's collection.

Tables compared after training are equal up to reassociation (a row looked up several times in a batch gets
its gradients summed in another order by torch's EmbeddingBag backward): bounded by 1e-6 relative."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType  # noqa: E402
from torchrec.models.dlrm import DLRM_DCN  # noqa: E402
from torchrec.modules.mlp import MLP  # noqa: E402

from hotline.placement import Placement  # noqa: E402
from hotline.torchrec_bridge import HotlineEmbeddingBagCollection  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
LR, B = 0.05, 8


def kjt(keys: list[str], sizes: list[int], seed: int, weighted: bool = False) -> KeyedJaggedTensor:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, size=(len(keys), B))
    lengths[0, 0] = 0  # an empty bag
    values = np.concatenate(
        [np.minimum(rng.geometric(0.2, int(n.sum())) - 1, s - 1) for n, s in zip(lengths, sizes)]
    )
    kw = {"weights": torch.from_numpy(rng.random(values.size).astype(np.float32))} if weighted else {}
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(values.astype(np.int64)),
                                               lengths=torch.from_numpy(lengths.reshape(-1)), **kw)  # fmt: skip


def pair(configs, weighted=False, hot_share=0.3):
    """torchrec's EBC and Hotline's with the same weights (some hot rows per table)."""
    torch.manual_seed(0)
    ref = EmbeddingBagCollection(tables=configs, is_weighted=weighted, device=torch.device("cpu"))
    sizes = [c.num_embeddings for c in configs]
    hot = [np.arange(int(n * hot_share)) for n in sizes]
    placement = Placement.from_hot_ids(sizes, hot, embedding_dim=configs[0].embedding_dim)
    ours = HotlineEmbeddingBagCollection.from_embedding_bag_collection(
        ref, placement, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": LR}
    )
    return ref, ours


def assert_tables_close(ours, ref) -> None:
    got = ours.export_tables()
    for name, bag in ref.embedding_bags.items():
        want = bag.weight.detach().numpy()
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6 * np.abs(want).max())


def sgd_step(ref, ours, features, target_seed: int) -> None:
    """One step of a loss over the pooled outputs: dense SGD on torchrec's tables, the fused one on Hotline's."""
    kt_ref, kt_ours = ref(features), ours(features)
    target = torch.from_numpy(
        np.random.default_rng(target_seed).random(kt_ref.values().shape, dtype=np.float32)
    )
    ((kt_ref.values() - target) ** 2).sum().backward()
    ((kt_ours.values() - target) ** 2).sum().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= LR * p.grad
            p.grad = None
    ours.fused_optimizer.step()


def test_mean_pooling_per_table_dims_and_shared_tables_equal_torchrec():
    configs = [
        EmbeddingBagConfig(
            name="user", embedding_dim=4, num_embeddings=30, feature_names=["u"], pooling=PoolingType.MEAN
        ),
        EmbeddingBagConfig(name="item", embedding_dim=16, num_embeddings=50, feature_names=["i", "i_hist"]),
        EmbeddingBagConfig(
            name="ctx", embedding_dim=4, num_embeddings=9, feature_names=["c"], pooling=PoolingType.MEAN
        ),
    ]
    ref, ours = pair(configs)
    keys, sizes = ["c", "i_hist", "u", "i"], [9, 50, 30, 50]
    for seed in range(3):
        features = kjt(keys, sizes, seed)
        a, b = ref(features), ours(features)
        assert b.keys() == a.keys() == ["u", "i", "i_hist", "c"]
        assert b.length_per_key() == a.length_per_key() == [4, 16, 16, 4]
        torch.testing.assert_close(b.values(), a.values(), rtol=1e-6, atol=1e-7)
        sgd_step(ref, ours, features, seed)
    assert_tables_close(ours, ref)


def test_weighted_features_equal_torchrec():
    configs = [
        EmbeddingBagConfig(name="a", embedding_dim=8, num_embeddings=40, feature_names=["fa"]),
        EmbeddingBagConfig(name="b", embedding_dim=8, num_embeddings=20, feature_names=["fb"]),
    ]
    ref, ours = pair(configs, weighted=True)
    assert ours.is_weighted()
    for seed in range(3):
        features = kjt(["fa", "fb"], [40, 20], seed, weighted=True)
        torch.testing.assert_close(ours(features).values(), ref(features).values(), rtol=1e-6, atol=1e-7)
        sgd_step(ref, ours, features, seed)
    assert_tables_close(ours, ref)
    with pytest.raises(ValueError, match="weighted but the KeyedJaggedTensor has no weights"):
        ours(kjt(["fa", "fb"], [40, 20], 0))


def train_pair(make_model, configs, keys, sizes, steps=6, extra=None):
    """Trains the model over torchrec's EBC (dense SGD on everything) and over Hotline's (fused SGD on the
    tables, SGD on the dense layers) from one initial state; returns both."""
    ref_ebc, ours_ebc = pair(configs)
    torch.manual_seed(1)
    ref = make_model(ref_ebc)
    ours = make_model(ours_ebc)
    ours.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=LR)
    opt_dense = torch.optim.SGD([p for n, p in ours.named_parameters() if "embedding_bags" not in n], lr=LR)
    for s in range(steps):
        rng = np.random.default_rng(100 + s)
        dense = torch.from_numpy(rng.random((B, 5), dtype=np.float32))
        labels = torch.from_numpy((rng.random(B) < 0.5).astype(np.float32))
        features = kjt(keys, sizes, 200 + s)
        for model, opts in ((ref, [opt_ref]), (ours, [opt_dense, ours_ebc.fused_optimizer])):
            logits = model(dense, features).reshape(-1)
            torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
            for o in opts:
                o.step()
                o.zero_grad()
    return ref, ours, ref_ebc, ours_ebc


def assert_models_close(ref, ours) -> None:
    for k, v in ref.state_dict().items():
        got = ours.state_dict()[k]
        scale = max(float(v.abs().max()), 1e-12)
        assert float((got - v).abs().max()) / scale <= 1e-6, k


def test_dlrm_dcn_trains_with_hotline_collection():
    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=n, feature_names=[f"f{i}"])
               for i, n in enumerate([40, 25, 60])]  # fmt: skip

    def make(ebc):
        return DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=5, dense_arch_layer_sizes=[16, 8],
                        over_arch_layer_sizes=[16, 1], dcn_num_layers=2, dcn_low_rank_dim=4)  # fmt: skip

    ref, ours, ref_ebc, ours_ebc = train_pair(make, configs, ["f0", "f1", "f2"], [40, 25, 60])
    assert_models_close(ref, ours)
    assert_tables_close(ours_ebc, ref_ebc)


class TwoTower(torch.nn.Module):
    """A two-tower retrieval model from torchrec modules: query and candidate towers (MLPs) over one
    collection's pooled features (tables of different dims), scored by a dot product."""

    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc
        self.query = MLP(4 + 5, [16, 8])
        self.candidate = MLP(16 + 16, [16, 8])

    def forward(self, dense: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        d = self.ebc(features).to_dict()
        q = self.query(torch.cat([d["user"], dense], dim=1))
        c = self.candidate(torch.cat([d["item"], d["item_tags"]], dim=1))
        return (q * c).sum(dim=1)


def test_two_tower_retrieval_model_trains_with_hotline_collection():
    configs = [
        EmbeddingBagConfig(name="user", embedding_dim=4, num_embeddings=30, feature_names=["user"]),
        EmbeddingBagConfig(name="item", embedding_dim=16, num_embeddings=50, feature_names=["item"]),
        EmbeddingBagConfig(
            name="tags",
            embedding_dim=16,
            num_embeddings=12,
            feature_names=["item_tags"],
            pooling=PoolingType.MEAN,
        ),  # fmt: skip
    ]
    ref, ours, ref_ebc, ours_ebc = train_pair(TwoTower, configs, ["user", "item", "item_tags"], [30, 50, 12])
    assert_models_close(ref, ours)
    assert_tables_close(ours_ebc, ref_ebc)
