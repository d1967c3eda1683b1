"""Checkpoints: model, dense optimizer, every embedding row and its optimizer state, in one atomic file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_FORMAT = "hotline-checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or made for another model."""


def save_checkpoint(trainer, path: str | os.PathLike) -> Path:
    """Writes ``trainer``'s full state to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "step": trainer.step_count,
        "table_sizes": list(trainer.dataset.table_sizes),
        "dataset_fingerprint": trainer.dataset.fingerprint,
        "model": trainer.model.state_dict(),
        "dense_optimizer": trainer.dense_opt.state_dict(),
        "tables": [torch.from_numpy(t) for t in trainer.mode.export_tables()],
        "states": [torch.from_numpy(s) for s in trainer.mode.export_state()],
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(trainer, path: str | os.PathLike) -> int:
    """Restores ``trainer`` from ``path`` (``weights_only`` loading: no pickled code runs). Returns the step."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or crafted files
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded (truncated, corrupt or unsafe): {e}"
        ) from e
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a Hotline checkpoint (format {CHECKPOINT_FORMAT})")
    if list(payload["table_sizes"]) != list(trainer.dataset.table_sizes):
        raise CheckpointError(
            f"{path} was made for tables {payload['table_sizes'][:4]}..., this dataset has "
            f"{trainer.dataset.table_sizes[:4]}...: a checkpoint only loads into the same model"
        )
    try:
        trainer.model.load_state_dict(payload["model"])
        trainer.dense_opt.load_state_dict(payload["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path} does not match this model's architecture: {e}") from e
    tables = [np.ascontiguousarray(t.numpy()) for t in payload["tables"]]
    states = [np.ascontiguousarray(s.numpy()) for s in payload["states"]]
    trainer.mode.load_tables(tables, states)
    trainer.step_count = int(payload["step"])
    return trainer.step_count
