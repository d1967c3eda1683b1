"""Collectives between the ranks of a run, counting the bytes each rank sends per kind of traffic.

One rank is the trivial case: every collective is a local no-op and nothing is counted, so single-process
code calls the same methods at no cost.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share [lo, hi) of ``n`` samples: [rank*n/N, (rank+1)*n/N)."""
    return rank * n // world_size, (rank + 1) * n // world_size


class Comm:
    """The collectives of a run (gloo or NCCL), counting the bytes this rank sends per kind of traffic.

    Counted as sent over the wire by a ring algorithm: all-reduce of S bytes, 2(N-1)/N * S; all-gather of a
    (padded) S-byte share, (N-1) * S; all-to-all, the rows addressed to the other ranks. With one rank every
    collective is a local no-op and nothing is counted.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, group=None):
        self.rank = rank
        self.world_size = world_size
        self.group = group  # the process group of the collectives (None: the default group)
        self.bytes_sent: dict[str, float] = defaultdict(float)

    @classmethod
    def from_process_group(cls) -> Comm:
        import torch.distributed as dist

        return cls(dist.get_rank(), dist.get_world_size())

    def new_group(self) -> Comm:
        """A Comm on a new gloo group of the same ranks (a collective: every rank creates it, in the same order).

        Its collectives never interleave with this Comm's, so another thread can use it (the look-ahead
        fetches); with one rank it is a plain Comm. Give it back with :meth:`destroy`.
        """
        if self.world_size == 1:
            return Comm(self.rank, 1)
        import torch.distributed as dist

        return Comm(self.rank, self.world_size, dist.new_group(backend="gloo"))

    def destroy(self) -> None:
        """Destroys this Comm's own group (from :meth:`new_group`; the default group is left alone)."""
        if self.group is not None:
            import torch.distributed as dist

            dist.destroy_process_group(self.group)
            self.group = None

    def take_bytes(self) -> dict[str, float]:
        """Bytes sent since the last call, per kind (and resets the counts)."""
        out, self.bytes_sent = dict(self.bytes_sent), defaultdict(float)
        return out

    def all_reduce_(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """Sums ``t`` over ranks in place."""
        if self.world_size > 1:
            import torch.distributed as dist

            host = t.cpu()  # gloo: collectives on host memory (a no-op copy for CPU tensors)
            dist.all_reduce(host, group=self.group)
            if host is not t:
                t.copy_(host)
            N = self.world_size
            self.bytes_sent[kind] += 2 * (N - 1) / N * t.numel() * t.element_size()
        return t

    def all_gather_varlen(self, t: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every rank's ``t`` (same trailing shape, any number of rows), in rank order."""
        if self.world_size == 1:
            return [t]
        import torch.distributed as dist

        n = torch.tensor([t.shape[0]], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, n, group=self.group)
        sizes = [int(s) for s in sizes]
        padded = torch.zeros((max(sizes), *t.shape[1:]), dtype=t.dtype)
        padded[: t.shape[0]] = t.cpu()
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        self.bytes_sent["control"] += 8 * (self.world_size - 1)
        self.bytes_sent[kind] += (self.world_size - 1) * padded.numel() * padded.element_size()
        return [p[:s].to(t.device) for p, s in zip(parts, sizes)]

    def all_to_all(
        self, t: torch.Tensor, send_counts: np.ndarray, kind: str, recv_counts: np.ndarray | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Sends rows ``t`` grouped by destination (``send_counts[j]`` rows to rank j); returns what arrived
        (grouped by source) and the counts per source (exchanged first unless ``recv_counts`` is given)."""
        send_counts = np.asarray(send_counts, dtype=np.int64)
        if self.world_size == 1:
            return t.clone(), send_counts.copy()
        import torch.distributed as dist

        if recv_counts is None:
            got = torch.empty(self.world_size, dtype=torch.int64)
            dist.all_to_all_single(got, torch.from_numpy(send_counts), group=self.group)
            recv_counts = got.numpy().copy()
            self.bytes_sent["control"] += 8 * (self.world_size - 1)
        device, t = t.device, t.cpu().contiguous()
        out = torch.empty((int(recv_counts.sum()), *t.shape[1:]), dtype=t.dtype)
        dist.all_to_all_single(
            out, t, [int(c) for c in recv_counts], [int(c) for c in send_counts], group=self.group
        )
        row = int(np.prod(t.shape[1:])) * t.element_size()
        self.bytes_sent[kind] += float((send_counts.sum() - send_counts[self.rank]) * row)
        return out.to(device), recv_counts

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def all_ok(self, ok: bool) -> bool:
        """True when ``ok`` holds on every rank (so that all ranks raise together, none waits forever)."""
        flag = torch.tensor([0.0 if ok else 1.0])
        self.all_reduce_(flag, "control")
        return float(flag) == 0.0
