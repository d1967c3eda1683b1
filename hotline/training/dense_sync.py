"""ONE all-reduce per step on N ranks: the dense gradients, the step's loss and the counters summed over ranks
(:data:`SUMMED_COUNTERS`), so every rank takes the same dense optimizer step."""

from __future__ import annotations

import torch

from hotline.distributed.comm import Comm
from hotline.tiers.base import DeferredLoss, StepStats, step_loss

SUMMED_COUNTERS = ("popular_samples", "working_set_rows", "stale_rows", "lookups", "hot_lookups")
"""Step counters summed over ranks (in the dense all-reduce); the rest are each rank's own."""


def all_reduce_dense(comm: Comm, model: torch.nn.Module, stats: StepStats) -> None:
    """Sums the dense gradients and the step's loss and counters over ranks in ONE all-reduce (on host
    memory over gloo). Over NCCL the gradients and the loss are summed on the device and the counters
    (host numbers) apart on the host: reading them back from the device would wait for the step."""
    params = list(model.parameters())
    summed = [k for k in SUMMED_COUNTERS if k in stats.counters]
    dev = params[0].device
    grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=dev) for p in params]
    counts = [stats.counters[k] for k in summed]
    on_device = comm.on_device(grads[0])
    if on_device:
        loss = stats.loss_sum
        loss = loss.device_value if isinstance(loss, DeferredLoss) else torch.tensor(float(loss), device=dev)
        flat = torch.cat(grads + [loss.reshape(1).to(dev, torch.float32)])
        if counts:  # the same counters on every rank (same mode): all skip it or none
            host = torch.tensor(counts, dtype=torch.float64)
            comm.all_reduce_(host, "control")
            counts = host.tolist()
    else:
        flat = torch.cat(grads + [torch.tensor([float(stats.loss_sum), *counts], device=dev)])
    comm.all_reduce_(flat, "dense_allreduce")
    at = 0
    for p in params:
        p.grad = flat[at : at + p.numel()].view_as(p).clone()
        at += p.numel()
    if on_device:
        stats.loss_sum = step_loss(flat[at])  # read late, like a single rank's
    else:
        stats.loss_sum = float(flat[at])
        counts = [float(flat[at + 1 + i]) for i in range(len(summed))]
    for k, v in zip(summed, counts):
        stats.counters[k] = float(v)
