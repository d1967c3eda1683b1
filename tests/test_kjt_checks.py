"""The tiered collection checks the KeyedJaggedTensor it gets: lengths that do not account for the values
(fewer passed silently, more gave a reshape error), negative lengths (numpy's message), float ids (truncated
to rows) are one line naming the key, before anything is looked up."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torchrec import EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402

from hotline.placement import Placement  # noqa: E402
from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

D, B = 4, 3
SIZES = [30, 50]


@pytest.fixture(scope="module")
def module():
    configs = [EmbeddingBagConfig(name=f"t_{t}", embedding_dim=D, num_embeddings=n, feature_names=[f"f{t}"])
               for t, n in enumerate(SIZES)]  # fmt: skip
    return HotlineEmbeddingBagCollection(configs, Placement.all_cold(SIZES, embedding_dim=D))


def _kjt(values, lengths) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor(values), lengths=torch.tensor(lengths))


GOOD = ([1, 2, 3, 4, 5, 6], [1, 0, 2, 1, 1, 1])
CASES = {
    "fewer lengths than values": (([1, 2, 3, 4, 5, 6, 7, 8], GOOD[1]), "the lengths sum to 6 but there are 8 values"),
    "more lengths than values": (([1, 2, 3, 4], GOOD[1]), "key 'f1': its lengths run to value 6 but there are only 4"),
    "a negative length": ((GOOD[0], [1, 0, 2, 2, -1, 2]), "key 'f1': the length of sample 1 is -1"),
    "float ids": (([1.5, 2.0, 3.0, 4.0, 5.0, 6.0], GOOD[1]), "key 'f0': its ids are torch.float32, not integers"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_kjt_that_is_not_a_batch_is_one_line_naming_the_key(module, case):
    (values, lengths), says = CASES[case]
    with pytest.raises(ValueError) as e:
        module(_kjt(values, lengths))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_good_kjt_is_looked_up(module):
    out = module(_kjt(*GOOD))
    assert out.values().shape == (B, 2 * D) and torch.isfinite(out.values()).all()
