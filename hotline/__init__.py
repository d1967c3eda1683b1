"""Hotline: train DLRM with popular embedding rows in device memory and the rest in host memory.

The package imports lazily: ``import hotline`` is cheap, and ``hotline.profile`` / ``hotline.Dataset`` pull
in numpy, numba or torch only when first used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Dataset": "hotline.datasets.format",
    "DatasetError": "hotline.datasets.format",
    "profile": "hotline.profiler",
    "Profile": "hotline.profiler",
    "Placement": "hotline.placement",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hotline' has no attribute {name!r}")


__all__ = sorted(_LAZY)
