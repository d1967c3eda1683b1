"""Sharded state of Hotline's collection under DistributedModelParallel, as torchrec's sharded collection has it.

Hotline's cold store shards a table's rows by fused row modulo N (row ``i`` of a table whose fused rows start at
``lo`` lives on rank ``(lo + i) % N``). torchrec's row-wise ShardedTensor needs contiguous blocks: rank ``r``
holds rows ``[n r // N, n (r + 1) // N)`` (the blocks of :func:`~hotline.torchrec_bridge.sharding.
hotline_parameter_sharding`). :func:`to_blocks` moves each rank's rows of one table to the owners of their
blocks in one all-to-all, :func:`from_blocks` moves them back: each rank sends and receives about ``n / N`` rows
of that table, and no rank ever holds a whole table. :func:`sharded_tensor` wraps a block as the ShardedTensor
torch.distributed.checkpoint saves, loads and reshards.

:class:`ShardedFusedOptimizer` is the fused optimizer of the sharded module with torchrec's sharded keys
(``embedding_bags.<table>.weight`` -> ``<table>.momentum1``, Adam's ``<table>.exp_avg_sq``): its ``state`` is
built from the rows each time it is read (a collective), and a load writes the blocks back into the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
from torchrec.optim.keyed import KeyedOptimizer

from hotline.distributed.comm import Comm
from hotline.tiers.sparse_optim import SparseOptimizer
from hotline.torchrec_bridge.fused_optim import HotlineFusedOptimizer

SHARDED_STATE_NAMES = {"momentum_1": "momentum1", "momentum_2": "exp_avg_sq", "row_counter": "row_counter"}
"""Hotline's (FusedEmbeddingBagCollection's) optimizer state names -> torchrec's sharded collection's (fbgemm's
first state is always ``momentum1``; Adam's second keeps fbgemm's name ``exp_avg_sq``)."""


def block_bounds(n: int, world_size: int) -> np.ndarray:
    """[N + 1] row bounds of the blocks: rank r holds rows [bounds[r], bounds[r + 1])."""
    return np.array([n * r // world_size for r in range(world_size + 1)], dtype=np.int64)


def _block_owner(rows: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    return np.searchsorted(bounds, rows, side="right") - 1


def to_blocks(comm: Comm, local: torch.Tensor, lo: int, n: int) -> torch.Tensor:
    """This rank's block of one table from every rank's ``local`` rows (the rows ``i`` with ``(lo + i) % N ==
    rank``, in order; [rows, ...]). A collective: every rank calls it for the same table. Always a copy: a
    checkpoint loaded into it reaches the rows only through ``load_state_dict`` (which also updates the hot
    rows), never behind their back."""
    N, r = comm.world_size, comm.rank
    if N == 1:
        return local.detach().clone()
    bounds = block_bounds(n, N)
    mine = np.arange((r - lo) % N, n, N, dtype=np.int64)
    send = np.bincount(_block_owner(mine, bounds), minlength=N)
    got, _ = comm.all_to_all(local.detach().contiguous(), send, "state")
    rows = np.arange(bounds[r], bounds[r + 1], dtype=np.int64)
    order = np.argsort((lo + rows) % N, kind="stable")  # arrivals: by source rank, rows increasing within
    block = torch.empty((rows.shape[0], *local.shape[1:]), dtype=local.dtype)
    block[torch.from_numpy(order)] = got
    return block


def from_blocks(comm: Comm, block: torch.Tensor, lo: int, n: int) -> torch.Tensor:
    """The inverse of :func:`to_blocks`: this rank's rows of one table (in order) from every rank's block."""
    N, r = comm.world_size, comm.rank
    if N == 1:
        return block
    bounds = block_bounds(n, N)
    rows = np.arange(bounds[r], bounds[r + 1], dtype=np.int64)
    owner = (lo + rows) % N
    order = np.argsort(owner, kind="stable")
    got, _ = comm.all_to_all(block.detach()[torch.from_numpy(order)].contiguous(), np.bincount(owner, minlength=N),
                             "state")  # fmt: skip
    return got  # from each block owner in rank order, rows increasing: this rank's rows in order


def sharded_tensor(
    block: torch.Tensor, n: int, rank: int, world_size: int, process_group=None
) -> ShardedTensor:
    """``block`` (rank ``rank``'s rows [bounds[r], bounds[r + 1]) of an [n, ...] tensor) as a row-wise
    ShardedTensor over ``world_size`` ranks."""
    bounds = block_bounds(n, world_size)
    trailing = list(block.shape[1:])
    metas = [
        ShardMetadata(shard_offsets=[int(bounds[k])] + [0] * len(trailing),
                      shard_sizes=[int(bounds[k + 1] - bounds[k]), *trailing], placement=f"rank:{k}/cpu")
        for k in range(world_size)
    ]  # fmt: skip
    props = TensorProperties(dtype=block.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)  # fmt: skip
    meta = ShardedTensorMetadata(
        shards_metadata=metas, size=torch.Size([n, *trailing]), tensor_properties=props
    )
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        [Shard(block, metas[rank])], meta, process_group=process_group
    )


def local_block(value: ShardedTensor, n: int, rank: int, world_size: int, key: str) -> torch.Tensor:
    """The block of this rank in a ShardedTensor laid out as :func:`sharded_tensor` lays it (what
    ``state_dict()`` gave and torch.distributed.checkpoint loaded into); a one-line error otherwise."""
    bounds = block_bounds(n, world_size)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    shards = value.local_shards()
    if hi == lo and not shards:
        return torch.empty((0, *value.shape[1:]))
    if (len(shards) != 1 or shards[0].metadata.shard_offsets[0] != lo
            or shards[0].metadata.shard_sizes[0] != hi - lo):  # fmt: skip
        raise ValueError(
            f"{key}: a ShardedTensor laid out for another sharding; load it with torch.distributed.checkpoint "
            "(dcp.load into this model's state_dict(), which reshards), then load_state_dict"
        )
    return shards[0].tensor


class ShardedFusedOptimizer(HotlineFusedOptimizer):
    """The sharded collection's KeyedOptimizer: torchrec's sharded keys, state as row-wise ShardedTensors.

    Args:
        params: ``embedding_bags.<table>.weight`` -> the table's (local rows') parameter.
        optimizer, step_fn: as :class:`HotlineFusedOptimizer`'s.
        build_state: the state by parameter (``<table>.momentum1`` -> ShardedTensor ...): a collective.
        load_state: writes a state built by ``build_state`` (its blocks since loaded into) back into the rows.
    """

    def __init__(self, params: dict[str, torch.Tensor], optimizer: SparseOptimizer,
                 step_fn: Callable[[SparseOptimizer], int], build_state: Callable[[], dict],
                 load_state: Callable[[dict], None]):  # fmt: skip
        self._build_state, self._load_state = build_state, load_state
        self._built: dict[Any, Any] = {}
        self._ready = False
        super().__init__(params, {}, optimizer, step_fn, lambda: None, lambda: None)
        self._ready = True

    @property
    def state(self) -> dict[Any, Any]:
        """The optimizer state, built from the rows now (every rank reads it together: a collective)."""
        if self._ready:
            self._built = self._build_state()
        return self._built

    @state.setter
    def state(self, value) -> None:  # KeyedOptimizer's constructor assigns it
        self._built = dict(value)

    def state_dict(self) -> dict[str, Any]:
        return KeyedOptimizer.state_dict(self)

    def step(self, closure: Any = None) -> None:
        self._built = {}
        super().step(closure)

    def post_load_state_dict(self) -> None:
        """Writes the state last built (which ``load_state_dict`` has just copied into) back into the rows."""
        built, self._built = self._built, {}
        self._load_state(built)
