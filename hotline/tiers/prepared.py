"""PreparedStep: one step of a tiered mode after dispatch and fetch, its rows and indices on the device; and the
refresh of its stale rows (those an earlier, still unfinished step may update) just before it computes."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.dispatch import MicroBatches
from hotline.kernels.gather import forward_stale, partition_stale
from hotline.tiers.cold_store import ColdFetch, ColdStore
from hotline.tiers.packing import CopyPack

INDEX_NAMES = (
    "popular_samples",
    "non_popular_samples",
    "pop_ids",
    "hot_pos",
    "hot_slot",
    "cold_pos",
    "cold_slot",
)
"""The micro-batches' index arrays a step copies to the device (``MicroBatches`` fields)."""


@contextlib.contextmanager
def on_stream(stream):
    """``torch.cuda.stream(stream)``, or nothing for ``stream`` None (the CPU, or no side stream)."""
    if stream is None:
        yield
    else:
        with torch.cuda.stream(stream):
            yield


@dataclass
class PreparedStep:
    """A batch after dispatch and fetch: what the compute of one step needs, already on the device."""

    batch: Batch
    micro: MicroBatches
    fetch: ColdFetch
    """The working set's rows as the cold store fetched them (and its bookkeeping)."""
    work: torch.Tensor
    """[U, D] working rows on the device (updated in place by the step)."""
    work_state: torch.Tensor
    """[U] their optimizer state (empty for SGD)."""
    index: dict[str, torch.Tensor]
    """The micro-batches' index arrays and dense inputs as device tensors (copied with the rows)."""
    staging: tuple[torch.Tensor, torch.Tensor]
    """The host staging buffers the rows came through (reused for the write-back)."""
    ready: object | None = None
    """A CUDA event recorded after the copies (None on CPU)."""
    slot: int = 0
    """The staging slot (and copy packs) the step uses."""
    seq: int = 0
    """The step's position among the mode's prepared steps (tags its device-clock phases)."""
    times: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    hot_sizes: list[int] | None = None
    """Every rank's count of distinct hot rows in its step, exchanged ahead by the look-ahead thread."""
    hooks: dict = field(default_factory=dict)
    """The executor's calls at points of the compute (see :meth:`reached`)."""

    def reached(self, point: str) -> None:
        """Runs the executor's hook for ``point`` once: ``"cold"`` before the working rows are first read (the
        stale rows' refresh), ``"updated"`` once they are final (their write-back starts)."""
        hook = self.hooks.pop(point, None)
        if hook is not None:
            hook()

    @property
    def step(self) -> int:
        """Position of the step in a look-ahead run (-1: prepared when due)."""
        return self.fetch.step

    @property
    def stale(self) -> np.ndarray:
        """Working-buffer slots an earlier, unfinished step may update: refreshed just before compute."""
        return self.fetch.stale


def refresh_stale(
    prep: PreparedStep,
    live: dict[int, PreparedStep] | None,
    cold: ColdStore,
    device: torch.device,
    host: bool,
    pack: CopyPack | None,
) -> int:
    """Re-reads the stale working rows of ``prep`` (whose copies the compute stream already waits for);
    returns how many were forwarded.

    ``live``: the computed steps whose rows are not written back yet (by step), with their working buffers
    still on the device. A stale row whose last holder is among them is copied from that buffer (device to
    device: its value is final, the holder computed before this step), the rest come from the cold store,
    whose copy is fresh (their holders were written back). Without ``live`` every stale row comes from the
    cold store, which the caller must let every earlier step write back to first. ``host``: the rows go
    straight into the working buffer in host memory (a CPU run); otherwise they go to the device in one or
    two copies from ``pack`` (pinned), or one copy per array without one.
    """
    fetch, forwarded = prep.fetch, 0
    slots = fetch.stale
    if host:
        # one pass over the stale slots for the live holders, one for the rest
        work, state = prep.work.numpy(), prep.work_state.numpy()
        if live and slots.size and cold.forwards_stale:
            buffers = [(o, h.work.numpy(), h.work_state.numpy(), h.fetch.rows) for o, h in live.items()]
            forwarded, slots = forward_stale(
                work, state, slots, fetch.stale_owner, fetch.stale_slot, fetch.rows, buffers
            )
        cold.refresh_into(fetch, slots, work, state)
        return forwarded
    arrays: dict[str, np.ndarray] = {}
    holders: list[PreparedStep] = []
    if live and slots.size and cold.forwards_stale:
        steps = list(live)  # each live step's slots checked to hold the rows (a kernel, tested on CPU)
        held = [live[o].fetch.rows for o in steps]
        groups, slots = partition_stale(slots, fetch.stale_owner, fetch.stale_slot, fetch.rows, steps, held)
        for o, (mine, theirs) in zip(steps, groups):
            if mine.size:
                arrays[f"mine{len(holders)}"], arrays[f"theirs{len(holders)}"] = mine, theirs
                holders.append(live[o])
                forwarded += int(mine.size)
    slots, w, s = cold.refresh(fetch, slots)
    if slots.size:
        arrays["slots"], arrays["w"] = slots, w
        if s.size:
            arrays["s"] = s
    if not arrays:
        return forwarded
    # Every index and row goes to the device in one or two asynchronous copies from the slot's pinned
    # refresh pack, queued on the compute stream (no pageable copy that would synchronise it).
    if pack is not None:
        dev = pack.copy(arrays, device, device.type == "cuda")
    else:
        dev = {k: torch.from_numpy(a).to(device) for k, a in arrays.items()}
    with torch.no_grad():
        for i, src in enumerate(holders):  # device to device: the holder computed before this step
            theirs = dev[f"theirs{i}"]
            state = src.work_state.index_select(0, theirs) if src.work_state.numel() else None
            _copy_rows(prep, dev[f"mine{i}"], src.work.index_select(0, theirs), state)
        if "slots" in dev:
            _copy_rows(prep, dev["slots"], dev["w"], dev.get("s"))
    return forwarded


def _copy_rows(prep: PreparedStep, idx: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None) -> None:
    with torch.no_grad():
        prep.work.index_copy_(0, idx, w)
        if s is not None:
            prep.work_state.index_copy_(0, idx, s)
