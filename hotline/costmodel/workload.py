"""What a training step computes and moves, besides its held-out figures: the model (MLPs, interaction, cross
layers), the batch, the tables and the optimizer's record (:class:`Workload`), from a training config
(:func:`arch_of`) and a profile (:func:`workload_for`)."""

from __future__ import annotations

from dataclasses import dataclass

from hotline.kinds import INTERACTIONS
from hotline.table_layout import bytes_per_row

ARCH_FIELDS = ("bottom_mlp", "top_mlp", "interaction", "dcn_num_layers", "dcn_low_rank_dim")
"""The model fields a :class:`Workload` takes from a training config (:func:`arch_of`)."""


@dataclass
class Workload:
    """What one training step computes and moves (besides the held-out figures)."""

    batch_size: int
    """Mini-batch size B."""
    num_tables: int
    """Embedding tables T."""
    pooling_factor: float = 1
    """Lookups per table per sample L (multi-hot bags of per-table sizes: the measured mean, padding not counted)."""
    embedding_dim: int = 16
    """Embedding dimension D."""
    bottom_mlp: tuple[int, ...] = (13, 512, 256, 64, 16)
    """Bottom MLP layer widths (DLRM's --arch-mlp-bot; the last is the embedding dim)."""
    top_mlp: tuple[int, ...] = (512, 256, 1)
    """Top MLP widths after the interaction (DLRM's --arch-mlp-top; its input is the interaction's output)."""
    optimizer: str = "sgd"
    """Sparse optimizer (``hotline.table_layout.OPTIMIZERS``), which sets the state bytes a row carries."""
    worker_threads: int = 1
    """Numba threads of the look-ahead producer (host work of K >= 1 runs on them)."""
    interaction: str = "dot"
    """The model's feature interaction (``--arch-interaction-op``): ``dot``, ``cat`` or ``dcn`` (DCN-v2)."""
    dcn_num_layers: int = 3
    """Cross layers of the ``dcn`` interaction (``--dcn-num-layers``)."""
    dcn_low_rank_dim: int = 512
    """Rank r of each cross layer of the ``dcn`` interaction (``--dcn-low-rank-dim``)."""

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.num_tables <= 0 or self.embedding_dim <= 0:
            raise ValueError("batch_size, num_tables and embedding_dim must be positive")
        bytes_per_row(self.embedding_dim, self.optimizer)  # a known optimizer
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"the interaction must be one of {INTERACTIONS}, got {self.interaction!r}")
        if self.dcn_num_layers < 1 or self.dcn_low_rank_dim < 1:
            raise ValueError(f"dcn_num_layers and dcn_low_rank_dim must be >= 1, got {self.dcn_num_layers} and "
                             f"{self.dcn_low_rank_dim}")  # fmt: skip
        if len(self.bottom_mlp) < 2 or len(self.top_mlp) < 1 or min(*self.bottom_mlp, *self.top_mlp) < 1:
            raise ValueError(f"MLP widths must be positive, bottom at least two: got bottom {self.bottom_mlp}, "
                             f"top {self.top_mlp}")  # fmt: skip
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(f"the bottom MLP {'-'.join(map(str, self.bottom_mlp))} must end with the embedding "
                             f"dim {self.embedding_dim}")  # fmt: skip

    @property
    def lookups(self) -> int:
        return self.batch_size * self.num_tables * self.pooling_factor

    @property
    def row_bytes(self) -> int:
        return bytes_per_row(self.embedding_dim, self.optimizer)

    @property
    def interaction_width(self) -> int:
        """Width of the interaction's output, the top MLP's input: dot, the dense features beside the F(F-1)/2
        pairwise products of the F = T + 1 features; cat and dcn, the F * D features concatenated."""
        F, D = self.num_tables + 1, self.embedding_dim
        return F * (F - 1) // 2 + D if self.interaction == "dot" else F * D

    def _mlps(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(in, out) of the bottom MLP's layers and of the top MLP's (from the interaction's output)."""
        bot, top = list(self.bottom_mlp), [self.interaction_width, *self.top_mlp]
        return list(zip(bot[:-1], bot[1:])), list(zip(top[:-1], top[1:]))

    def cross_layers(self) -> list[tuple[int, int]]:
        """(in, out) of the GEMMs of the dcn cross network (none for dot and cat): per layer ``V_l x_l``
        (F*D -> r), then ``W_l`` of that (r -> F*D), neither with a bias of its own."""
        if self.interaction != "dcn":
            return []
        n, r = (self.num_tables + 1) * self.embedding_dim, self.dcn_low_rank_dim
        return [(n, r), (r, n)] * self.dcn_num_layers

    def mlp_layers(self) -> list[tuple[int, int]]:
        """(in, out) of every dense GEMM the model runs, in order: the bottom MLP, the cross network's low-rank
        products (dcn), the top MLP from the interaction's output (:attr:`interaction_width`)."""
        bottom, top = self._mlps()
        return bottom + self.cross_layers() + top

    def param_tensors(self) -> list[int]:
        """Elements of every dense parameter tensor, as hotline.models builds them: each MLP layer's weight and
        bias; each cross layer's ``W`` [F*D, r], ``V`` [r, F*D] and bias [F*D]."""
        bottom, top = self._mlps()
        cross = self.cross_layers()
        biases = [cross[0][0]] * self.dcn_num_layers if cross else []
        return [x for i, o in bottom + top for x in (i * o, o)] + [i * o for i, o in cross] + biases

    def dense_params(self) -> int:
        return sum(self.param_tensors())

    def elementwise_floats(self) -> int:
        """Floats read and written per sample by the cross layers' elementwise ``x_0 * (y + b) + x_l`` (dcn;
        0 otherwise): three ops over F*D floats, each reading two and writing one (9 F*D) forward, and twice
        that backward."""
        if self.interaction != "dcn":
            return 0
        return 27 * (self.num_tables + 1) * self.embedding_dim * self.dcn_num_layers


def arch_of(model) -> dict:
    """The :data:`ARCH_FIELDS` a model is built with, from a ``TrainConfig`` or ``DLRMConfig`` (attributes) or
    a dict of TrainConfig fields (the keys it has: a missing one takes TrainConfig's default, as a run would);
    lists become tuples. Splat it into :class:`Workload` or :func:`workload_for`."""
    get = model.get if isinstance(model, dict) else (lambda k: getattr(model, k, None))
    out = {}
    for k in ARCH_FIELDS:
        v = get(k)
        if v is not None:
            out[k] = tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else v
    return out


def workload_for(
    prof,
    bottom_mlp=None,
    top_mlp=(512, 256, 1),
    worker_threads: int = 1,
    interaction: str = "dot",
    dcn_num_layers: int = 3,
    dcn_low_rank_dim: int = 512,
) -> Workload:
    """The workload of training the model (its MLPs, interaction and cross layers: pass ``**arch_of(config)``)
    on ``prof``'s dataset with its mini-batch size, dim and optimizer (bottom MLP default: Kaggle DLRM's
    13-512-256-64, then the embedding dim if it differs)."""
    D = int(prof.profiler.embedding_dim)
    bottom = tuple(bottom_mlp) if bottom_mlp else ((13, 512, 256, 64) if D == 64 else (13, 512, 256, 64, D))
    return Workload(
        batch_size=prof.mini_batch_size,
        num_tables=prof.num_tables,
        pooling_factor=prof.total_lookups / max(1, prof.num_samples * prof.num_tables),
        embedding_dim=D,
        bottom_mlp=bottom,
        top_mlp=tuple(top_mlp),
        optimizer=prof.profiler.optimizer,
        worker_threads=worker_threads,
        interaction=interaction,
        dcn_num_layers=dcn_num_layers,
        dcn_low_rank_dim=dcn_low_rank_dim,
    )
