"""Estimate, the cost model's first stage: what a step moves, from a profile's held-out figures
(:meth:`Stats.from_profile`), and how its cold rows meet the disk store (:class:`DiskTier`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    """Held-out figures of a placement (what a step moves)."""

    hot_lookup_share: float
    """Share of lookups that hit hot rows (held-out access coverage)."""
    popular_sample_share: float
    """Share of samples whose every lookup is hot."""
    cold_rows_per_batch: float
    """Unique cold rows per mini-batch (the working set)."""
    unique_rows_per_batch: float
    """Unique rows per mini-batch with nothing hot (hybrid's working set)."""
    stale_rows_per_batch: float = 0.0
    """Of the cold rows, those a look-ahead step finds held by an earlier step still in flight (held-out,
    :data:`hotline.profiling.heldout.STALE_WINDOW`; 0 where not measured): the producer skips them and the main
    thread reads them again before the step computes."""

    @classmethod
    def from_profile(cls, prof, budget, batch_size: int | None = None) -> Stats:
        """The held-out figures of ``prof`` at ``budget`` (in-sample ones only when it has no held-out samples)."""
        k = prof.hot_rows_for(budget)
        if prof.heldout is not None and (batch_size is None or batch_size == prof.heldout.batch_size):
            h = prof.heldout.figures(k)
            return cls(
                float(h["access_coverage"]),
                float(h["popular_sample_share"]),
                float(h["unique_cold_rows_per_batch"]),
                float(prof.heldout.figures(0)["unique_cold_rows_per_batch"]),
                prof.heldout.stale_rows_per_batch(k),
            )
        c = prof.curve([k * prof.bytes_per_row], batch_size=batch_size).iloc[0]
        return cls(
            float(c.access_coverage),
            float(c.popular_sample_share),
            float(c.expected_cold_rows_per_batch),
            float(c.expected_unique_rows_per_batch),
        )


@dataclass
class DiskTier:
    """The disk cold store of a run (``--cold-store disk``): how a step's cold rows meet the disk. Its rates
    come from the hardware description's ``disk`` section (``hotline calibrate --disk DIR``)."""

    pages_per_cold_row: float = 1.0
    """4 KiB pages read per cold row not in the DRAM tier (1: each row its own page; the popularity order
    lets rows of a step share pages, below 1)."""
    cached_share: float = 0.0
    """Share of the cold rows served by the DRAM tier (``--cold-cache``)."""
    reread_share: float = 0.0
    """Pages read beyond the fetch's, per page of the step's cold rows, under look-ahead: the refresh reads the
    pages of stale rows again before their step, and a write-back reads the pages it has not read and those
    another step wrote since (read-modify-write) (0 before a run measured it; sequential steps read none
    again)."""
    skipped_share: float = 0.0
    """Share of the step's pages the fetch does not read, under look-ahead: pages that only stale rows need
    (the refresh or the write-back reads them; 0 before a run measured it)."""
    calls_per_page: float = 1.0
    """I/O requests (system calls) per page: the store reads a run of neighbouring pages with one request, and a
    request costs about the same for one page or a few (1: no two pages of a step neighbours, what the
    calibration's uniform draws make; a run measures it: its reads over its pages)."""
    held_rows: int = 0
    """Records the write buffer holds (``--cold-write-buffer``, :func:`hotline.kernels.held_rows.sized`): a step's
    written rows are put there and swept to the file in file order when it is full; 0: written in place."""
    file_rows: int = 0
    """Records in the file (a rank's rows): how far apart the held rows lie, so how much of the file a sweep
    reads and writes (:func:`~hotline.costmodel.phases.sweep_spans`)."""

    def __post_init__(self) -> None:
        if not self.pages_per_cold_row >= 0 or not 0 <= self.cached_share <= 1 or not self.reread_share >= 0:
            raise ValueError("pages_per_cold_row and reread_share must be >= 0 and cached_share in [0, 1]")
        if not 0 <= self.skipped_share <= 1:
            raise ValueError(f"skipped_share must be in [0, 1], got {self.skipped_share}")
        if not 0 <= self.calls_per_page <= 1:
            raise ValueError(f"calls_per_page must be in [0, 1] (one request reads one page or more), "
                             f"got {self.calls_per_page}")  # fmt: skip
        if self.held_rows < 0 or self.file_rows < 0:
            raise ValueError(f"held_rows and file_rows must be >= 0, got {self.held_rows}, {self.file_rows}")
