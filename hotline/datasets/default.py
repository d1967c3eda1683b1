"""The built-in default dataset of ``hotline train``: synthetic, generated once into a cache and reused."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import CHUNK_ROWS, DEFAULT_ZIPF, GENERATOR_VERSION, generate

# The built-in default dataset of ``hotline train``: 26 tables with the Kaggle sizes capped at 50,000 rows
# (447,398 embedding rows in all), 600,000 rows (514,286 train, 42,857 each val and test), made in a few
# seconds. Planted val AUC 0.835; the default training run (1 epoch, SGD) reaches val AUC 0.77 on it.
DEFAULT_DATASET: dict = {
    "rows": 600_000,
    "seed": 0,
    "max_rows_per_table": 50_000,
    "zipf": DEFAULT_ZIPF,
    "pooling_factor": 1,
}


def cache_root() -> Path:
    """Hotline's cache directory: ``$HOTLINE_CACHE``, else ``~/.cache/hotline`` (the built-in dataset, the
    host's calibration for ``--mode auto``); nothing in it is a user's file."""
    return Path(os.environ.get("HOTLINE_CACHE") or Path.home() / ".cache" / "hotline").expanduser()


def default_dataset(cache_dir: str | os.PathLike | None = None, progress: bool = False) -> Path:
    """The built-in default dataset (:data:`DEFAULT_DATASET`), generated once into the cache and reused.

    The cache directory is ``cache_dir``, else ``$HOTLINE_CACHE``, else ``~/.cache/hotline``; the dataset
    lives in ``default-<hash of the parameters and generator version>`` and is regenerated when absent.
    """
    base = Path(cache_dir) if cache_dir else cache_root()
    key = json.dumps({**DEFAULT_DATASET, "generator_version": GENERATOR_VERSION, "chunk_rows": CHUNK_ROWS},
                     sort_keys=True)  # fmt: skip
    path = base.expanduser() / f"default-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if (path / "meta.json").is_file():
        try:
            Dataset(path)
            return path
        except ValueError:
            pass  # damaged: make it again
    return generate(path, progress=progress, overwrite=True, **DEFAULT_DATASET)
