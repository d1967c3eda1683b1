"""``hotline data synthetic``: Criteo-like skewed click data whose labels come from a planted model.

Every row has 13 dense features (Criteo-like counts, some missing, stored as ``log(x + 1)`` float32 with
missing as 0, as the Criteo pipeline stores them) and one bag of ``L`` row ids per table (``L = 1``: one-hot).

* **Skew.** Table ``t`` has ``n_t`` rows. A lookup draws a rank ``r`` in ``[0, n_t)`` with probability
  proportional to ``1 / (r + 1) ** s_t`` (exactly, by rejection-inversion in :mod:`hotline.kernels.synthetic`),
  then maps rank to row id by a seeded bijection ``(a_t * r + b_t) mod n_t`` so hot rows are scattered over
  the table as in real data.
* **Planted model.** ``logit = bias + dense linear term + sum_t w_t * e_t(rank) + pairwise interactions``,
  label ~ Bernoulli(sigmoid(logit)). The per-row effect ``e_t`` is a seeded hash of (table, rank) scaled by
  ``1 / sqrt(1 + rank / EFFECT_RANK_SCALE)``: popular rows, which a model sees often, carry most of the
  signal. The bias is calibrated so the click rate is about ``TARGET_CTR``. The planted logit's own AUC on
  the validation split (the Bayes-optimal ceiling) is written to ``meta.json`` under ``synthetic``.
* **Splits** as in the Criteo Kaggle layout, by the rule of ``hotline data criteo`` (dlrm's): the N rows form
  7 "days"; the first 6 are train, the 7th is split in halves, test first, then val. So ``--raw-tsv`` output
  preprocessed by ``hotline data criteo`` gives the same splits.
* **Drift** (``--drift-days D --drift-rate R``, :mod:`hotline.datasets.drift`): the stream is D days; each day
  a share R of every table's head ranks moves to rows that were cold before. ``meta.json`` records the days.

Determinism. The rows form one stream that depends only on the parameters and the seed: rows are made in
chunks of ``CHUNK_ROWS`` (a fixed constant that is part of the stream's definition, like the seed), chunk
``c`` drawing from the children of ``SeedSequence([seed, 0, c])``: one stream each for the dense values, the
missing flags and the labels, and one per table, each used by a single call per chunk. The row order in the
stream is train, test, val (Criteo's file order). Guaranteed, for a given ``CHUNK_ROWS``: row ``i`` of the
stream is the same whatever ``N`` is (a run with fewer rows is a prefix of a run with more; only the split
boundaries move), whatever the number of threads, and whether or not a raw TSV is written; changing one
table's size or exponent changes no other table's ids (labels do change: they depend on every table).
Memory is bounded by one chunk, about ``CHUNK_ROWS * (T * (4 L + 24) + 300)`` bytes (200 MB for the 26
Kaggle tables, one-hot), plus 12 bytes per validation row for the planted AUC; no per-table arrays.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hotline._io import fsync_dir, temporary_name
from hotline._progress import bar_disable
from hotline.datasets.drift import RankDrift
from hotline.datasets.format import NUM_DENSE, SPLITS, DatasetWriter
from hotline.datasets.planted import TOP_SHARE, PlantedModel, Tables, make_rows, top_rows
from hotline.datasets.zipf import sample_zipf, zipf_pmf, zipf_top_share  # noqa: F401 - re-exported

# Rows per table of the 26 categorical features of Criteo Kaggle (Display Advertising Challenge), as dlrm
# reports them for the preprocessed Kaggle data.
KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

DEFAULT_ZIPF = 1.05
# Rows per generation chunk. Part of the definition of the stream: changing it changes the data for a seed.
CHUNK_ROWS = 1 << 18
# Bumped whenever the generated data for given parameters changes; part of the cache key of the default.
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of one synthetic dataset (see the module docstring for what they mean)."""

    rows: int
    """Total rows N over the train, val and test splits."""
    seed: int = 0
    """Seed of the whole stream: data and planted model."""
    table_sizes: tuple[int, ...] = KAGGLE_TABLE_SIZES
    """Rows per embedding table, before the cap."""
    max_rows_per_table: int | None = None
    """Caps every table size (dlrm's --max-ind-range); None keeps the sizes."""
    zipf: float | tuple[float, ...] = DEFAULT_ZIPF
    """Zipf exponent s of every table, or one per table (0 = uniform)."""
    pooling_factor: int = 1
    """Ids per bag L (dlrm's --num-indices-per-lookup, fixed); 1 = one-hot."""
    bag_sizes: tuple[int, ...] | None = None
    """Ids per bag of each table (multi-hot of per-table sizes, e.g. MLPerf's); None: ``pooling_factor`` for all."""
    variable_bags: bool = False
    """Each bag holds a uniform 1..L_t of its L_t slots (per sample and table), the rest padded with -1."""
    drift_days: int = 1
    """Days the row stream is cut into (1: no drift); each day moves popular ranks to new rows."""
    drift_rate: float = 0.0
    """Share of each table's head ranks that move to rows that were cold before, every day."""
    sizes: tuple[int, ...] = field(init=False)
    """Table sizes after the cap (derived)."""
    exponents: tuple[float, ...] = field(init=False)
    """Zipf exponent per table (derived)."""

    def __post_init__(self) -> None:
        if int(self.rows) != self.rows or self.rows < 0:
            raise ValueError(f"rows must be an integer >= 0, got {self.rows!r}")
        if int(self.seed) != self.seed or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        sizes = tuple(int(s) for s in self.table_sizes)
        if not sizes:
            raise ValueError("table_sizes must name at least one table")
        for t, (given, s) in enumerate(zip(self.table_sizes, sizes, strict=True)):
            if s != given or not 1 <= s < 2**31:
                raise ValueError(f"table_sizes[{t}] must be an integer in [1, 2**31), got {given!r}")
        if self.max_rows_per_table is not None:
            if int(self.max_rows_per_table) != self.max_rows_per_table or self.max_rows_per_table < 1:
                raise ValueError(
                    f"max_rows_per_table must be an integer >= 1, got {self.max_rows_per_table!r}"
                )
            sizes = tuple(min(s, int(self.max_rows_per_table)) for s in sizes)
        if isinstance(self.zipf, (int, float, np.floating, np.integer)):
            exponents = (float(self.zipf),) * len(sizes)
        else:
            exponents = tuple(float(z) for z in self.zipf)
            if len(exponents) != len(sizes):
                raise ValueError(
                    f"zipf has {len(exponents)} exponents but there are {len(sizes)} tables; "
                    "give one exponent or one per table"
                )
        for t, z in enumerate(exponents):
            if not (math.isfinite(z) and 0.0 <= z <= 10.0):
                raise ValueError(f"zipf exponent of table {t} must be in [0, 10], got {z}")
        if int(self.pooling_factor) != self.pooling_factor or self.pooling_factor < 1:
            raise ValueError(f"pooling_factor must be an integer >= 1, got {self.pooling_factor!r}")
        if self.bag_sizes is not None:
            bags = tuple(int(b) for b in self.bag_sizes)
            if len(bags) != len(sizes) or any(b < 1 or b != g for b, g in zip(bags, self.bag_sizes)):
                raise ValueError(
                    f"bag_sizes must be {len(sizes)} integers >= 1 (one per table), got {self.bag_sizes!r}"
                )
            if self.pooling_factor != 1:
                raise ValueError("give bag_sizes or pooling_factor, not both")
            object.__setattr__(self, "bag_sizes", bags)
        if int(self.drift_days) != self.drift_days or self.drift_days < 1:
            raise ValueError(f"drift_days must be an integer >= 1, got {self.drift_days!r}")
        if not 0.0 <= self.drift_rate <= 1.0:
            raise ValueError(f"drift_rate must be in [0, 1], got {self.drift_rate!r}")
        object.__setattr__(self, "table_sizes", tuple(int(s) for s in self.table_sizes))
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "exponents", exponents)

    @property
    def num_tables(self) -> int:
        return len(self.sizes)

    @property
    def bags(self) -> tuple[int, ...]:
        """Bag size L_t of every table."""
        return self.bag_sizes if self.bag_sizes is not None else (int(self.pooling_factor),) * self.num_tables

    @property
    def uniform(self) -> bool:
        """One bag size for all tables and no padding: the [N, T, L] dataset format."""
        return len(set(self.bags)) == 1 and not self.variable_bags

    def source(self) -> dict:
        """Every parameter, as written to meta.json's ``source`` (and hashed into the fingerprint)."""
        return {
            "kind": "synthetic",
            "generator_version": GENERATOR_VERSION,
            "chunk_rows": CHUNK_ROWS,
            "rows": int(self.rows),
            "seed": int(self.seed),
            "table_sizes": list(self.table_sizes),
            "max_rows_per_table": self.max_rows_per_table,
            "zipf": list(self.exponents),
            "pooling_factor": int(self.pooling_factor),
            # only when on: one-hot / fixed-L datasets keep their fingerprints
            **(
                {"bag_sizes": list(self.bags), "variable_bags": self.variable_bags}
                if not self.uniform
                else {}
            ),
            **(
                {"drift_days": int(self.drift_days), "drift_rate": float(self.drift_rate)}
                if self.drifts
                else {}
            ),
        }

    @property
    def drifts(self) -> bool:
        return self.drift_days > 1 and self.drift_rate > 0


# Order of the splits in the row stream (and in a raw TSV): Criteo Kaggle's file order, as dlrm reads it.
STREAM_ORDER = ("train", "test", "val")


def split_sizes(rows: int) -> dict[str, int]:
    """Rows per split in the Criteo Kaggle layout (the same rule as ``hotline data criteo``)."""
    from hotline.datasets.criteo import split_sizes as criteo_split_sizes

    return criteo_split_sizes("kaggle", [rows])


# ------------------------------------------------------------------------------------------- generation


def generate(
    out: str | os.PathLike,
    rows: int,
    *,
    seed: int = 0,
    table_sizes: Sequence[int] | None = None,
    max_rows_per_table: int | None = None,
    zipf: float | Sequence[float] = DEFAULT_ZIPF,
    pooling_factor: int = 1,
    bag_sizes: Sequence[int] | None = None,
    variable_bags: bool = False,
    raw_tsv: str | os.PathLike | None = None,
    progress: bool = True,
    drift_days: int = 1,
    drift_rate: float = 0.0,
    overwrite: bool = False,
) -> Path:
    """Generates a synthetic dataset directory at ``out`` (and optionally the same rows as raw Criteo TSV).

    ``table_sizes`` defaults to :data:`KAGGLE_TABLE_SIZES`; ``zipf`` is one exponent or one per table.
    An existing ``out`` is replaced only if it is a Hotline dataset and ``overwrite`` (the CLI's
    ``--force``), an existing ``raw_tsv`` only with ``overwrite``; anything else there is refused (see :func:`~hotline.datasets.format.check_output_dir`). Returns the dataset path. See the module docstring for the data, the planted model and determinism.
    """
    cfg = SyntheticConfig(
        rows=rows,
        seed=seed,
        table_sizes=KAGGLE_TABLE_SIZES if table_sizes is None else tuple(table_sizes),
        max_rows_per_table=max_rows_per_table,
        zipf=float(zipf) if np.ndim(zipf) == 0 else tuple(float(z) for z in zipf),
        pooling_factor=pooling_factor,
        bag_sizes=None if bag_sizes is None else tuple(bag_sizes),
        variable_bags=variable_bags,
        drift_days=drift_days,
        drift_rate=drift_rate,
    )
    return generate_config(cfg, out, raw_tsv=raw_tsv, progress=progress, overwrite=overwrite)


def generate_config(
    cfg: SyntheticConfig,
    out: str | os.PathLike,
    *,
    raw_tsv: str | os.PathLike | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Generates the dataset described by ``cfg`` at ``out``; see :func:`generate`."""
    from hotline.datasets.format import check_output_dir
    from hotline.outputs import guard

    check_output_dir(out, overwrite, [raw_tsv] if raw_tsv is not None else [])  # before any TSV is written
    if raw_tsv is not None:
        raw_tsv = guard("raw_tsv", raw_tsv, force=overwrite)  # replaced only with overwrite; a link's target
    if raw_tsv is not None and (max(cfg.bags) > 1 or cfg.variable_bags):
        raise ValueError(
            f"raw_tsv: the raw Criteo format has one id per table, but pooling_factor is {cfg.pooling_factor} "
            f"(bags of up to {max(cfg.bags)} ids); write raw TSV only with one-hot bags (pooling_factor 1)"
        )
    if raw_tsv is not None:
        from hotline.datasets.criteo_raw import NUM_CATEGORICAL

        if cfg.num_tables != NUM_CATEGORICAL:
            raise ValueError(
                f"raw_tsv: the raw Criteo format has {NUM_CATEGORICAL} categorical columns, but there are "
                f"{cfg.num_tables} tables; give {NUM_CATEGORICAL} table sizes to write raw TSV"
            )

        Path(raw_tsv).parent.mkdir(parents=True, exist_ok=True)
        # Written beside it under a name only Hotline uses (same suffix: .gz compresses), renamed at the end:
        # a failed run leaves no partial TSV and an existing file as it was.
        tsv = Path(raw_tsv).with_name(temporary_name(Path(raw_tsv)).name + Path(raw_tsv).suffix)
    tables = Tables(cfg)
    model = PlantedModel(cfg, tables)
    drift = RankDrift(cfg.sizes, cfg.drift_days, cfg.drift_rate, cfg.seed) if cfg.drifts else None
    sizes = split_sizes(cfg.rows)
    bounds, start = {}, 0
    for name in STREAM_ORDER:
        bounds[name] = (start, start + sizes[name])
        start += sizes[name]
    writer = DatasetWriter(
        out,
        list(cfg.sizes),
        pooling_factor=cfg.pooling_factor,
        overwrite=overwrite,
        inputs=[raw_tsv] if raw_tsv is not None else [],
        bag_sizes=None if cfg.uniform else list(cfg.bags),
        padded=cfg.variable_bags,
    )
    try:
        return _write(cfg, writer, tables, model, drift, sizes, bounds, raw_tsv and tsv, progress, raw_tsv)
    finally:
        if raw_tsv is not None:
            tsv.unlink(missing_ok=True)


def _write(cfg, writer, tables, model, drift, sizes, bounds, tsv, progress, raw_tsv) -> Path:
    """Fills the dataset (and the raw TSV at temporary name ``tsv``, moved to ``raw_tsv`` last)."""
    from tqdm.auto import tqdm

    from hotline.datasets.criteo_raw import write_raw_tsv as write_rows

    def write_raw_tsv(path, *arrays, append: bool) -> None:  # a failure names the file the user gave
        try:
            write_rows(path, *arrays, append=append)
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror}: cannot write {raw_tsv} (no partial file was left)") from e

    top_hits = np.zeros(cfg.num_tables, np.int64)
    val_logit, val_labels, clicks = [], [], 0
    lookups = np.zeros(cfg.num_tables, np.int64)
    with writer:
        arrays = {name: writer.create_split(name, sizes[name]) for name in SPLITS}
        bar = tqdm(
            total=cfg.rows, unit="rows", unit_scale=True, desc="synthetic", disable=bar_disable(progress)
        )
        for c, lo in enumerate(range(0, cfg.rows, CHUNK_ROWS)):
            hi = min(lo + CHUNK_ROWS, cfg.rows)
            chunk = make_rows(cfg, model, np.random.SeedSequence([cfg.seed, 0, c]), hi - lo, lo, drift)
            top_hits += chunk["top_hits"]
            lookups += chunk["lookups"]
            clicks += int(chunk["labels"].sum())
            for name, (s0, s1) in bounds.items():
                a, b = max(lo, s0), min(hi, s1)
                if a >= b:
                    continue
                dense, sparse, labels = arrays[name]
                dense[a - s0 : b - s0] = chunk["dense"][a - lo : b - lo]
                sparse[a - s0 : b - s0] = chunk["rows"][a - lo : b - lo]
                labels[a - s0 : b - s0] = chunk["labels"][a - lo : b - lo]
                if name == "val":
                    val_logit.append(chunk["logit"][a - lo : b - lo])
                    val_labels.append(chunk["labels"][a - lo : b - lo])
            if tsv:
                cats = np.stack(
                    [tables.raw_values(t, chunk["rows"][:, t, 0]) for t in range(cfg.num_tables)], 1
                )
                write_raw_tsv(tsv, chunk["labels"].astype(np.int64), chunk["counts"], cats, append=c > 0)
            bar.update(hi - lo)
        bar.close()
        if tsv and cfg.rows == 0:
            write_raw_tsv(
                tsv,
                np.zeros(0, np.int64),
                np.zeros((0, NUM_DENSE), np.int64),
                np.zeros((0, cfg.num_tables), np.int64),
                append=False,
            )
        for dense, sparse, labels in arrays.values():
            for a in (dense, sparse, labels):
                a.flush()
        del arrays
        extra = {"synthetic": _summary(cfg, model, top_hits, clicks, val_logit, val_labels, lookups)}
        if drift is not None:
            extra["drift"] = drift.meta(cfg.rows)
        path = writer.finish(source=cfg.source(), extra=extra)
        if tsv:  # durable before it takes the name, and the name after
            with open(tsv, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tsv, raw_tsv)
            fsync_dir(Path(raw_tsv).parent)
        return path


def _summary(cfg, model, top_hits, clicks, val_logit, val_labels, lookups) -> dict:
    """The ``synthetic`` entry of meta.json: planted AUC (the ceiling), click rate, measured skew (the share of
    each table's lookups, padding not counted, that hit its top rows)."""
    from hotline.training.metrics import roc_auc

    lookups = np.maximum(lookups, 1)
    logit = np.concatenate(val_logit) if val_logit else np.zeros(0)
    labels = np.concatenate(val_labels) if val_labels else np.zeros(0)
    auc = roc_auc(labels, logit) if labels.size else float("nan")
    return {
        "planted_val_auc": None if math.isnan(auc) else round(float(auc), 5),
        "click_rate": round(clicks / max(1, cfg.rows), 5),
        "top_share": TOP_SHARE,
        "top_rows": [top_rows(n) for n in cfg.sizes],
        "top_hit_share_measured": [round(float(h) / n, 5) for h, n in zip(top_hits, lookups)],
        "top_hit_share_expected": [
            round(zipf_top_share(n, s, top_rows(n)), 5) for n, s in zip(cfg.sizes, cfg.exponents, strict=True)
        ],
        "planted_model": {
            "bias": round(model.bias, 6),
            "table_weights": [round(float(w), 6) for w in model.table_weight],
            "dense_coefficients": [round(float(w), 6) for w in model.dense_coef],
            "interaction_pairs": [list(p) for p in model.pairs],
        },
    }
