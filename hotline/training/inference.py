"""A trained model back from its checkpoint: scoring a split (``hotline evaluate`` / ``predict``) and writing
per-sample predictions.

A checkpoint holds the state, and (since the model config was added to it) the architecture it was trained
with; an older checkpoint needs the ``--arch-*`` flags it was trained with. A checkpoint of N ranks is named by
any rank's file or by their stem (``--save``'s path) and scores from all its rank files (:func:`_ranks_trainer`).
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
    other checkpoint loads into ``--mode device``. A checkpoint of N ranks (``checkpoint``: any rank's file, or
    their stem) loads the same way, from all its rank files: :func:`_ranks_trainer`."""
    import shutil

    from hotline.training import export_sharded
    from hotline.training.checkpoint import load_checkpoint
    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    files = export_sharded.rank_files(checkpoint, CheckpointError)  # a missing rank's file: named here
    if len(files) > 1:
        return _ranks_trainer(dataset, files, flags, device, eval_max_samples, progress, scratch_dir)
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


def _ranks_trainer(dataset, files: list[Path], flags, device, eval_max_samples, progress, scratch_dir):
    """:func:`trainer_from_checkpoint` of an N-rank checkpoint (its rank ``files``, in rank order): every rank's
    file, digest and rows file header checked first (:func:`~hotline.training.export_sharded.read_ranks`), then its
    rows read in row order, chunk by chunk, with the hot tier's current values
    (:func:`~hotline.training.export_sharded.rank_source`). A disk-store run's rows files are read once, in step
    (:class:`~hotline.training.export_rows.StreamedRows`: rows early for their chunk held, beyond two chunks in
    the scratch folder; each rows file's sha256 checked on that pass, before anything is scored) and written into
    the disk store of ``--mode hybrid`` chunk by chunk: host memory a few chunks, as for one process. Other checkpoints load into ``--mode device`` whole, as one
    process's do. The weights load, not the rows' optimizer state (zero: scoring reads none); the dense model, its
    optimizer and the step are rank 0's."""
    import shutil

    from hotline.datasets.format import Dataset
    from hotline.table_layout import state_floats_per_row
    from hotline.training import export_sharded
    from hotline.training.checkpoint_rows import CHUNK_BYTES, check_rows
    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    payloads = export_sharded.read_ranks(files, CheckpointError)
    rank0, N = payloads[0], len(files)
    spec = model_spec(rank0, files[0], flags)
    dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    sizes = [int(n) for n in rank0["table_sizes"]]
    _check_dataset(files[0], rank0, dataset)
    total, D = sum(sizes), spec.embedding_dim
    disk = "rows" in rank0
    if disk:
        for f, p in zip(files, payloads):
            want = {"rows": len(range(int(p["rank"]), total, N)), "dim": D}
            check_rows(f, p["rows"], p["step"], want, CheckpointError, digest=False)
        hot = rank0["hot"] if isinstance(rank0.get("hot"), dict) else {}
        _check_hot(files[0], hot.get("rows"), hot.get("w"), D, total)
        scratch = _io.scratch_folder(scratch_dir or files[0].parent, "hotline-scoring-rows")
    else:
        tiers, scratch = rank0.get("tiers", {}), None
        if "cold_w" in tiers:
            _check_hot(files[0], rank0.get("hot_ids"), tiers.get("hot_w"), D, total)
    source = None
    try:
        source = export_sharded.rank_source(files, payloads, CHUNK_BYTES, CheckpointError)(
            scratch / ".rows-in-row-order" if disk else None
        )  # a disk-store run's: its orders read; each rows file's sha256 checked as the rows stream in
        if disk:
            record = 4 * (D + state_floats_per_row(spec.optimizer, D))
            _check_free_disk(scratch, getattr(source, "spill_bytes", 0) + total * record)
        store = (
            {"mode": "hybrid", "cold_store": "disk", "cold_dir": str(scratch)} if disk else {"mode": "device"}
        )
        config = TrainConfig(**store, **spec.arch(), optimizer=spec.optimizer, device=device,
                             eval_max_samples=eval_max_samples, progress=progress)  # fmt: skip
        trainer = Trainer(config, dataset)
        try:
            _load_ranks(trainer, files[0], rank0, source, sizes)
        except BaseException:
            trainer.close()
            raise
    finally:
        if source is not None:
            source.close()
        if scratch is not None:  # open: the store reads its file through its descriptors
            shutil.rmtree(scratch, ignore_errors=True)
    return trainer


def _check_dataset(path: Path, payload: dict, dataset) -> None:
    """CheckpointError unless ``payload`` (rank 0's) was made on ``dataset``: its tables and fingerprint."""
    if [int(n) for n in payload["table_sizes"]] != [int(n) for n in dataset.table_sizes]:
        raise CheckpointError(
            f"{path} was made for {len(payload['table_sizes'])} tables of sizes {payload['table_sizes'][:4]}..., "
            f"this dataset has {dataset.table_sizes[:4]}...: a checkpoint only loads into the same model"
        )
    if payload["dataset_fingerprint"] != dataset.fingerprint:
        raise CheckpointError(
            f"{path} was made on dataset {payload['dataset_fingerprint']}, this one is {dataset.fingerprint}"
        )


def _check_hot(path: Path, rows, w, dim: int, total: int) -> None:
    """CheckpointError unless ``rows`` (fused ids) and ``w`` are a hot tier of ``total`` rows of ``dim``."""
    import torch

    ok = isinstance(rows, torch.Tensor) and isinstance(w, torch.Tensor) and rows.dim() == 1
    ok = ok and tuple(w.shape) == (rows.shape[0], dim)
    if ok and rows.numel():
        ok = int(rows.min()) >= 0 and int(rows.max()) < total
    if not ok:
        raise CheckpointError(f"{path}: its hot rows do not fit this model (--arch-* flags)")


def _check_free_disk(folder: Path, need: int) -> None:
    """OSError, before anything is written, when ``folder``'s filesystem has less than ``need`` bytes free."""
    import shutil

    from hotline.units import format_size

    free = shutil.disk_usage(folder).free
    if free < need:
        raise OSError(
            f"scratch folder {folder.parent}: scoring this checkpoint needs {format_size(need)} of free disk (its "
            f"rows in row order and a disk store of them), its filesystem has {format_size(free)}: free some "
            f"space or give --scratch DIR on another disk"
        )


def _load_ranks(trainer, path: Path, rank0: dict, source, sizes: list[int]) -> None:
    """Puts rank 0's dense model and step, and ``source``'s rows (row order, chunk by chunk), into ``trainer``."""
    import torch

    from hotline.training.checkpoint_rows import disk_rows
    from hotline.training.export_sharded import finish, schedule, tables_of

    try:
        trainer.model.load_state_dict(rank0["model"])
        trainer.dense_opt.load_state_dict(rank0["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} does not match this model's architecture ({first})") from None
    host = disk_rows(trainer.mode)
    if host is None:  # --mode device: every table in memory, as a one-process checkpoint loads
        states = [np.zeros(trainer.sparse_opt.state_shape(n), np.float32) for n in sizes]
        trainer.mode.load_tables(tables_of(source, sizes), states)
    else:
        f = host.file
        for k in schedule(source):  # a rows file's chunks as they complete
            _, _, m, g = source.grid[k]
            rec = np.zeros((m, f.floats), np.float32)
            rec[:, : host.dim] = source.chunk(k)
            host._wrote_nonfinite |= not np.isfinite(rec).all()
            f.put_rows(np.arange(g, g + m), rec)  # row order: one sequential write where the file's is too
            if k % 4 == 3:
                f.drop_page_cache()  # written out, dropped: no memory-limit's worth of dirty pages
        finish(source)  # every rows file's sha256: a damaged one refused before anything is scored
        f.flush()
        f.drop_page_cache()
    if "torch_rng" in rank0:
        torch.set_rng_state(rank0["torch_rng"])
    trainer.step_count = int(rank0["step"])


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
