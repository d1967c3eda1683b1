"""Online access counts across their rescale: the decayed counts, and the hot set chosen from them, are the same
whether or not the weights were renormalised in between.

Counts are kept as ``raw += decay ** -step`` (float32) and renormalised when that weight passes 2**40 (after
some 2,700 steps at decay 0.99). A rescale that forgets to divide the raw counts lets old history
dominate and re-placement stops following the data; nothing in a short training run reaches the threshold, so
the boundary is tested here directly: with a forced small threshold, and from a counter state placed just
below the real one.
"""

from __future__ import annotations

import numpy as np
import pytest

from hotline.profiling import online
from hotline.profiling.online import OnlineCounts

ROWS = 40
OFFSETS = np.zeros(3, np.int64)  # three lookups per sample into one table of ROWS rows


def _steps(n: int, seed: int = 0) -> list[np.ndarray]:
    """Batches whose popular rows move: rows 0-9 first, rows 30-39 later (so recency decides the top)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        base = 0 if i < n // 2 else 30
        hot = rng.integers(base, base + 10, (16, 3))
        rest = rng.integers(0, ROWS, (16, 3))
        out.append(np.where(rng.random((16, 3)) < 0.7, hot, rest).astype(np.int32))
    return out


def _naive(steps: list[np.ndarray], decay: float) -> list[np.ndarray]:
    """c_t = decay * c_(t-1) + lookups of step t, after every step (the definition, in numpy)."""
    c, out = np.zeros(ROWS), []
    for ids in steps:
        c = decay * c + np.bincount(ids.ravel(), minlength=ROWS)
        out.append(c.copy())
    return out


def _rtol(steps: list[np.ndarray], decay: float) -> float:
    """The float32 counts' documented bound (hotline.profiling.online): n * 2**-24 / (1 - decay) for at most n
    lookups of a row a step, plus the rounding of the float64 result it is read back through."""
    n = max(int(np.bincount(ids.ravel()).max()) for ids in steps)
    return n * 2.0**-24 / (1.0 - decay) + 2.0**-52


def test_counts_and_hot_set_are_continuous_across_forced_rescales(monkeypatch):
    decay, steps = 0.5, _steps(40)
    monkeypatch.setattr(online, "_RESCALE_AT", 8.0)  # the weight doubles per step: a rescale every 3 steps
    small = OnlineCounts(ROWS, decay)
    monkeypatch.setattr(online, "_RESCALE_AT", float("inf"))
    never = OnlineCounts(ROWS, decay)  # 2**40 stays far inside float64: no rescale needed at all
    rescales = 0
    for i, (ids, want) in enumerate(zip(steps, _naive(steps, decay))):
        monkeypatch.setattr(online, "_RESCALE_AT", 8.0)
        before = small.weight
        small.add(ids, OFFSETS)
        rescales += small.weight < before
        monkeypatch.setattr(online, "_RESCALE_AT", float("inf"))
        never.add(ids, OFFSETS)
        np.testing.assert_allclose(small.values(), want, rtol=_rtol(steps, decay), err_msg=f"step {i}")
        np.testing.assert_allclose(never.values(), want, rtol=_rtol(steps, decay), err_msg=f"step {i}")
        assert small.top(10).tolist() == never.top(10).tolist(), f"step {i}"
    assert rescales >= 10
    assert small.top(10).tolist() == list(range(30, 40))  # the recent popular rows, not the old ones


@pytest.mark.parametrize("decay", [0.99, 0.9])
def test_the_real_threshold_from_a_counter_state_just_below_it(decay):
    """A counter that has run long enough to sit just below the real threshold: one more step rescales it, and
    the counts and the chosen rows are those of the definition."""
    steps = _steps(12, seed=1)
    history = _naive(steps[:6], decay)[-1]  # the decayed counts so far (the old popular rows lead)
    c = OnlineCounts(ROWS, decay)
    c.weight = online._RESCALE_AT * decay * 1.0000001  # the next step's weight crosses the threshold
    c.raw[:] = history * c.weight * decay  # values() == history, to float32's rounding
    np.testing.assert_allclose(c.values(), history, rtol=2**-24)
    want = history
    for i, ids in enumerate(steps[6:]):
        before = c.weight
        c.add(ids, OFFSETS)
        want = decay * want + np.bincount(ids.ravel(), minlength=ROWS)
        if i == 0:
            assert c.weight < before, "this step must cross the threshold"
        np.testing.assert_allclose(
            c.values(), want, rtol=_rtol(steps, decay), err_msg=f"step {i} after the state"
        )
        assert c.top(10).tolist() == np.sort(np.argsort(-want, kind="stable")[:10]).tolist()


def test_counts_of_every_step_alike_are_exact_uint32_and_stop_at_the_top():
    """decay 1.0: whole counts in uint32 (4 bytes a row), exact; a count at the edge of the type stops at
    2**32 - 1 instead of wrapping round to a small number, so the row stays among the chosen ones."""
    c = OnlineCounts(ROWS, 1.0)
    assert c.raw.dtype == np.uint32 and c.raw.nbytes == 4 * ROWS
    steps = _steps(6)
    for ids in steps:
        c.add(ids, OFFSETS)
    want = np.bincount(np.concatenate(steps).ravel(), minlength=ROWS)
    np.testing.assert_array_equal(c.raw, want)
    np.testing.assert_array_equal(c.values(), want)
    top = 2**32 - 1
    c.raw[5], c.raw[6] = top - 2, top - 5
    c.add(np.array([[5, 5, 5], [6, 6, 7]], np.int32), OFFSETS)
    assert (int(c.raw[5]), int(c.raw[6]), int(c.raw[7])) == (top, top - 3, want[7] + 1)
    c.add(np.array([[5, 6, 6], [6, 6, 6]], np.int32), OFFSETS)
    assert int(c.raw[5]) == int(c.raw[6]) == top
    assert c.top(2).tolist() == [5, 6]


def test_decayed_counts_are_float32():
    assert OnlineCounts(ROWS, 0.99).raw.dtype == np.float32


@pytest.mark.parametrize("seed", range(8))
def test_top_rows_are_those_of_a_stable_sort(seed):
    """The selection a byte at a time: the k largest, ties to the lowest ids (many ties: small values), for
    uint32 and float32, every k."""
    from hotline.kernels.profile import top_rows

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    ints = rng.integers(0, [3, 2**32][seed % 2], n, dtype=np.uint64).astype(np.uint32)
    floats = (rng.random(n) * 10.0 ** rng.integers(-40, 38)).astype(np.float32) * (rng.random(n) < 0.8)
    for values in (ints, floats):
        for k in {0, 1, n // 3, n - 1, n, n + 4}:
            want = np.sort(np.argsort(-values.astype(np.float64), kind="stable")[: max(k, 0)])
            np.testing.assert_array_equal(top_rows(values, k), want, err_msg=f"k={k} {values.dtype}")
