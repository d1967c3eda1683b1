"""Training: the run's config, the DLRM model, the Trainer (one rank or N), checkpoints and metrics.

``from hotline.training import Trainer, TrainConfig`` imports lazily (torch loads on first use)."""

from __future__ import annotations

import importlib

_LAZY = {
    "TrainConfig": "hotline.training.config",
    "Trainer": "hotline.training.trainer",
    "DLRM": "hotline.training.model",
    "DLRMConfig": "hotline.training.model",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotline.training' has no attribute {name!r}")


__all__ = sorted(_LAZY)
