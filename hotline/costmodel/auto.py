"""``mode='auto'`` for a run: :func:`resolve` makes the choice (:func:`hotline.costmodel.choose.choose`) on
every rank, rank 0 choosing and the others taking its choice; :func:`choose_for_run` gathers the figures it is
made on: the device's memory, the tables' bytes, a profile of a sample with held-out figures (or a given
profile), and the hardware (``--hardware``: a `hotline calibrate` JSON or a known GPU; default: the GPU torch
names when the table knows it, or this CPU, calibrated once and cached; the cold dir's disk, with
``--cold-store disk``, timed once per filesystem and record size and cached beside it:
:mod:`hotline.costmodel.machine`). Before any of that it refuses, with one line naming the flags, tables the
memory store cannot hold (:func:`hotline.training.preflight.check_memory`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from hotline.costmodel.choose import LOOKAHEAD, AutoChoice, ColdDisk, choose
from hotline.costmodel.estimate import Stats
from hotline.costmodel.machine import (
    device_memory,
    disk_hardware,
    hardware_for,
    torch_device_type,
    with_timed_pass,
)


def table_bytes(table_sizes: Sequence[int], embedding_dim: int, optimizer: str) -> int:
    """Bytes of every embedding row with its optimizer state."""
    from hotline.table_layout import bytes_per_row

    return int(sum(table_sizes)) * bytes_per_row(embedding_dim, optimizer)


def choose_for_run(config, dataset, *args, **kwargs) -> AutoChoice:
    """:func:`choose` for a TrainConfig and its Dataset: :func:`choose_and_profile`'s choice (its arguments)."""
    return choose_and_profile(config, dataset, *args, **kwargs)[0]


def choose_and_profile(
    config,
    dataset,
    hardware: str | dict | None = None,
    prof=None,
    progress: bool = False,
    nodes: int = 1,
    available: int | None = None,
    ranks: int = 1,
) -> tuple:
    """(:class:`AutoChoice`, the Profile it was priced with): :func:`choose` for a TrainConfig and its Dataset: profiles a sample with held-out figures unless
    ``prof`` (a Profile of this dataset) is given. With ``config.cold_store == 'disk'`` it prices the disk
    store in ``config.cold_dir`` (the hardware's ``disk`` section, else :func:`disk_hardware`). Before any
    long work it refuses a run whose rows cannot fit in this machine's memory, and prices only the hot budgets
    that fit it (``nodes``: machines the ranks run on, each holding its share; ``available``: the memory figure,
    default the smaller of the machine's ``MemAvailable`` and the cgroup's room, as
    :func:`~hotline.training.preflight.check_memory` takes it; ``ranks``: the run's ranks, each with its
    share of the disk store's rows and its own write buffer). The profile is the one
    :func:`~hotline.training.placing.profile_for` makes for the run: its placement is chosen from it, not from
    a second read of the sample."""
    from hotline.costmodel.phases import disk_timing, timed_pass
    from hotline.costmodel.workload import arch_of, workload_for
    from hotline.datasets.format import Dataset
    from hotline.table_layout import bytes_per_row

    dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    # the checks training makes first, made before the profiling: bad input is named before any long work
    from hotline.training.host_memory import host_memory
    from hotline.training.preflight import MemoryShortfall, check_ids, check_memory

    if dataset.train.num_batches(config.mini_batch_size) == 0:
        raise ValueError(f"the training split of {dataset.path} has no rows to train on")
    # hybrid needs the least host memory of the modes: the rows (memory store) or their index arrays (disk);
    # checked first, from the sizes alone: a run that cannot fit is refused before the ids are read
    available = host_memory() if available is None else available  # the machine's and the cgroup's
    check_memory(replace(config, mode="hybrid", hbm_budget=None), dataset, max(1, nodes), available)
    check_ids(dataset)  # reads every id of every split once

    def in_memory(budget: int) -> bool:
        """Whether hotline at ``budget`` passes the check training makes (the disk store's hot rows and DRAM
        tier are host memory too)."""
        try:
            hot = replace(config, mode="hotline", hbm_budget=int(budget), lookahead=LOOKAHEAD)
            check_memory(hot, dataset, max(1, nodes), available)
        except MemoryShortfall:
            return False
        return True

    hw = hardware_for(config.device, hardware, config.threads)
    _say_gpu_on_cpu(hardware, config.device)
    disk = None
    if config.cold_store == "disk":
        from hotline.tiers.held_rows import write_buffer_bytes

        cache = 0 if config.cold_cache == "auto" else int(config.cold_cache)
        disk = ColdDisk(str(config.cold_dir), cache, write_buffer_bytes(config, dataset.total_rows, ranks))
        if "disk" not in hw:  # a --hardware FILE with a disk section is used as is
            record = bytes_per_row(config.embedding_dim, config.optimizer)
            hw = {**hw, "disk": disk_hardware(config.cold_dir, record, config.cold_io_depth)}
        disk_timing(hw)  # one line for an outdated disk section, before the profiling
    if prof is None:
        from hotline.training.placing import profile_for

        prof = profile_for(config, dataset, progress)
    # the model the run trains: its MLPs, interaction and cross layers
    w = workload_for(prof, worker_threads=config.worker_threads, **arch_of(config))
    if hardware is None and torch_device_type(config.device) == "cpu":  # this CPU's own calibration
        hw = with_timed_pass(hw, w, config.threads, recalibrate=True)
    budgets = [int(b) for b in prof.curve().budget_bytes if in_memory(int(b))]
    try:  # device mode's check before its tables are made (on a CPU they are host memory)
        check_memory(
            replace(config, mode="device", cold_store="memory", cold_dir=None),
            dataset,
            max(1, nodes),
            available,
        )
        device_in_memory = True
    except MemoryShortfall:
        device_in_memory = False
    choice = choose(
        table_bytes(dataset.table_sizes, config.embedding_dim, config.optimizer),
        device_memory(config.device),
        hw,
        w,
        lambda b: Stats.from_profile(prof, int(b), batch_size=config.mini_batch_size),
        budgets,
        disk=disk,
        device_in_memory=device_in_memory,
    )
    choice.dense_pass = timed_pass(w, hw["device"])
    return choice, prof


def _say_gpu_on_cpu(hardware, device: str) -> None:
    """One line on stderr when ``--hardware`` names a GPU and the run trains on the CPU: the choice prices the
    GPU's speeds with this host's memory as the device's (the run is on this machine), not the GPU's."""
    from hotline.costmodel.hardware import known_gpus
    from hotline.units import format_size

    if not isinstance(hardware, str) or torch_device_type(device) != "cpu":
        return
    gpu = next((k for k in known_gpus() if k.lower() == hardware.lower()), None)
    if gpu is not None:
        print(
            f"hotline train: warning: --hardware {hardware} prices a {gpu}'s speeds, but this run trains on the CPU: "
            f"the device memory priced is this host's ({format_size(device_memory(device))}), not the {gpu}'s; "
            "run on the GPU (--device cuda) to price the GPU as it is",
            file=sys.stderr,
        )


def resolve(config, dataset, comm=None, hardware: str | dict | None = None) -> tuple:
    """``mode='auto'`` made concrete for every rank: rank 0 chooses (:func:`choose_for_run`, the ranks'
    machines counted from ``LOCAL_WORLD_SIZE``, each holding its ranks' share of the rows) and every rank
    takes that choice, figures and all (:meth:`~hotline.distributed.comm.Comm.broadcast_object`). Returns the
    config to train (:func:`choice_fields` applied) and the :class:`AutoChoice`."""
    return resolve_profiled(config, dataset, comm, hardware)[:2]


def resolve_profiled(config, dataset, comm=None, hardware: str | dict | None = None) -> tuple:
    """:func:`resolve`, and the Profile the choice was priced with on rank 0 (None on the others): the run's
    placement is chosen from it (:func:`~hotline.training.placing.placement_for`), so the sample is read once.
    The other ranks receive that placement from rank 0 and read no sample."""
    from hotline.costmodel.machine import torch_device_type
    from hotline.training.logs import STEP_KERNELS, note_first_compile

    world = comm.world_size if comm is not None else 1
    nodes = max(1, world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    choice, prof = None, None
    if comm is None or comm.rank == 0:
        note_first_compile(
            (*STEP_KERNELS, "hotline.kernels.profile")
        )  # the choice profiles and times kernels
        choice, prof = choose_and_profile(
            config, dataset, hardware, progress=config.progress, nodes=nodes, ranks=world
        )
        named = isinstance(hardware, str) and not os.path.exists(hardware)  # a device by name: priced only
        if named and torch_device_type(config.device) == "cpu":
            choice.trains_on = "this machine's CPU"
    if comm is not None:
        choice = comm.broadcast_object(choice)
    return replace(config, **choice_fields(choice)), choice, prof


def choice_fields(choice: AutoChoice) -> dict:
    """The TrainConfig fields a choice sets (device mode keeps no cold store: nothing is cold)."""
    fields = {"mode": choice.mode, "lookahead": choice.lookahead, "hbm_budget": choice.hbm_budget}
    if choice.mode == "device":
        fields.update(cold_store="memory", cold_dir=None, cold_cache=0)
    return fields
