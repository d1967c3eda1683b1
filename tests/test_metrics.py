import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hotline.training.metrics import accuracy, log_loss, roc_auc


def _pairwise_auc(y, s):
    pos, neg = s[y > 0.5], s[y <= 0.5]
    wins = sum(float(p > n) + 0.5 * float(p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), min_size=2, max_size=40))
def test_auc_equals_pairwise_definition_with_ties(pairs):
    y = np.array([p[0] for p in pairs], dtype=np.float32)
    s = np.array([p[1] for p in pairs], dtype=np.float64)
    if y.min() == y.max():
        assert np.isnan(roc_auc(y, s))
    else:
        assert abs(roc_auc(y, s) - _pairwise_auc(y, s)) < 1e-12


def test_logloss_and_accuracy_golden():
    y = np.array([1, 0, 1, 0], np.float32)
    p = np.array([0.9, 0.2, 0.4, 0.5], np.float32)
    expect = -np.mean(np.log([0.9, 0.8, 0.4, 0.5]))
    assert abs(log_loss(y, p) - expect) < 1e-6
    assert accuracy(y, p) == 0.75  # 0.4 -> 0 is the one miss; 0.5 is not above the threshold
