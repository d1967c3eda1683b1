"""The MLPerf Training DLRM-DCNv2 workload's shape: its 26 tables and their multi-hot bag sizes.

Both lists are those of the MLPerf reference (mlcommons/training ``recommendation_v2/torchrec_dlrm``, README:
``materialize_synthetic_multihot_dataset.py --num_embeddings_per_feature ... --multi_hot_sizes ...``): Criteo
1TB's 26 categorical features hashed to at most 40M rows each, and the fixed number of ids per sample that the
materialised multi-hot dataset gives each feature (214 ids per sample in all).
"""

from __future__ import annotations

PRESET = "mlperf-dcnv2"
"""The name of the preset (``hotline data synthetic --preset``, ``hotline train --preset``)."""

MLPERF_TABLE_SIZES: tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155,
    4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
"""Rows per table (``--num_embeddings_per_feature``)."""

MLPERF_BAG_SIZES: tuple[int, ...] = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
"""Ids per sample of each table (``--multi_hot_sizes``)."""
