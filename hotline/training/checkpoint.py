"""Checkpoints of one rank or N: model, dense optimizer, every embedding row and its state, step, RNG.

A checkpoint of a one-process run is one ``torch.save`` file (``step-000000123.pt``) holding every table in
original row order, so it loads into any mode. A run of N ranks writes one file per rank
(``step-000000123.rank000-of-002.pt``): rank 0's holds the dense model, its optimizer and the hot tier,
every rank's holds the rows it keeps; it resumes on the same N only. Each file has a ``.sha256`` digest
written after it, both atomically through ``hotline._io``, and a checkpoint counts as complete only when
every rank's file and digest exist: a run killed at any moment, even mid-write, leaves the previous complete
checkpoint in place and resumes from it. Loading uses ``torch.load(weights_only=True)`` (no pickled code
runs), checks everything against the trainer first, and only then changes the trainer: a corrupt or
mismatched checkpoint is refused with a clear error and never half-loaded (on N ranks: on none of them).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from hotline import _io
from hotline.distributed.comm import Comm

CHECKPOINT_FORMAT = "hotline-checkpoint/1"
_STEP_NAME = re.compile(r"^step-(\d{9})(?:\.rank(\d{3})-of-(\d{3}))?\.pt$")


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or made for another model, dataset or number of ranks."""


def rank_file(base: str | os.PathLike, rank: int, world_size: int) -> Path:
    """The file of ``rank`` in the checkpoint ``base`` of ``world_size`` ranks (``base`` itself for one rank)."""
    base = Path(base)
    if world_size == 1:
        return base
    stem = base.name[:-3] if base.name.endswith(".pt") else base.name
    return base.with_name(f"{stem}.rank{rank:03d}-of-{world_size:03d}.pt")


def _payload(trainer) -> dict:
    comm: Comm = trainer.comm
    placement = getattr(trainer.mode, "placement", None)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "step": trainer.step_count,
        "mode": trainer.config.mode,
        "world_size": comm.world_size,
        "rank": comm.rank,
        "table_sizes": list(trainer.dataset.table_sizes),
        "dataset_fingerprint": trainer.dataset.fingerprint,
        "num_hot": int(placement.num_hot) if placement is not None else 0,
        # The architecture, so that evaluate / predict / export need no --arch-* flags (load ignores it).
        "model_config": {
            "embedding_dim": trainer.config.embedding_dim,
            "bottom_mlp": list(trainer.config.bottom_mlp),
            "top_mlp": list(trainer.config.top_mlp),
            "interaction": trainer.config.interaction,
            "optimizer": trainer.config.optimizer,
        },
    }
    counts = getattr(getattr(trainer.mode, "dispatcher", None), "counts", None)
    if counts is not None:  # re-placement: the placement in force and the counts it will choose from
        payload["hot_rows"] = torch.from_numpy(trainer.mode.hot_rows.copy())
        payload["online_counts"] = {k: torch.from_numpy(np.asarray(v)) for k, v in counts.state().items()}
    if comm.world_size == 1:
        payload["tables"] = [torch.from_numpy(np.ascontiguousarray(t)) for t in trainer.mode.export_tables()]
        payload["states"] = [torch.from_numpy(np.ascontiguousarray(s)) for s in trainer.mode.export_state()]
    else:
        payload["tiers"] = trainer.mode.shard_state()
    if comm.rank == 0:
        payload.update(
            model=trainer.model.state_dict(),
            dense_optimizer=trainer.dense_opt.state_dict(),
            torch_rng=torch.get_rng_state(),
        )
    return payload


def save_checkpoint(trainer, base: str | os.PathLike) -> Path:
    """Writes this rank's file of checkpoint ``base`` and its digest, each atomically (a collective on N
    ranks: it ends when every rank's file is written); returns this rank's file."""
    path = rank_file(base, trainer.comm.rank, trainer.comm.world_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = _payload(trainer)
    _io.write_with_digest(path, lambda f: torch.save(payload, f))
    trainer.comm.barrier()
    return path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Loads and verifies one checkpoint file (digest, safe unpickling, format); touches no trainer."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    digest = _io.digest_path(path)
    if digest.is_file() and _io.sha256(path) != _io.read_digest(path):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its sha256 does not match {digest.name} "
            f"(delete both files to resume from the previous checkpoint)"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or crafted files
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded (truncated, corrupt or unsafe): {e}"
        ) from e
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a Hotline checkpoint (format {CHECKPOINT_FORMAT})")
    return payload


def _check(trainer, payload: dict, path: Path) -> None:
    """Raises CheckpointError unless ``payload`` fits ``trainer`` (dataset, model, ranks, tables)."""
    N = trainer.comm.world_size
    if payload.get("world_size", 1) != N:
        n = payload.get("world_size", 1)
        raise CheckpointError(
            f"checkpoint {path} was written by {n} ranks, this run has {N}: resume it with --nproc {n} "
            f"(a checkpoint's cold shards only load on the same number of ranks)"
        )
    if list(payload["table_sizes"]) != list(trainer.dataset.table_sizes):
        raise CheckpointError(
            f"{path} was made for {len(payload['table_sizes'])} tables of sizes {payload['table_sizes'][:4]}..., "
            f"this dataset has {trainer.dataset.table_sizes[:4]}...: a checkpoint only loads into the same model"
        )
    if payload["dataset_fingerprint"] != trainer.dataset.fingerprint:
        raise CheckpointError(
            f"{path} was made on dataset {payload['dataset_fingerprint']}, this one is {trainer.dataset.fingerprint}"
        )
    if "model" in payload:
        own, theirs = trainer.model.state_dict(), payload["model"]
        if own.keys() != theirs.keys() or any(own[k].shape != theirs[k].shape for k in own):
            raise CheckpointError(f"{path} does not match this model's architecture (--arch-* flags)")
    if N > 1:
        if payload["mode"] != trainer.config.mode:
            raise CheckpointError(
                f"{path} was written in --mode {payload['mode']}, this run is {trainer.config.mode}"
            )
        return
    dim = trainer.config.embedding_dim
    for t, (w, s, n) in enumerate(zip(payload["tables"], payload["states"], trainer.dataset.table_sizes)):
        if tuple(w.shape) != (n, dim) or w.dtype != torch.float32:
            raise CheckpointError(
                f"{path}: table {t} has shape {tuple(w.shape)}, expected ({n}, {dim}) float32"
            )
        want = n if trainer.sparse_opt.state_floats_per_row else 0
        if tuple(s.shape) != (want,):
            raise CheckpointError(
                f"{path}: optimizer state of table {t} has shape {tuple(s.shape)}, expected ({want},) "
                f"for --optimizer {trainer.config.optimizer}"
            )


def _read_for(trainer, base: Path) -> tuple[dict, dict]:
    """This rank's payload and rank 0's, checked against ``trainer``."""
    N, r = trainer.comm.world_size, trainer.comm.rank
    own_path = rank_file(base, r, N)
    if not own_path.is_file() and N > 1:
        raise CheckpointError(f"checkpoint {base}: no file for rank {r} of {N} ({own_path.name})")
    own = read_checkpoint(own_path)
    rank0 = own if r == 0 else read_checkpoint(rank_file(base, 0, N))
    for path, p in ((own_path, own), (rank_file(base, 0, N), rank0)):
        _check(trainer, p, path)
        if p["step"] != own["step"]:
            raise CheckpointError(f"checkpoint {base}: the ranks' files are of different steps")
    return own, rank0


def load_checkpoint(trainer, base: str | os.PathLike) -> int:
    """Restores ``trainer`` from checkpoint ``base`` after verifying everything (a collective on N ranks:
    all load, or none); returns the step it resumes at."""
    base = Path(base)
    comm: Comm = trainer.comm
    error = None
    try:
        own, rank0 = _read_for(trainer, base)
    except CheckpointError as e:
        error = e
    if not comm.all_ok(error is None):
        raise error or CheckpointError(
            f"checkpoint {base}: another rank could not load its file (see its error)"
        )
    try:
        trainer.dense_opt.load_state_dict(rank0["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{base}: the dense optimizer state does not match --optimizer: {e}") from e
    trainer.model.load_state_dict(rank0["model"])
    counts = getattr(getattr(trainer.mode, "dispatcher", None), "counts", None)
    if "hot_rows" in own and counts is not None:  # the placement in force when it was written, first
        trainer.mode.replace(own["hot_rows"].numpy())
        counts.load({k: v.numpy() for k, v in own["online_counts"].items()})
    if comm.world_size == 1:
        tables = [np.ascontiguousarray(t.numpy()) for t in own["tables"]]
        states = [np.ascontiguousarray(s.numpy()) for s in own["states"]]
        trainer.mode.load_tables(tables, states)
    else:
        try:
            trainer.mode.load_shard_state(own["tiers"], rank0["tiers"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"checkpoint {base}: {e}") from e
    torch.set_rng_state(rank0["torch_rng"])
    trainer.step_count = int(own["step"])
    return trainer.step_count


class CheckpointManager:
    """Periodic checkpoints in a directory shared by the ranks; keeps the newest ``keep`` complete ones.

    A step counts when the files and digests of all N ranks are there."""

    def __init__(self, directory: str | os.PathLike, comm: Comm | None = None, keep: int = 2):
        self.directory = Path(directory)
        self.comm = comm if comm is not None else Comm()
        self.keep = max(1, keep)

    def _steps(self) -> dict[int, dict[int, set[int]]]:
        """world size -> step -> ranks whose file and digest exist."""
        found: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
        if self.directory.is_dir():
            for p in self.directory.iterdir():
                m = _STEP_NAME.match(p.name)
                if m and _io.digest_path(p).is_file():
                    n = int(m.group(3) or 1)
                    found[n][int(m.group(1))].add(int(m.group(2) or 0))
        return found

    def _base(self, step: int) -> Path:
        """The checkpoint of ``step``: the file itself for one rank, the common stem of the rank files else."""
        return self.directory / (f"step-{step:09d}.pt" if self.comm.world_size == 1 else f"step-{step:09d}")

    def complete(self) -> list[Path]:
        """The checkpoints complete for this run's number of ranks, oldest first (one rank: the files)."""
        N = self.comm.world_size
        steps = self._steps().get(N, {})
        done = [s for s in sorted(steps) if len(steps[s]) == N]
        return [self._base(s) for s in done]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, trainer) -> Path:
        base = self._base(trainer.step_count)
        save_checkpoint(trainer, base)
        r, N = self.comm.rank, self.comm.world_size
        for old in self.complete()[: -self.keep]:  # each rank removes its own old files
            f = rank_file(old, r, N)
            _io.digest_path(f).unlink(missing_ok=True)
            f.unlink(missing_ok=True)
        return base

    def resume(self, trainer) -> int | None:
        """Loads the newest checkpoint complete on all ranks; None when there is none (for any N)."""
        latest = self.latest()
        step = -1 if latest is None else int(latest.name.split("-")[1].split(".")[0])
        agreed = self.comm.all_gather_varlen(torch.tensor([step], dtype=torch.int64), "control")
        if len({int(a) for a in agreed}) > 1:
            raise CheckpointError(
                f"ranks see different checkpoints in {self.directory}: it must be one directory shared by all ranks"
            )
        if latest is None:
            others = sorted(n for n in self._steps() if n != self.comm.world_size)
            if others:
                raise CheckpointError(
                    f"{self.directory} holds checkpoints written by {others[0]} ranks, this run has "
                    f"{self.comm.world_size}: resume with --nproc {others[0]}"
                )
            return None
        return load_checkpoint(trainer, latest)
