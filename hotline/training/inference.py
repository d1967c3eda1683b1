"""A trained model back from its checkpoint: scoring a split (``hotline evaluate`` / ``predict``) and writing
per-sample predictions.

A checkpoint holds the state, and (since the model config was added to it) the architecture it was trained
with; an older checkpoint needs the ``--arch-*`` flags it was trained with. Only one-process checkpoints
load here (every table in original row order); a run of N ranks keeps its rows in N files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hotline import _io
from hotline.training.checkpoint import CheckpointError, read_checkpoint

ARCH_DEFAULTS = {
    "embedding_dim": 16,
    "bottom_mlp": [13, 512, 256, 64, 16],
    "top_mlp": [512, 256, 1],
    "interaction": "dot",
    "dcn_num_layers": 3,
    "dcn_low_rank_dim": 512,
}
PREDICTION_FORMATS = (".parquet", ".npy")


@dataclass(frozen=True)
class ModelSpec:
    """What it takes to rebuild a checkpoint's model: the architecture and the sparse optimizer."""

    embedding_dim: int
    bottom_mlp: list[int]
    top_mlp: list[int]
    interaction: str
    optimizer: str
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512

    def arch(self) -> dict:
        """The architecture as keyword arguments of ``DLRMConfig`` / ``TrainConfig``."""
        return {
            "embedding_dim": self.embedding_dim,
            "bottom_mlp": list(self.bottom_mlp),
            "top_mlp": list(self.top_mlp),
            "interaction": self.interaction,
            "dcn_num_layers": self.dcn_num_layers,
            "dcn_low_rank_dim": self.dcn_low_rank_dim,
        }


def checkpoint_payload(path: str | os.PathLike) -> dict:
    """The verified payload of a one-process checkpoint (CheckpointError for one of N ranks' files)."""
    path = Path(path)
    if not path.is_file():
        stem = path.name[:-3] if path.name.endswith(".pt") else path.name
        ranks = sorted(path.parent.glob(f"{stem}.rank000-of-*.pt")) if path.parent.is_dir() else []
        if ranks:
            raise CheckpointError(
                f"checkpoint {path} was written by several ranks ({ranks[0].name}, ...): evaluate, predict and "
                f"export read one-process checkpoints (train without --nproc, or --save from one process)"
            )
    payload = read_checkpoint(path)
    if payload.get("world_size", 1) != 1 or ("tables" not in payload and "rows" not in payload):
        raise CheckpointError(
            f"checkpoint {path} is one rank's file of a run of {payload.get('world_size')} ranks: "
            f"evaluate, predict and export read one-process checkpoints"
        )
    return payload


def model_spec(payload: dict, path: str | os.PathLike, flags: dict | None = None) -> ModelSpec:
    """The checkpoint's architecture; ``flags`` (name -> value, None: not given) must agree with a checkpoint
    that records one, and fill in for one that does not (else the ``hotline train`` defaults)."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    stored = payload.get("model_config")
    if stored is not None:
        for k, v in flags.items():
            if k in stored and stored[k] != v:
                raise CheckpointError(
                    f"checkpoint {path} was trained with {k} = {stored[k]}, the flags ask for {v}: "
                    f"leave the --arch-* flags out to use the checkpoint's"
                )
        arch = {k: stored.get(k, v) for k, v in ARCH_DEFAULTS.items()}  # dcn_*: recorded for dcn only
        optimizer = stored.get("optimizer", "sgd")
    else:
        arch = {**ARCH_DEFAULTS, **{k: v for k, v in flags.items() if k in ARCH_DEFAULTS}}
        optimizer = "rowwise-adagrad" if any(s.numel() for s in payload.get("states", [])) else "sgd"
    return ModelSpec(
        embedding_dim=int(arch["embedding_dim"]),
        bottom_mlp=[int(x) for x in arch["bottom_mlp"]],
        top_mlp=[int(x) for x in arch["top_mlp"]],
        interaction=str(arch["interaction"]),
        optimizer=optimizer,
        dcn_num_layers=int(arch["dcn_num_layers"]),
        dcn_low_rank_dim=int(arch["dcn_low_rank_dim"]),
    )


def trainer_from_checkpoint(
    dataset,
    checkpoint: str | os.PathLike,
    flags: dict | None = None,
    device: str = "auto",
    eval_max_samples: int = 0,
    progress: bool = True,
    scratch_dir: str | os.PathLike | None = None,
):
    """A Trainer on ``dataset`` holding checkpoint ``checkpoint``'s model and rows; a checkpoint made for
    another dataset or model is refused (CheckpointError) before anything loads.

    A checkpoint of a disk-store run (its rows in a rows file, :mod:`hotline.training.checkpoint_rows`) loads
    into ``--mode hybrid`` on the disk store, in a scratch folder in ``scratch_dir`` (default: beside the
    checkpoint; it needs free space for the rows file's records): the rows are copied
    there in chunks and read from there as the split's lookups need them, so the host memory is the disk
    store's (a few bytes a row), never the tables. The folder's files are unlinked once open (the space is
    freed when the trainer closes; a killed process's folder is removed by the next Hotline run there). Any
    other checkpoint loads into ``--mode device``."""
    import shutil

    from hotline.training.checkpoint import load_checkpoint
    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    payload = checkpoint_payload(checkpoint)
    spec = model_spec(payload, checkpoint, flags)
    scratch = None
    store = {}
    if "rows" in payload:
        scratch = _io.scratch_folder(scratch_dir or Path(checkpoint).parent, "hotline-scoring-rows")
        store = {"mode": "hybrid", "cold_store": "disk", "cold_dir": str(scratch)}
    config = TrainConfig(
        **{"mode": "device", **store},
        **spec.arch(),
        optimizer=spec.optimizer,
        device=device,
        eval_max_samples=eval_max_samples,
        progress=progress,
    )
    try:
        trainer = Trainer(config, dataset)
        try:
            load_checkpoint(trainer, checkpoint)
        except BaseException:
            trainer.close()
            raise
    finally:
        if scratch is not None:  # open: the store reads its file through its descriptors
            shutil.rmtree(scratch, ignore_errors=True)
    return trainer


def write_predictions(
    path: str | os.PathLike, probabilities: np.ndarray, labels: np.ndarray, force: bool = False
) -> Path:
    """Per-sample ``row`` (index in the split), ``probability`` and ``label`` to ``path``, atomically:
    Parquet (``.parquet``) or a structured numpy array (``.npy``, loads with ``allow_pickle=False``). An
    existing file is replaced only with ``force`` (:func:`hotline.outputs.guard`)."""
    from hotline.outputs import guard

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in PREDICTION_FORMATS:
        raise ValueError(
            f"--out {path}: expected a .parquet or .npy file name, got {suffix or 'no suffix'!r}"
        )
    path = guard("write_predictions path", path, force=force)
    probabilities = np.asarray(probabilities, np.float32)
    labels = np.asarray(labels, np.float32)
    rows = np.arange(len(probabilities), dtype=np.int64)
    if suffix == ".npy":
        table = np.empty(len(rows), dtype=[("row", "<i8"), ("probability", "<f4"), ("label", "<f4")])
        table["row"], table["probability"], table["label"] = rows, probabilities, labels
        return _io.atomic_write(path, lambda f: np.save(f, table, allow_pickle=False))
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"row": rows, "probability": probabilities, "label": labels})
    return _io.atomic_write(path, lambda f: pq.write_table(table, f))
