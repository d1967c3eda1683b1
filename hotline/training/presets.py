"""Named training configurations: ``hotline train --preset NAME`` sets a set of TrainConfig fields at once,
each of which an explicit flag still overrides.

``mlperf-dcnv2`` is MLPerf Training's DLRM-DCNv2 (mlcommons/training ``recommendation_v2/torchrec_dlrm``):
dim 128, bottom MLP 13-512-256-128, top MLP 1024-1024-512-256-1, the DCN-v2 interaction with 3 cross layers
of rank 512, row-wise Adagrad at the reference's learning rate 0.005 (its README's command; Adagrad epsilon
1e-8 as the MLPerf rules fix it), the reference's warm-up / decay schedule with MLPerf's closed-division
steps (0, 0, 0: constant), and the global batch of 65536 scaled down to what the machine holds
(:func:`scaled_batch_size`).
"""

from __future__ import annotations

import os

MLPERF_GLOBAL_BATCH = 65536
"""MLPerf DLRM-DCNv2's global batch size."""

PRESETS: dict[str, dict] = {
    "mlperf-dcnv2": {
        "embedding_dim": 128,
        "bottom_mlp": [13, 512, 256, 128],
        "top_mlp": [1024, 1024, 512, 256, 1],
        "interaction": "dcn",
        "dcn_num_layers": 3,
        "dcn_low_rank_dim": 512,
        "optimizer": "rowwise-adagrad",
        "learning_rate": 0.005,
        "lr_warmup_steps": 0,
        "lr_decay_start_step": 0,
        "lr_decay_steps": 0,
        "mini_batch_size": MLPERF_GLOBAL_BATCH,
    }
}
"""Preset name -> TrainConfig field values."""

BYTES_PER_LOOKUP_FLOAT = 4 * 4
"""Bytes a step holds per looked-up float: the row, its gradient, the staging copy and the pooled share."""


def machine_memory(device: str) -> int:
    """Bytes of memory a step's batch lives in: the GPU's for a CUDA device, else the host's physical memory."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def scaled_batch_size(
    target: int, lookups_per_sample: int, dim: int, memory_bytes: int, share: float = 1 / 8
) -> int:
    """``target`` (MLPerf's 65536), halved until one step's looked-up rows (``lookups_per_sample`` rows of ``dim``
    floats per sample, :data:`BYTES_PER_LOOKUP_FLOAT` bytes per float) take at most ``share`` of
    ``memory_bytes``; never below 128."""
    per_sample = max(1, lookups_per_sample) * dim * BYTES_PER_LOOKUP_FLOAT
    batch = int(target)
    while batch > 128 and batch * per_sample > share * memory_bytes:
        batch //= 2
    return batch


def preset_values(name: str, known_fields: set[str]) -> dict:
    """The preset's field values that TrainConfig has (ValueError naming the presets for an unknown name)."""
    if name not in PRESETS:
        raise ValueError(f"--preset must be one of {sorted(PRESETS)}, got {name!r}")
    return {k: v for k, v in PRESETS[name].items() if k in known_fields}
