"""Collectives between the ranks of a run, counting the bytes each rank sends per kind of traffic.

One rank is the trivial case: every collective is a local no-op and nothing is counted, so single-process
code calls the same methods at no cost.

The backend follows the compute device (:func:`backend_for`): gloo on the CPU; on CUDA the default group is
NCCL and a gloo group of the same ranks sits beside it. A collective goes where its tensor lives: tensors on
the device (the dense gradients, the hot rows' gradients, device mode's sparse gradients) stay on the device
and go over NCCL; host tensors (the cold rows, the control flags, evaluation scores, exports) go over gloo.
Cold-row traffic stays on the host on purpose: the rows are read from and written to host memory at both
ends, by the look-ahead thread on its own group while the device computes, so NCCL would add a host-to-device
copy at the owner and a device-to-host copy at the requester, and queue them behind the step's compute.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict

import numpy as np
import torch


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share [lo, hi) of ``n`` samples: [rank*n/N, (rank+1)*n/N)."""
    return rank * n // world_size, (rank + 1) * n // world_size


def backend_for(device: torch.device | str) -> str:
    """The process-group backend of ranks that compute on ``device``: ``nccl`` on CUDA, ``gloo`` elsewhere."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


EXIT_PEER_LOST = 76
"""A rank's exit status when a collective failed because another rank is gone (BSD's EX_PROTOCOL): the rank
that stopped first is the cause, and the ``--nproc`` launcher names it (a signal's kill, or its own error)."""
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "closed by peer", "Broken pipe",
             "Read error", "Write error", "NCCL communicator was aborted", "remote process exited")  # fmt: skip
"""What a gloo or NCCL collective's error says when a peer rank's process is gone."""


class PeerLost(SystemExit):
    """A collective failed because another rank is gone: exits the rank (every ``finally`` runs) with
    :data:`EXIT_PEER_LOST` and no traceback; one line names it unless Hotline's launcher, which names the
    rank that stopped first, started this rank."""


@contextlib.contextmanager
def peer_guard(rank: int):
    """Turns a collective's error that says a peer is gone into :class:`PeerLost`."""
    try:
        yield
    except RuntimeError as e:  # torch.distributed.DistBackendError among them
        text = str(e)
        if not any(p in text for p in PEER_GONE):
            raise
        if not os.environ.get("HOTLINE_LAUNCHED"):
            first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
            print(f"hotline: error: rank {rank} lost its connection to another rank in a collective ({first[:200]}): "
                  f"that rank stopped first (killed, out of memory, or its own error: see its lines); the last "
                  f"complete checkpoint in --checkpoint-dir is intact", file=sys.stderr)  # fmt: skip
        raise PeerLost(EXIT_PEER_LOST) from None


class Comm:
    """The collectives of a run (gloo, or NCCL beside gloo), counting the bytes this rank sends per kind.

    Counted as sent over the wire by a ring algorithm: all-reduce of S bytes, 2(N-1)/N * S; all-gather of a
    (padded) S-byte share, (N-1) * S; all-to-all, the rows addressed to the other ranks. With one rank every
    collective is a local no-op and nothing is counted.

    ``backend``: ``gloo`` (every collective on host memory, device tensors copied there and back) or ``nccl``
    (device tensors collected on the device over ``group``, host tensors over ``host_group``, a gloo group).
    """

    def __init__(
        self, rank: int = 0, world_size: int = 1, group=None, host_group=None, backend: str = "gloo"
    ):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"Comm backend must be gloo or nccl, got {backend!r}")
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.group = group  # the process group of the collectives (None: the default group)
        # Host tensors' group: the same group on gloo; on NCCL the gloo group beside it.
        self.host_group = host_group if backend == "nccl" else group
        self.bytes_sent: dict[str, float] = defaultdict(float)

    @classmethod
    def from_process_group(cls) -> Comm:
        """The Comm of the default process group; on an NCCL group it creates the gloo group for host tensors
        (a collective: every rank calls it, in the same order)."""
        import torch.distributed as dist

        rank, size = dist.get_rank(), dist.get_world_size()
        if dist.get_backend() == "nccl":
            return cls(rank, size, None, dist.new_group(backend="gloo"), backend="nccl")
        return cls(rank, size)

    def on_device(self, t: torch.Tensor) -> bool:
        """Whether a collective of ``t`` runs on the device (NCCL) rather than on host memory (gloo)."""
        return self.backend == "nccl" and t.device.type != "cpu"

    def route(self, t: torch.Tensor):
        """The group a collective of ``t`` runs on and the device its buffers live on."""
        if self.on_device(t):
            return self.group, t.device
        return self.host_group, torch.device("cpu")

    def new_group(self) -> Comm:
        """A Comm on a new gloo group of the same ranks (a collective: every rank creates it, in the same order).

        Its collectives never interleave with this Comm's, so another thread can use it (the look-ahead
        fetches); with one rank it is a plain Comm. Give it back with :meth:`destroy`.
        """
        if self.world_size == 1:
            return Comm(self.rank, 1)
        import torch.distributed as dist

        with peer_guard(self.rank):
            return Comm(self.rank, self.world_size, dist.new_group(backend="gloo"))  # host tensors only

    def destroy(self) -> None:
        """Destroys this Comm's own group (from :meth:`new_group`; the default group is left alone). Once the
        default group is gone its subgroups went with it: nothing is left to destroy (a look-ahead left open
        until the interpreter's exit closes after the ranks' teardown)."""
        if self.group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)
            if self.host_group is self.group:
                self.host_group = None
            self.group = None

    def take_bytes(self) -> dict[str, float]:
        """Bytes sent since the last call, per kind (and resets the counts)."""
        out, self.bytes_sent = dict(self.bytes_sent), defaultdict(float)
        return out

    def all_reduce_(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """Sums ``t`` over ranks in place."""
        if self.world_size > 1:
            import torch.distributed as dist

            group, where = self.route(t)
            buffer = t.to(where)  # gloo: collectives on host memory (a no-op for host tensors and on NCCL)
            with peer_guard(self.rank):
                dist.all_reduce(buffer, group=group)
            if buffer is not t:
                t.copy_(buffer)
            N = self.world_size
            self.bytes_sent[kind] += 2 * (N - 1) / N * t.numel() * t.element_size()
        return t

    def all_gather_sizes(self, n: int) -> list[int]:
        """Every rank's ``n`` (a host int), in rank order: a collective over the host group (gloo), so that
        no size of a device tensor is ever read back from the device."""
        if self.world_size == 1:
            return [int(n)]
        import torch.distributed as dist

        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        with peer_guard(self.rank):
            dist.all_gather(sizes, torch.tensor([int(n)], dtype=torch.int64), group=self.host_group)
        self.bytes_sent["control"] += 8 * (self.world_size - 1)
        return [int(s) for s in torch.cat(sizes).tolist()]  # host memory: no wait for a device

    def all_gather_varlen(
        self, t: torch.Tensor, kind: str, sizes: list[int] | None = None
    ) -> list[torch.Tensor]:
        """Every rank's ``t`` (same trailing shape, any number of rows), in rank order.

        The row counts are exchanged on the host group (:meth:`all_gather_sizes`; ``sizes``: every rank's
        count, exchanged ahead, e.g. by the look-ahead thread) and the rows, padded to the largest count, where
        ``t`` lives: a device tensor is never read on the host, so on CUDA nothing here waits for the device
        (the payload's collective is queued on its stream)."""
        if self.world_size == 1:
            return [t]
        import torch.distributed as dist

        group, where = self.route(t)
        if sizes is None:
            sizes = self.all_gather_sizes(t.shape[0])
        elif len(sizes) != self.world_size or sizes[self.rank] != t.shape[0]:
            raise RuntimeError(
                f"rank {self.rank} sends {t.shape[0]} rows of {kind}; the sizes agreed were {sizes}"
            )
        if max(sizes) == 0:  # every rank sees the same sizes: none sends an empty collective
            self.bytes_sent[kind] += 0.0
            return [t[:0] for _ in sizes]
        padded = torch.zeros((max(sizes), *t.shape[1:]), dtype=t.dtype, device=where)
        padded[: t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        with peer_guard(self.rank):
            dist.all_gather(parts, padded, group=group)
        self.bytes_sent[kind] += (self.world_size - 1) * padded.numel() * padded.element_size()
        return [p[:s].to(t.device) for p, s in zip(parts, sizes)]

    def all_to_all(
        self,
        t: torch.Tensor,
        send_counts: np.ndarray,
        kind: str,
        recv_counts: np.ndarray | None = None,
        count: bool = True,
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Sends rows ``t`` grouped by destination (``send_counts[j]`` rows to rank j); returns what arrived
        (grouped by source) and the counts per source (exchanged first unless ``recv_counts`` is given).
        ``count=False``: the payload's bytes are not counted here (the caller counted them with its step)."""
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if self.world_size == 1:
            return t.clone(), send_counts.copy()
        import torch.distributed as dist

        group, where = self.route(t)
        if recv_counts is None:
            got = torch.empty(self.world_size, dtype=torch.int64, device=where)
            with peer_guard(self.rank):
                dist.all_to_all_single(got, torch.from_numpy(send_counts).to(where), group=group)
            recv_counts = got.cpu().numpy().copy()
            self.bytes_sent["control"] += 8 * (self.world_size - 1)
        device, t = t.device, t.to(where).contiguous()
        out = torch.empty((int(recv_counts.sum()), *t.shape[1:]), dtype=t.dtype, device=where)
        with peer_guard(self.rank):
            dist.all_to_all_single(
                out, t, [int(c) for c in recv_counts], [int(c) for c in send_counts], group=group
            )
        if count:
            row = int(np.prod(t.shape[1:])) * t.element_size()
            self.bytes_sent[kind] += float((send_counts.sum() - send_counts[self.rank]) * row)
        return out.to(device), recv_counts

    def broadcast_object(self, obj, src: int = 0):
        """Rank ``src``'s ``obj`` (any picklable object) on every rank, over the host group (what ranks agree
        on: a decision, not tensors)."""
        if self.world_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == src else None]
        with peer_guard(self.rank):
            dist.broadcast_object_list(box, group=self.host_group, group_src=src)  # src: a rank of this Comm
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            with peer_guard(self.rank):
                dist.barrier(group=self.host_group)  # on the host: an NCCL barrier guesses a device

    def all_ok(self, ok: bool) -> bool:
        """True when ``ok`` holds on every rank (so that all ranks raise together, none waits forever)."""
        flag = torch.tensor([0.0 if ok else 1.0])
        self.all_reduce_(flag, "control")
        return float(flag) == 0.0
