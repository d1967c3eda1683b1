"""The training mode a TrainConfig asks for, on this rank: ``device``, ``hybrid`` or ``hotline``, built from a
placement (the tiers never profile: that happens above them)."""

from __future__ import annotations

import numpy as np

from hotline.datasets.format import Dataset
from hotline.distributed.comm import Comm
from hotline.kinds import staging_slots
from hotline.models.dlrm import init_embedding_table
from hotline.placement import Placement
from hotline.table_layout import TableLayout
from hotline.tiers.base import TrainMode, initial_tables
from hotline.tiers.cold_store import ColdStore, LocalColdStore
from hotline.tiers.device import DeviceMode
from hotline.tiers.sharded_store import ShardedColdStore
from hotline.tiers.sparse_optim import SparseOptimizer
from hotline.tiers.tiered import TieredMode


def _stores(config, layout: TableLayout, placement: Placement, optimizer: SparseOptimizer, comm: Comm,
            max_rows: int, dataset: Dataset, counts: np.ndarray | None) -> tuple[ColdStore, np.ndarray]:  # fmt: skip
    """The cold store of this rank and the initial rows of the hot tier (``counts``: the profile's, or None)."""
    N, r, dim, seed = comm.world_size, comm.rank, config.embedding_dim, config.seed
    pin = False  # nothing reads the cold tier in place (copies go through pinned staging): no registration
    disk = config.cold_store == "disk"
    if disk:  # refused before any long work (the profile of the file's order, the initial fill)
        from hotline.tiers.disk_store import cold_file
        from hotline.tiers.store_files import check_cold_path

        check_cold_path(cold_file(config.cold_dir, r, N), config.force)
    if N == 1 and disk:
        from hotline.tiers.disk_store import DiskColdStore, cold_file, popularity_order

        hot = placement.fused_hot_ids()
        sizes = layout.table_sizes  # the never-counted rows table by table (the counts are not kept)
        order = popularity_order(_row_counts(config, dataset, counts), layout.num_rows, hot, sizes)
        cold = DiskColdStore(cold_file(config.cold_dir), layout, dim, optimizer, seed, order,
                             config.cold_io_depth, config.cold_direct, config.cold_cache, max_rows,
                             config.force)  # fmt: skip
        return cold, _hot_rows(layout, placement, dim, seed)
    if N == 1:
        weights = initial_tables(layout, dim, seed)
        hot = placement.fused_hot_ids()
        return LocalColdStore(weights, optimizer, pin, max_rows), weights[hot]
    if disk:
        from hotline.tiers.disk_store import DiskRows, cold_file, popularity_order

        local = ShardedColdStore.shard_rows(layout.num_rows, r, N)
        counts = _row_counts(config, dataset, counts)
        hot = placement.fused_hot_ids()
        order = popularity_order(counts[local], local.shape[0], hot[hot % N == r] // N)
        rows = DiskRows(cold_file(config.cold_dir, r, N), local.shape[0], dim, optimizer, order,
                        config.cold_io_depth, config.cold_direct, config.cold_cache, config.force)  # fmt: skip
        rows.fill_initial(layout, seed, r, N)
        return ShardedColdStore(comm, rows, optimizer, layout.num_rows, defer=True), _hot_rows(
            layout, placement, dim, seed
        )
    # One table at a time: the initial rows of this rank's shard and of the (replicated) hot tier.
    shard = np.empty((len(range(r, layout.num_rows, N)), dim), np.float32)
    hot_w = np.empty((placement.num_hot, dim), np.float32)
    h = 0
    for t, n in enumerate(layout.table_sizes):
        w = init_embedding_table(n, dim, seed, t)
        lo = int(layout.offsets[t])
        first = lo + (r - lo) % N  # the first fused row of table t that this rank owns
        if first < lo + n:
            shard[np.arange(first, lo + n, N) // N] = w[first - lo :: N]
        ids = placement.hot_ids[t]
        hot_w[h : h + ids.shape[0]] = w[ids]
        h += ids.shape[0]
    return ShardedColdStore(comm, shard, optimizer, layout.num_rows, defer=True), hot_w


def _hot_rows(layout: TableLayout, placement: Placement, dim: int, seed: int) -> np.ndarray:
    """The initial rows of the hot tier, table by table in chunks (no table is held whole)."""
    from hotline.tiers.disk_store import table_chunks

    hot_w = np.empty((placement.num_hot, dim), np.float32)
    h = 0
    for t, n in enumerate(layout.table_sizes):
        ids = placement.hot_ids[t]
        for lo, w in table_chunks(n, dim, seed, t):
            mine = (ids >= lo) & (ids < lo + w.shape[0])
            hot_w[h + np.flatnonzero(mine)] = w[ids[mine] - lo]
        h += ids.shape[0]
    return hot_w


def _row_counts(config, dataset: Dataset, counts: np.ndarray | None) -> np.ndarray:
    """Access counts of every fused row over the sample of the training split a profile counts (the disk
    file's order): ``counts``, those of the profile the placement was chosen by (the sample is read once),
    else the counting pass alone, not a whole profile (no ranks, no held-out figures)."""
    if counts is not None and counts.shape == (sum(dataset.table_sizes),):
        return counts
    from hotline.profiling.profiler import Profiler

    profiler = Profiler(embedding_dim=config.embedding_dim, optimizer=config.optimizer,
                        mini_batch_size=config.mini_batch_size, seed=config.seed, progress=False)  # fmt: skip
    return profiler.count(dataset)


def build_mode(
    config, dataset: Dataset, placement: Placement | None = None, comm: Comm | None = None
) -> TrainMode:
    """The TrainMode of ``config.mode`` for this rank (one rank when ``comm`` is None). ``hybrid`` and
    ``hotline`` need the ``placement`` (profiling for one happens above the tiers, in training)."""
    comm = comm if comm is not None else Comm()
    opt = SparseOptimizer(config.optimizer, config.learning_rate, dim=config.embedding_dim)
    layout = TableLayout(dataset.table_sizes)
    if config.mode == "device":
        return DeviceMode(layout, config.embedding_dim, opt, config.seed, config.device, comm, dataset.bags)
    if placement is None:
        raise ValueError(f"mode {config.mode!r} needs a placement")
    # A rank's share of a global batch; a batch larger than the data is clipped to it (as every mode does).
    max_batch = -(-max(1, min(config.mini_batch_size, len(dataset.train))) // comm.world_size)
    max_rows = max_batch * dataset.lookups_per_sample
    counts = placement.take_sample_counts()  # the profile's, used once and not kept
    cold, hot_w = _stores(config, layout, placement, opt, comm, max_rows, dataset, counts)
    return TieredMode(
        config.mode,
        layout,
        dataset.bags,
        config.embedding_dim,
        opt,
        placement,
        cold,
        hot_w,
        max_batch,
        config.device,
        in_flight=staging_slots(config.mode, config.lookahead),
        fused=config.fused_micro_batches,
    )
