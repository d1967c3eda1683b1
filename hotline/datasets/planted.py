"""The rows of the synthetic stream (:mod:`hotline.datasets.synthetic` writes them): Criteo-like dense
features, each table's rank -> row bijection and hash keys from the seed, the planted model whose logit draws
the labels, and one chunk of rows drawn from its seed sequence. The module docstring of
:mod:`hotline.datasets.synthetic` says what the data is and what its determinism guarantees."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from hotline.datasets.format import NUM_DENSE
from hotline.datasets.zipf import sample_zipf
from hotline.kernels.synthetic import bag_effects
from hotline.table_layout import PAD_ID

if TYPE_CHECKING:
    from hotline.datasets.drift import RankDrift
    from hotline.datasets.synthetic import SyntheticConfig

# Criteo-like dense features: per feature, the median count, the spread of log(count) and the share missing
# (roughly those of Criteo Kaggle's I1..I13).
DENSE_MEDIAN = np.array([1, 2, 6, 4, 2600, 33, 3, 7, 38, 1, 1, 0.3, 5], dtype=np.float64)
DENSE_LOG_SPREAD = np.array([1.2, 1.5, 1.3, 1.0, 1.6, 1.5, 1.3, 1.0, 1.2, 0.6, 1.0, 1.0, 1.1])
DENSE_MISSING = np.array([0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22])

# Planted model. Scales chosen so that on the default dataset the planted logit's AUC is about 0.82 and
# most of it is learnable from the rows a model sees often.
TARGET_CTR = 0.25
DENSE_SCALE = 0.26
"""Standard deviation of the dense linear term's coefficients (per standardised log-count feature)."""
TABLE_SCALE = 0.42
"""Largest weight of a table's per-row effect (effects have unit variance at rank 0)."""
NOISE_TABLE_SHARE = 0.25
"""Share of tables (chosen by the seed) with no effect on the label, as real data has useless features."""
EFFECT_RANK_SCALE = 200.0
"""Ranks well below this carry full-size effects; the effect of rank r shrinks as 1 / sqrt(1 + r / this)."""
INTERACTION_SCALE = 0.68
"""Weight of each pairwise product of two tables' second per-row effects."""
NUM_INTERACTIONS = 3
"""Number of table pairs (t, T - 1 - t) with an interaction term."""
CALIBRATION_ROWS = 1 << 14
TOP_SHARE = 0.01
"""Skew statistic written to meta.json: the share of lookups that hit a table's top 1% of rows."""


def top_rows(n: int, share: float = TOP_SHARE) -> int:
    """Number of rows in a table's top ``share`` (at least one)."""
    return max(1, math.ceil(share * n))


def _mix32(x: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finaliser: a bijection on uint32."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


class Tables:
    """Per-table constants derived from the seed: rank -> row bijection, effect keys, raw-value keys."""

    def __init__(self, cfg: SyntheticConfig):
        self.mult: list[int] = []
        self.shift: list[int] = []
        self.effect_key: list[int] = []
        self.interaction_key: list[int] = []
        self.raw_key: list[int] = []
        for t, n in enumerate(cfg.sizes):
            # One stream per table, so that one table's parameters never shift another's.
            rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1, 0, t]))
            keys = rng.integers(0, 2**64, size=3, dtype=np.uint64)
            self.effect_key.append(int(keys[0]))
            self.interaction_key.append(int(keys[1]))
            self.raw_key.append(int(keys[2]) & 0xFFFFFFFF)
            a = 1
            if n > 2:
                a = int(rng.integers(1, n))
                while math.gcd(a, n) != 1:
                    a = int(rng.integers(1, n))
            self.mult.append(a)
            self.shift.append(int(rng.integers(0, n)))

    def row_ids(self, t: int, ranks: np.ndarray, n: int) -> np.ndarray:
        """Row id of each rank of table t: (a * r + b) mod n, a bijection of [0, n) since gcd(a, n) = 1."""
        return (ranks * self.mult[t] + self.shift[t]) % n

    def raw_values(self, t: int, rows: np.ndarray) -> np.ndarray:
        """32-bit raw category value of each row of table t: distinct rows get distinct values."""
        return _mix32(rows.astype(np.uint32) ^ np.uint32(self.raw_key[t]))


class PlantedModel:
    """The model whose logit draws the labels; its parameters come from the seed."""

    def __init__(self, cfg: SyntheticConfig, tables: Tables):
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1, 1]))
        T = cfg.num_tables
        self.dense_coef = rng.normal(0.0, DENSE_SCALE, size=NUM_DENSE)
        self.table_weight = TABLE_SCALE * rng.uniform(0.3, 1.0, size=T)
        noise = rng.permutation(T)[: int(round(NOISE_TABLE_SHARE * T))]
        self.table_weight[noise] = 0.0
        self.pairs = [(t, T - 1 - t) for t in range(min(NUM_INTERACTIONS, T // 2))]
        self.interaction_tables = sorted({t for pair in self.pairs for t in pair})
        self.tables = tables
        # Dense standardisation and the bias come from a calibration sample of the same generator.
        self.dense_mean = np.zeros(NUM_DENSE)
        self.dense_std = np.ones(NUM_DENSE)
        self.bias = 0.0
        sample = make_rows(cfg, self, np.random.SeedSequence([cfg.seed, 2]), CALIBRATION_ROWS)
        dense = sample["dense"].astype(np.float64)
        self.dense_mean = dense.mean(axis=0)
        self.dense_std = np.maximum(dense.std(axis=0), 1e-6)
        logit = self.logit(sample["dense"], sample["table_logit"], sample["interactions"])
        self.bias = _calibrate_bias(logit, TARGET_CTR)

    def add_table_terms(
        self,
        t: int,
        ranks: np.ndarray,
        table_logit: np.ndarray,
        interactions: dict,
        lengths: np.ndarray | None = None,
    ) -> None:
        """Adds table t's main effect (bags [m, L] averaged) to ``table_logit`` [m] and keeps its second effect
        in ``interactions`` if an interaction pair uses it. Tables without either cost nothing. ``lengths``
        [m]: the bags are variable, only their first ``lengths`` ids count."""
        if self.table_weight[t] != 0.0:
            table_logit += self.table_weight[t] * _effects(ranks, self.tables.effect_key[t], lengths)
        if t in self.interaction_tables:
            interactions[t] = _effects(ranks, self.tables.interaction_key[t], lengths)

    def logit(self, dense: np.ndarray, table_logit: np.ndarray, interactions: dict) -> np.ndarray:
        """Planted logit of rows with log-count dense features [m, 13], the summed table effects [m] and the
        second effects of the interacting tables ({t: [m]})."""
        coef = self.dense_coef / self.dense_std  # standardised features without a standardised copy
        out = dense @ coef + (self.bias - self.dense_mean @ coef) + table_logit
        for a, b in self.pairs:
            out += INTERACTION_SCALE * interactions[a] * interactions[b]
        return out


def _effects(ranks: np.ndarray, key: int, lengths: np.ndarray | None) -> np.ndarray:
    """Mean per-rank effect of each bag [m] (of its first ``lengths`` ids when given)."""
    if lengths is None:
        return bag_effects(ranks, key, EFFECT_RANK_SCALE)
    m, L = ranks.shape
    each = bag_effects(ranks.reshape(-1, 1), key, EFFECT_RANK_SCALE).reshape(m, L)
    each[np.arange(L)[None, :] >= lengths[:, None]] = 0.0
    return each.sum(axis=1) / lengths


def _calibrate_bias(logit: np.ndarray, ctr: float) -> float:
    """The shift b with mean(sigmoid(logit + b)) = ctr, by bisection (the mean is increasing in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < ctr:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def make_rows(
    cfg: SyntheticConfig,
    model: PlantedModel,
    seq: np.random.SeedSequence,
    m: int,
    start: int = 0,
    drift: RankDrift | None = None,
) -> dict:
    """The first ``m`` rows of the chunk drawn from ``seq``: raw and log dense, row ids, effects, labels.

    Every random array comes from its own stream in one call of ``m`` rows, so these rows are the first ``m``
    of any larger call: the data of row i does not depend on the number of rows made.
    """
    T = cfg.num_tables
    # The bag-length streams come after the first 3 + T children: fixed bags draw exactly what they always did.
    normal_seq, missing_seq, label_seq, *table_seqs = seq.spawn(3 + T + (T if cfg.variable_bags else 0))
    table_seqs, length_seqs = table_seqs[:T], table_seqs[T:]
    # float32 throughout: three times faster than float64, and exact for counts below 2**24.
    x = np.random.default_rng(normal_seq).standard_normal((m, NUM_DENSE), dtype=np.float32)
    x *= DENSE_LOG_SPREAD.astype(np.float32)
    x += np.log1p(DENSE_MEDIAN).astype(np.float32)
    np.expm1(x, out=x)
    np.floor(x, out=x)
    np.maximum(x, 0.0, out=x)
    missing = np.random.default_rng(missing_seq).random((m, NUM_DENSE), dtype=np.float32) < DENSE_MISSING
    x[missing] = 0.0  # missing -> 0 before log(x + 1), as the Criteo pipeline does
    counts = x.astype(np.int64)
    counts[missing] = -1
    x += 1.0
    dense = np.log(x, out=x)  # log(float32(x) + 1) in float32, exactly as dlrm's Criteo pipeline
    bags = cfg.bags
    starts = np.concatenate([[0], np.cumsum(bags)])
    rows = np.empty((m, int(starts[-1])), np.int32)  # [m, C]: table t's bag is columns starts[t]:starts[t+1]
    table_logit = np.zeros(m)
    interactions: dict[int, np.ndarray] = {}
    top_hits = np.empty(T, np.int64)
    lookups = np.empty(T, np.int64)
    for t, (n, s) in enumerate(zip(cfg.sizes, cfg.exponents, strict=True)):
        L = bags[t]
        redraw_key = int(table_seqs[t].generate_state(1, np.uint64)[0])
        ranks = sample_zipf(np.random.default_rng(table_seqs[t]), n, s, (m, L), redraw_key)
        if drift is not None:  # the item at a rank depends on the day (effects follow the item)
            ranks = drift.apply(t, ranks, drift.day_of(start + np.arange(m), cfg.rows))
        lengths, pad = None, None
        if cfg.variable_bags:
            lengths = np.random.default_rng(length_seqs[t]).integers(1, L + 1, size=m)
            pad = np.arange(L)[None, :] >= lengths[:, None]
        top = ranks < top_rows(n)
        top_hits[t] = np.count_nonzero(top if pad is None else top & ~pad)
        lookups[t] = m * L if pad is None else int(lengths.sum())
        bag = model.tables.row_ids(t, ranks, n)
        if pad is not None:
            bag[pad] = PAD_ID
        rows[:, starts[t] : starts[t + 1]] = bag
        model.add_table_terms(t, ranks, table_logit, interactions, lengths)
    logit = model.logit(dense, table_logit, interactions)
    labels = (np.random.default_rng(label_seq).random(m) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    if cfg.uniform:
        rows = rows.reshape(m, T, bags[0])
    return {
        "counts": counts,
        "dense": dense,
        "rows": rows,
        "table_logit": table_logit,
        "interactions": interactions,
        "top_hits": top_hits,
        "lookups": lookups,
        "logit": logit,
        "labels": labels,
    }
