"""DCN-v2's low-rank cross network, the interaction of DLRM-DCNv2 (MLPerf Training's DLRM benchmark).

Written to torchrec's definition (``torchrec.modules.crossnet.LowRankCrossNet`` inside
``torchrec.models.dlrm.InteractionDCNArch``): the same parameter names and shapes (``W_kernels.l`` [N, r],
``V_kernels.l`` [r, N], ``bias.l`` [N]), the same initialisation (Xavier-normal kernels, zero biases) and the
same order of operations, so that a state dict moves between the two unchanged and their outputs agree bit for
bit on the same weights. Shapes: B batch, N = F * D input width, r the low rank.
"""

from __future__ import annotations

import torch
from torch import nn


class LowRankCrossNet(nn.Module):
    """``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l`` for ``num_layers`` layers, [B, N] -> [B, N]."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int, generator: torch.Generator):
        super().__init__()
        if num_layers < 1 or low_rank < 1:
            raise ValueError(
                f"a cross net needs num_layers >= 1 and low_rank >= 1, got {num_layers}, {low_rank}"
            )
        # torchrec draws every W, then every V (Xavier-normal), then zeros the biases: kept in that order.
        self.W_kernels = nn.ParameterList(
            nn.Parameter(nn.init.xavier_normal_(torch.empty(in_features, low_rank), generator=generator))
            for _ in range(num_layers)
        )
        self.V_kernels = nn.ParameterList(
            nn.Parameter(nn.init.xavier_normal_(torch.empty(low_rank, in_features), generator=generator))
            for _ in range(num_layers)
        )
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(in_features)) for _ in range(num_layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for W, V, b in zip(self.W_kernels, self.V_kernels, self.bias):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, V), W) + b) + x
        return x


class InteractionDCNArch(nn.Module):
    """The cross net over the dense output [B, D] and the pooled embeddings [B, T, D], flattened to
    [B, F * D] (dense first, then the tables in order): [B, F * D] out."""

    def __init__(self, num_tables: int, embedding_dim: int, num_layers: int, low_rank: int,
                 generator: torch.Generator):  # fmt: skip
        super().__init__()
        self.crossnet = LowRankCrossNet((num_tables + 1) * embedding_dim, num_layers, low_rank, generator)

    def forward(self, dense_out: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        B = dense_out.shape[0]
        return self.crossnet(torch.cat([dense_out.unsqueeze(1), pooled], dim=1).reshape(B, -1))
