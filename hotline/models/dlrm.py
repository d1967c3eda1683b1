"""DLRM: bottom MLP (DenseArch), pooled embeddings (supplied by an embedding tier), interaction, top MLP.

The interaction is DLRM's ``dot`` (pairwise dot products), ``cat`` (concatenation), or ``dcn``: DCN-v2's
low-rank cross network (``crossnet.py``), which makes this torchrec's ``DLRM_DCN``.

The embedding tables are deliberately NOT inside this module: every training mode (device, hybrid, hotline)
stores and updates rows its own way and hands the model the pooled embeddings ``[B, T, D]``. That keeps the
dense part identical across modes, which is what makes exact equivalence testable.

Shapes: B batch, T tables (sparse features), D embedding dim, F = T + 1 interacting features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from hotline.kinds import INTERACTIONS
from hotline.models.crossnet import InteractionDCNArch

MAX_DCN_LAYERS = 1024
"""The most cross layers ``--dcn-num-layers`` takes: each runs in sequence in every step (DCN-v2 uses 2 to 4)."""


def parse_layers(spec: str, flag: str) -> list[int]:
    """Parses a dlrm-style layer list such as ``13-512-256-64-16``."""
    try:
        sizes = [int(s) for s in spec.split("-")]
    except ValueError:
        raise ValueError(f"{flag} {spec!r}: expected sizes separated by '-', e.g. 13-512-256-64-16") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"{flag} {spec!r}: every layer size must be a positive integer")
    return sizes


@dataclass(frozen=True)
class DLRMConfig:
    """Architecture of a DLRM, in the reference implementation's terms."""

    table_sizes: list[int]
    """Rows per embedding table (one table per sparse feature)."""
    embedding_dim: int = 16
    """Embedding row width D (``--arch-sparse-feature-size``)."""
    bottom_mlp: list[int] = field(default_factory=lambda: [13, 512, 256, 64, 16])
    """Bottom MLP layer sizes including the dense input width (``--arch-mlp-bot``)."""
    top_mlp: list[int] = field(default_factory=lambda: [512, 256, 1])
    """Top MLP layer sizes after the interaction (``--arch-mlp-top``); the last must be 1."""
    interaction: str = "dot"
    """Feature interaction: ``dot`` (pairwise dot products, as DLRM), ``cat`` (concatenation) or ``dcn``
    (DCN-v2's low-rank cross net over the concatenation, as torchrec's DLRM_DCN)."""
    dcn_num_layers: int = 3
    """Cross layers of the ``dcn`` interaction (``--dcn-num-layers``)."""
    dcn_low_rank_dim: int = 512
    """Rank r of each cross layer's ``W [F*D, r] V [r, F*D]`` (``--dcn-low-rank-dim``)."""

    def __post_init__(self) -> None:
        if not self.table_sizes or any(int(n) <= 0 for n in self.table_sizes):
            raise ValueError(f"table_sizes must be positive, got {self.table_sizes}")
        if self.embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be positive, got {self.embedding_dim}")
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"interaction must be one of {INTERACTIONS}, got {self.interaction!r}")
        check_dcn(self.dcn_num_layers, self.dcn_low_rank_dim)
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(
                f"--arch-mlp-bot ends with {self.bottom_mlp[-1]} but --arch-sparse-feature-size is "
                f"{self.embedding_dim}: the bottom MLP output must have the embedding width"
            )
        if self.top_mlp[-1] != 1:
            raise ValueError(f"--arch-mlp-top must end with 1 (one logit), got {self.top_mlp}")

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def num_dense(self) -> int:
        return self.bottom_mlp[0]

    @property
    def interaction_width(self) -> int:
        F, D = self.num_tables + 1, self.embedding_dim
        if self.interaction == "dot":
            return F * (F - 1) // 2 + D
        return F * D


def check_dcn(num_layers: int, low_rank: int) -> None:
    """Raises ValueError (one line naming the flag) for a cross net that cannot be: fewer than one layer or
    rank, or more layers than :data:`MAX_DCN_LAYERS` (a size too large for memory is the memory preflight's to
    name, :func:`hotline.training.preflight.check_dense_memory`)."""
    if num_layers < 1 or low_rank < 1:
        raise ValueError(
            f"--dcn-num-layers and --dcn-low-rank-dim must be >= 1, got {num_layers} and {low_rank}"
        )
    if num_layers > MAX_DCN_LAYERS:
        raise ValueError(
            f"--dcn-num-layers must be at most {MAX_DCN_LAYERS}, got {num_layers}: every cross layer runs in "
            f"sequence in every step (DCN-v2 uses 2 to 4)"
        )


def dense_parameters(config: DLRMConfig) -> int:
    """The dense model's parameters (weights and biases of both MLPs and the cross net), counted without
    building it."""
    mlps = [config.bottom_mlp, [config.interaction_width, *config.top_mlp]]
    n = sum(a * b + b for sizes in mlps for a, b in zip(sizes[:-1], sizes[1:]))
    if config.interaction == "dcn":
        width = (config.num_tables + 1) * config.embedding_dim
        n += config.dcn_num_layers * (2 * width * config.dcn_low_rank_dim + width)
    return n


def dense_activations(config: DLRMConfig) -> int:
    """Floats one sample's forward keeps for its backward (each layer's input and output, the cross net's
    low-rank and full-width products), counted without building the model."""
    n = sum(config.bottom_mlp) + config.interaction_width + sum(config.top_mlp)
    F, D = config.num_tables + 1, config.embedding_dim
    n += F * D + (F * F if config.interaction == "dot" else 0)  # the features and their pairwise products
    if config.interaction == "dcn":
        n += config.dcn_num_layers * (config.dcn_low_rank_dim + 3 * F * D)
    return 2 * n  # the outputs and their gradients


def _mlp(sizes: list[int], final_relu: bool, generator: torch.Generator) -> nn.Sequential:
    """Linear layers with ReLU in between, initialised as the reference DLRM does."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(n_in, n_out)
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (n_in + n_out)), generator=generator)
            lin.bias.normal_(0.0, math.sqrt(1.0 / n_out), generator=generator)
        layers.append(lin)
        if i < len(sizes) - 2 or final_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP: dense features [B, num_dense] -> [B, D]."""

    def __init__(self, sizes: list[int], generator: torch.Generator):
        super().__init__()
        self.mlp = _mlp(sizes, final_relu=True, generator=generator)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return self.mlp(dense)


class InteractionArch(nn.Module):
    """Feature interaction of the dense output [B, D] with pooled embeddings [B, T, D]."""

    def __init__(self, num_tables: int, op: str):
        super().__init__()
        self.op = op
        F = num_tables + 1
        li, lj = torch.tril_indices(F, F, offset=-1)
        # Built once: the strictly lower triangle of the F x F interaction matrix, as in DLRM, as flat indices:
        # index_select's backward (index_add) is about 4x faster on CPU than that of z[:, li, lj].
        self.register_buffer("tril_flat", li * F + lj, persistent=False)

    def forward(self, dense_out: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        B = dense_out.shape[0]
        features = torch.cat([dense_out.unsqueeze(1), pooled], dim=1)  # [B, F, D]
        if self.op == "cat":
            return features.reshape(B, -1)
        z = torch.bmm(features, features.transpose(1, 2))  # [B, F, F]
        return torch.cat([dense_out, z.flatten(1).index_select(1, self.tril_flat)], dim=1)


class OverArch(nn.Module):
    """Top MLP: interaction output -> one logit per sample."""

    def __init__(self, sizes: list[int], generator: torch.Generator):
        super().__init__()
        self.mlp = _mlp(sizes, final_relu=False, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(1)


class DLRM(nn.Module):
    """The dense part of DLRM; embedding rows come in already pooled as ``[B, T, D]``."""

    def __init__(self, config: DLRMConfig, seed: int = 0):
        super().__init__()
        self.config = config
        gen = torch.Generator().manual_seed(seed)
        self.dense_arch = DenseArch(config.bottom_mlp, gen)
        if config.interaction == "dcn":
            self.inter_arch = InteractionDCNArch(
                config.num_tables, config.embedding_dim, config.dcn_num_layers, config.dcn_low_rank_dim, gen
            )
        else:
            self.inter_arch = InteractionArch(config.num_tables, config.interaction)
        self.over_arch = OverArch([config.interaction_width, *config.top_mlp], gen)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Logits [B] from dense features [B, num_dense] and pooled embeddings [B, T, D]."""
        return self.over_arch(self.inter_arch(self.dense_arch(dense), pooled))


def init_embedding_table(rows: int, dim: int, seed: int, table: int) -> np.ndarray:
    """Initial weights of one table, uniform(-1/sqrt(rows), 1/sqrt(rows)) as in the reference DLRM.

    Seeded per (seed, table) so that every training mode starts from the same rows, whatever tier they
    live in.
    """
    rng = np.random.default_rng([seed, 7919, table])
    bound = 1.0 / math.sqrt(rows)
    return rng.uniform(-bound, bound, size=(rows, dim)).astype(np.float32)
