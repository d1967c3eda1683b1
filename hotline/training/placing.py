"""The placement a training run uses: all-cold for ``hybrid``, loaded or profiled for ``hotline``; on N ranks
profiled once, by rank 0, and sent to the others."""

from __future__ import annotations

from hotline.datasets.format import Dataset
from hotline.placement import Placement


def profile_for(config, dataset: Dataset, progress: bool = True):
    """The profile a TrainConfig's hot rows are chosen from (and ``--mode auto`` prices budgets with): a
    sample of the training split at the run's dim, optimizer, mini-batch size and seed."""
    from hotline.profiling.profiler import profile

    return profile(
        dataset,
        embedding_dim=config.embedding_dim,
        optimizer=config.optimizer,
        mini_batch_size=config.mini_batch_size,
        seed=config.seed,
        progress=progress,
    )


def placement_for(config, dataset: Dataset, progress: bool = True, profile=None, comm=None) -> Placement:
    """The placement a TrainConfig asks for: all-cold for ``hybrid``; for ``hotline`` loaded from
    ``--placement`` or profiled under ``--hbm-budget``. Checked against the dataset and the embedding dim.
    ``profile``: :func:`profile_for`'s, made already (``--mode auto``'s): used instead of a second one, and
    its counted rows carried for the disk file's order in either mode.

    ``comm`` (:class:`~hotline.distributed.comm.Comm`, N ranks): a profiled placement is made by rank 0 alone
    (from the profile a ``--mode auto`` rank 0 made, or one of its own) and sent whole to the other ranks
    (:meth:`~hotline.distributed.comm.Comm.broadcast_object`), counted rows included, so the sample is read
    once for the N ranks and each holds the placement it would have profiled itself
    (``tests/test_placement_ranks.py``)."""
    if comm is None or comm.world_size == 1:
        return _placement(config, dataset, progress, profile)
    shared = (config.mode == "hybrid" and config.cold_store == "disk") or (
        config.mode != "hybrid" and not config.placement_path and config.hbm_budget is not None
    )
    if not shared:  # all-cold in host memory, or a placement file every rank reads
        return _placement(config, dataset, progress, profile)
    made = None
    if comm.rank == 0:
        try:
            made = _placement(config, dataset, progress, profile)
        except Exception as e:  # noqa: BLE001 -- sent: no rank waits for a placement that never comes
            made = e
    del profile  # rank 0's: its counted rows are the placement's now
    made = comm.broadcast_object(made)
    if isinstance(made, Exception):
        raise made
    return made


def _placement(config, dataset: Dataset, progress: bool, profile) -> Placement:
    """:func:`placement_for` on one process."""
    if config.mode == "hybrid":
        placement = Placement.all_cold(
            dataset.table_sizes, dataset_fingerprint=dataset.fingerprint, embedding_dim=config.embedding_dim
        )
        if profile is not None and config.cold_store == "disk":
            placement.carry_sample(profile)
        return placement
    if config.placement_path:
        placement = Placement.load(config.placement_path, dataset=dataset)
    elif config.hbm_budget is not None:
        profile = profile if profile is not None else profile_for(config, dataset, progress)
        placement = Placement.profiled(profile, config.hbm_budget)
    else:
        raise ValueError(
            "--mode hotline needs --placement FILE (from `hotline profile`) or --hbm-budget SIZE"
        )
    if placement.embedding_dim != config.embedding_dim:
        raise ValueError(
            f"the placement was made for embedding dim {placement.embedding_dim}, the model uses "
            f"{config.embedding_dim} (--arch-sparse-feature-size)"
        )
    return placement
