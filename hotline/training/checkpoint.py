"""Checkpoints: model, dense optimizer, every embedding row and its optimizer state, step and RNG state.

A checkpoint is one ``torch.save`` file plus a ``.sha256`` digest written after it. Both are written atomically
(temporary file, fsync, rename, fsync of the directory), and a checkpoint counts as complete only when its
digest exists and matches: a run killed at any moment, even in the middle of a write, leaves the previous
complete checkpoint in place and resumes from it. Loading uses ``torch.load(weights_only=True)`` (no pickled
code runs), checks everything against the trainer first, and only then changes the trainer: a corrupt or
mismatched checkpoint is refused with a clear error and never half-loaded.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_FORMAT = "hotline-checkpoint/1"
_NAME = re.compile(r"^step-(\d{9})\.pt$")


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or made for another model or dataset."""


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        # A full disk or a file-size limit: name the file (the bare error does not). torch.save's zip writer
        # reports a failed write as a RuntimeError whose context is the OSError.
        cause = e if isinstance(e, OSError) else e.__context__
        if not isinstance(cause, OSError):
            raise
        raise OSError(cause.errno, f"{cause.strerror}: cannot write {path} (no partial file was left)") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _payload(trainer) -> dict:
    placement = getattr(trainer.mode, "placement", None)
    return {
        "format": CHECKPOINT_FORMAT,
        "step": trainer.step_count,
        "mode": trainer.config.mode,
        "table_sizes": list(trainer.dataset.table_sizes),
        "dataset_fingerprint": trainer.dataset.fingerprint,
        "placement_fingerprint": placement.dataset_fingerprint if placement is not None else "",
        "model": trainer.model.state_dict(),
        "dense_optimizer": trainer.dense_opt.state_dict(),
        "tables": [torch.from_numpy(np.ascontiguousarray(t)) for t in trainer.mode.export_tables()],
        "states": [torch.from_numpy(np.ascontiguousarray(s)) for s in trainer.mode.export_state()],
        "torch_rng": torch.get_rng_state(),
    }


def save_checkpoint(trainer, path: str | os.PathLike) -> Path:
    """Writes ``trainer``'s full state to ``path`` and its digest to ``path.sha256``, each atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = _payload(trainer)
    _write_atomic(path, lambda f: torch.save(payload, f))
    digest = _sha256(path)
    _write_atomic(
        path.with_name(path.name + ".sha256"), lambda f: f.write(f"{digest}  {path.name}\n".encode())
    )
    return path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Loads and verifies a checkpoint file (digest, safe unpickling, format); does not touch any trainer."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    digest_file = path.with_name(path.name + ".sha256")
    if digest_file.is_file():
        expected = digest_file.read_text().split()[0] if digest_file.read_text().strip() else ""
        if _sha256(path) != expected:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: its sha256 does not match {digest_file.name} "
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


def _check_compatible(trainer, payload: dict, path: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if list(payload["table_sizes"]) != list(trainer.dataset.table_sizes):
        raise CheckpointError(
            f"{path} was made for {len(payload['table_sizes'])} tables of sizes {payload['table_sizes'][:4]}..., "
            f"this dataset has {trainer.dataset.table_sizes[:4]}...: a checkpoint only loads into the same model"
        )
    if payload["dataset_fingerprint"] != trainer.dataset.fingerprint:
        raise CheckpointError(
            f"{path} was made on dataset {payload['dataset_fingerprint']}, this one is {trainer.dataset.fingerprint}"
        )
    own = trainer.model.state_dict()
    theirs = payload["model"]
    if own.keys() != theirs.keys() or any(own[k].shape != theirs[k].shape for k in own):
        raise CheckpointError(f"{path} does not match this model's architecture (--arch-* flags)")
    dim = trainer.config.embedding_dim
    tables = [np.ascontiguousarray(t.numpy()) for t in payload["tables"]]
    states = [np.ascontiguousarray(s.numpy()) for s in payload["states"]]
    for t, (w, s, n) in enumerate(zip(tables, states, trainer.dataset.table_sizes)):
        if w.shape != (n, dim) or w.dtype != np.float32:
            raise CheckpointError(f"{path}: table {t} has shape {w.shape}, expected ({n}, {dim}) float32")
        want = n if trainer.sparse_opt.state_floats_per_row else 0
        if s.shape != (want,):
            raise CheckpointError(
                f"{path}: optimizer state of table {t} has shape {s.shape}, expected ({want},) "
                f"for --optimizer {trainer.config.optimizer}"
            )
    return tables, states


def load_checkpoint(trainer, path: str | os.PathLike) -> int:
    """Restores ``trainer`` from ``path`` after verifying everything; returns the step it resumes at."""
    path = Path(path)
    payload = read_checkpoint(path)
    tables, states = _check_compatible(trainer, payload, path)
    try:
        trainer.dense_opt.load_state_dict(payload["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: the dense optimizer state does not match --optimizer: {e}") from e
    trainer.model.load_state_dict(payload["model"])
    trainer.mode.load_tables(tables, states)
    torch.set_rng_state(payload["torch_rng"])
    trainer.step_count = int(payload["step"])
    return trainer.step_count


class CheckpointManager:
    """Periodic checkpoints in a directory: ``step-000000123.pt`` plus digest; keeps the newest ``keep``."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2):
        self.directory = Path(directory)
        self.keep = max(1, keep)

    def complete(self) -> list[Path]:
        """Complete checkpoints (data and digest present), oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m and p.with_name(p.name + ".sha256").is_file():
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, trainer) -> Path:
        path = save_checkpoint(trainer, self.directory / f"step-{trainer.step_count:09d}.pt")
        for old in self.complete()[: -self.keep]:
            old.with_name(old.name + ".sha256").unlink(missing_ok=True)
            old.unlink(missing_ok=True)
        for tmp in self.directory.glob("*.tmp"):  # left by a run killed mid-write
            tmp.unlink(missing_ok=True)
        return path

    def resume(self, trainer) -> int | None:
        """Loads the newest complete checkpoint into ``trainer``; None when there is none."""
        latest = self.latest()
        return None if latest is None else load_checkpoint(trainer, latest)
