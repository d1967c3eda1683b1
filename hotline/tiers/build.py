"""The training mode a TrainConfig asks for, on this rank: ``device``, ``hybrid`` or ``hotline``, built from a
placement (the tiers never profile: that happens above them)."""

from __future__ import annotations

import time

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
from hotline.tiers.held_rows import write_buffer_bytes
from hotline.tiers.sharded_store import ShardedColdStore
from hotline.tiers.sparse_optim import SparseOptimizer
from hotline.tiers.tiered import TieredMode


def _stores(config, layout: TableLayout, placement: Placement, optimizer: SparseOptimizer, comm: Comm,
            max_rows: int, dataset: Dataset, counted: tuple | None,
            startup: dict) -> tuple[ColdStore, np.ndarray]:  # fmt: skip
    """The cold store of this rank and the initial rows of the hot tier (``counted``: the profile's ``(order,
    once)``, :meth:`~hotline.placement.Placement.take_sample_order`'s, or None); the seconds of the disk store's
    start-up phases go into ``startup``."""
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
        t0 = time.perf_counter()
        counted, once = _counted_rows(config, dataset, counted, layout.table_sizes)
        startup["count_s"] = time.perf_counter() - t0

        def order() -> np.ndarray:
            """The file's order, made by the store, which writes it to its file and frees it before the fill."""
            t = time.perf_counter()
            out = popularity_order(None, layout.num_rows, hot, layout.table_sizes, counted=counted, once=once)
            startup["order_s"] = time.perf_counter() - t
            return out

        cold = DiskColdStore(cold_file(config.cold_dir), layout, dim, optimizer, seed, order,
                             config.cold_io_depth, config.cold_direct, config.cold_cache, max_rows,
                             config.force, hot=hot, held_bytes=write_buffer_bytes(config, layout.num_rows),
                             lazy=config.cold_lazy)  # fmt: skip
        hot_w, cold.hot_initial = cold.hot_initial, None
        startup["fill_s"] = cold.host.fill_s
        return cold, hot_w
    if N == 1:
        weights = initial_tables(layout, dim, seed)
        hot = placement.fused_hot_ids()
        return LocalColdStore(weights, optimizer, pin, max_rows), weights[hot]
    if disk:
        from hotline.tiers.disk_store import DiskRows, cold_file, popularity_order

        local = layout.num_rows // N + (r < layout.num_rows % N)  # rows r, r + N, ...: local ids fused // N
        hot = placement.fused_hot_ids()
        counted, _ = _counted_rows(config, dataset, counted)
        counted = counted[counted % N == r] // N  # this rank's rows in count order (ties: local ids ascend)
        rows = DiskRows(cold_file(config.cold_dir, r, N), local, dim, optimizer,
                        popularity_order(None, local, hot[hot % N == r] // N, counted=counted),
                        config.cold_io_depth, config.cold_direct, config.cold_cache, config.force,
                        write_buffer_bytes(config, layout.num_rows, N))  # fmt: skip
        del counted
        hot_w = rows.fill_initial(layout, seed, r, N, hot=hot, lazy=config.cold_lazy)
        return ShardedColdStore(comm, rows, optimizer, layout.num_rows, defer=True), hot_w
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


def _counted_rows(
    config, dataset: Dataset, counted, table_sizes=None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The fused rows the profile's sample counts, most counted first, ties by id (the disk file's order), and
    with ``table_sizes`` each table's rows counted once (the order of the never-counted rows: None without).
    ``counted``: the profile's ``(order, once)`` the placement was chosen by (the sample is read once), else made
    by the counting pass alone, not a whole profile (no ranks, no held-out figures); the counts are freed once
    ordered (a row's width of every row)."""
    if counted is not None:
        return counted
    from hotline.kernels.profile import order_by_count
    from hotline.profiling.profiler import Profiler
    from hotline.tiers.disk_store import once_per_table

    profiler = Profiler(embedding_dim=config.embedding_dim, optimizer=config.optimizer,
                        mini_batch_size=config.mini_batch_size, seed=config.seed, progress=False)  # fmt: skip
    counts = profiler.count(dataset)
    once = None if table_sizes is None else once_per_table(counts, table_sizes)
    return order_by_count(counts), once


def build_mode(
    config, dataset: Dataset, placement: Placement | None = None, comm: Comm | None = None
) -> TrainMode:
    """The TrainMode of ``config.mode`` for this rank (one rank when ``comm`` is None). ``hybrid`` and
    ``hotline`` need the ``placement`` (profiling for one happens above the tiers, in training). A tiered mode's
    ``startup_s`` holds the seconds of its start-up phases: ``profile_s`` (a profiled placement's), ``store_s``
    (the cold store and the hot rows), and for the disk store on one rank ``count_s`` (the counting pass where the
    placement carried no profile), ``order_s`` (the file's order) and ``fill_s`` (the initial rows)."""
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
    counted = placement.take_sample_order()  # the profile's (order, once per table), used once and not kept
    startup = {"profile_s": placement.profile_s} if placement.profile_s is not None else {}
    t0 = time.perf_counter()
    cold, hot_w = _stores(config, layout, placement, opt, comm, max_rows, dataset, counted, startup)
    del counted
    startup["store_s"] = time.perf_counter() - t0
    mode = TieredMode(
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
    mode.startup_s = startup
    return mode
