"""The cost model: which training mode, hot budget and look-ahead run fastest on a machine, in stages that read
like the algorithm (after torchrec's ``distributed/planner``), low to high:

- figures: what a step computes (:mod:`~hotline.costmodel.workload`) and the hardware it runs on
  (:mod:`~hotline.costmodel.hardware`: a description checked field by field, the shipped ``gpus.json``);
- estimate (:mod:`~hotline.costmodel.estimate`): what a step moves, from a profile's held-out figures
  (:meth:`Stats.from_profile`) and, with the disk store, how its cold rows meet the disk (:class:`DiskTier`);
- price (:mod:`~hotline.costmodel.phases`, :mod:`~hotline.costmodel.price`): seconds per phase, samples/s and
  the bottleneck of each mode (:func:`predict`). Pure: the pricing never times anything;
- timing probes, above the pricing and never imported by it: this host's calibration
  (:mod:`~hotline.costmodel.calibrate`, :mod:`~hotline.costmodel.dense_timing`), the disk's
  (:mod:`~hotline.costmodel.disk_calibrate`, :mod:`~hotline.costmodel.disk_overlap`), with the caches that
  keep them per machine (:mod:`~hotline.costmodel.machine`);
- choose (:mod:`~hotline.costmodel.choose`): the fastest configuration that fits, on figures alone; and
  :func:`hotline.costmodel.auto.resolve`, ``mode='auto'`` made concrete for every rank of a run.

This package's namespace holds the pricing (what ``from hotline import costmodel`` needs to price a mode);
the probes and the choice are imported from their modules.
"""

from hotline.costmodel.estimate import DiskTier, Stats
from hotline.costmodel.hardware import known_gpus, load_hardware
from hotline.costmodel.phases import (
    STEP_FORMAT,
    compute_features,
    compute_terms,
    disk_timing,
    pass_key,
    phases,
    timed_pass,
)
from hotline.costmodel.price import (
    PRICED_MODES,
    Prediction,
    predict,
    predict_all,
    prediction_table,
    shared_cores_lane,
    speedup_curve,
)
from hotline.costmodel.workload import ARCH_FIELDS, INTERACTIONS, Workload, arch_of, workload_for

__all__ = [
    "ARCH_FIELDS",
    "INTERACTIONS",
    "PRICED_MODES",
    "STEP_FORMAT",
    "DiskTier",
    "Prediction",
    "Stats",
    "Workload",
    "arch_of",
    "compute_features",
    "compute_terms",
    "disk_timing",
    "known_gpus",
    "load_hardware",
    "pass_key",
    "phases",
    "predict",
    "predict_all",
    "prediction_table",
    "shared_cores_lane",
    "speedup_curve",
    "timed_pass",
    "workload_for",
]
