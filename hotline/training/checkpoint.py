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

The rows of a run on the disk store are streamed into a file beside the checkpoint's
(:mod:`hotline.training.checkpoint_rows`): never the whole table in memory; after a full copy, only the rows
written since (:mod:`hotline.training.checkpoint_delta`). A directory of one run's
checkpoints, their rotation and resume: :mod:`hotline.training.checkpoint_dir`.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import torch

from hotline import _io
from hotline._paths import check_file
from hotline.distributed.comm import Comm
from hotline.table_layout import TableLayout
from hotline.tiers.written_rows import untrack
from hotline.training import checkpoint_delta, checkpoint_rows
from hotline.training.checkpoint_rows import disk_rows

CHECKPOINT_FORMAT = "hotline-checkpoint/1"
COMMIT_FORMAT = "hotline-checkpoint-commit/1"
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


def dcn_arch(cfg) -> dict:
    """The cross net's shape where the interaction is ``dcn`` (nothing otherwise, so that the records of dot
    and cat runs stay those of checkpoints written before DCN existed)."""
    if cfg.interaction != "dcn":
        return {}
    return {"dcn_num_layers": int(cfg.dcn_num_layers), "dcn_low_rank_dim": int(cfg.dcn_low_rank_dim)}


def run_fingerprint(trainer) -> dict:
    """What must be the same for a run to continue from a checkpoint (recorded in every checkpoint)."""
    cfg, N = trainer.config, trainer.comm.world_size
    placement = getattr(trainer.mode, "placement", None)
    hot = None
    if placement is not None and N > 1:  # one rank's checkpoint holds every row in row order: any placement
        hot = hashlib.sha256(np.ascontiguousarray(placement.fused_hot_ids(), np.int64).tobytes()).hexdigest()[
            :16
        ]
    return {
        "model": {
            "table_sizes": [int(n) for n in trainer.dataset.table_sizes],
            "embedding_dim": int(cfg.embedding_dim),
            "bottom_mlp": [int(n) for n in cfg.bottom_mlp],
            "top_mlp": [int(n) for n in cfg.top_mlp],
            "interaction": cfg.interaction,
            **dcn_arch(cfg),
        },
        "optimizer": cfg.optimizer,
        "dataset": trainer.dataset.content_fingerprint,  # every array it reads: a swapped file differs
        "mini_batch_size": int(cfg.mini_batch_size),
        "world_size": int(N),
        "placement": hot,
    }


# What a user changes to make each fingerprint field match (for the error message).
_RUN_FIELDS = {
    "model": "the --arch-* flags",
    "optimizer": "--optimizer",
    "dataset": "the dataset",
    "mini_batch_size": "--mini-batch-size",
    "world_size": "--nproc",
    "placement": "--placement / --hbm-budget",
}


def _check_run(trainer, payload: dict, path: Path) -> None:
    """Raises CheckpointError unless ``payload`` was written by a run with this trainer's fingerprint."""
    theirs = payload.get("run")
    if theirs is None:
        return  # written before fingerprints: the structural checks of _check still apply
    ours = run_fingerprint(trainer)
    diff = [k for k in _RUN_FIELDS if theirs.get(k) != ours[k]]
    if diff:
        what = "; ".join(
            f"{_RUN_FIELDS[k]}: checkpoint {theirs.get(k)!r}, this run {ours[k]!r}" for k in diff
        )
        raise CheckpointError(
            f"checkpoint {path} belongs to another run ({what}): resume with that run's flags, or choose "
            f"another --checkpoint-dir"
        )


def _hot_tier(mode) -> dict:
    """The hot rows (fused ids), their weights and state: what a disk-store checkpoint keeps in its file."""
    return {
        "rows": torch.from_numpy(np.asarray(mode.hot_rows, np.int64).copy()),
        "w": mode.hot_w.detach().cpu().clone(),
        "s": mode.hot_s.detach().cpu().clone(),
    }


def _payload(trainer, rows: dict | None = None) -> dict:
    """This rank's checkpoint; ``rows``: the record of its rows file (a disk-store run), whose rows it then
    does not hold."""
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
            **dcn_arch(trainer.config),
            "optimizer": trainer.config.optimizer,
        },
        "run": run_fingerprint(trainer),
    }
    counts = getattr(getattr(trainer.mode, "dispatcher", None), "counts", None)
    if counts is not None:  # re-placement: the placement in force and the counts it will choose from
        payload["hot_rows"] = torch.from_numpy(trainer.mode.hot_rows.copy())
        payload["online_counts"] = {k: torch.from_numpy(np.asarray(v)) for k, v in counts.state().items()}
    if rows is not None:  # the rows are in the rows file; the hot tier (rank 0's on N ranks) here
        payload["rows"] = rows
        if comm.world_size == 1 or comm.rank == 0:
            payload["hot"] = _hot_tier(trainer.mode)
    elif comm.world_size == 1:
        tables, states = trainer.mode.export_tables_and_state()
        payload["tables"] = [torch.from_numpy(np.ascontiguousarray(t)) for t in tables]
        payload["states"] = [torch.from_numpy(np.ascontiguousarray(s)) for s in states]
    else:
        payload["tiers"] = trainer.mode.shard_state()
        if comm.rank == 0 and "hot_w" in payload["tiers"]:  # which rows the hot tier holds: for an export
            payload["hot_ids"] = torch.from_numpy(np.asarray(trainer.mode.hot_rows, np.int64).copy())
    if comm.rank == 0:
        payload.update(
            model=trainer.model.state_dict(),
            dense_optimizer=trainer.dense_opt.state_dict(),
            torch_rng=torch.get_rng_state(),
        )
    return payload


def save_checkpoint(trainer, base: str | os.PathLike) -> Path:
    """Writes this rank's file of checkpoint ``base`` and its digest, each atomically (a collective on N
    ranks: it ends when every rank's file is written); returns this rank's file. A disk-store run's rows are
    streamed into the rows file first (:func:`~hotline.training.checkpoint_rows.write_rows`: a full copy, or a
    delta on the last full one, the same on every rank: :mod:`~hotline.training.checkpoint_delta`), which the
    checkpoint's file, written after it, records."""
    path = rank_file(base, trainer.comm.rank, trainer.comm.world_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    host = disk_rows(trainer.mode)
    rows = None
    if host is not None:
        on = checkpoint_delta.delta_base(host, checkpoint_rows.rows_path(path))
        if trainer.comm.world_size > 1 and not trainer.comm.all_ok(on is not None):
            on = None  # every rank a delta on the same step's base, or every rank a full copy
        rows = checkpoint_rows.write_rows(
            host, path, trainer.step_count, run_fingerprint(trainer), on, trainer.config.seed
        )
    payload = _payload(trainer, rows)
    try:
        _io.write_with_digest(path, lambda f: torch.save(payload, f))
    except BaseException:
        if rows is not None:  # this call's own: no rows file is left without its checkpoint
            checkpoint_rows.rows_path(path).unlink(missing_ok=True)
        raise
    if rows is not None:  # committed: a full copy is the next deltas' base
        checkpoint_delta.committed(host, checkpoint_rows.rows_path(path), rows, trainer.step_count)
    trainer.comm.barrier()
    return path


def safe_load(path: str | os.PathLike, what: str, error: type[Exception] = ValueError):
    """``torch.load(path, weights_only=True)``, and a file it cannot load as one line naming ``what``: cut
    short, not a torch file, or holding Python objects a safe load refuses (said as that: never the advice to
    load it unsafely that torch's message gives). Without its digest file the line says so too."""
    import warnings

    try:
        with (
            warnings.catch_warnings()
        ):  # "Detected pickle protocol 4": a foreign pickle, refused below anyway
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or crafted files
        text = str(e)
        if "WeightsUnpickler error:" in text:
            detail = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0].strip()
            why = (
                f"the safe loader refuses it ({detail}): unsafe (a crafted pickle) or not a file torch wrote; "
                f"it is never loaded unsafely"
            )
        else:
            first = text.strip().splitlines()[0].split(". ")[0][:200] if text.strip() else type(e).__name__
            why = f"truncated, corrupt or unsafe ({first})"
        digest = _io.digest_path(path)
        unchecked = "" if digest.is_file() else f"; it has no digest file {digest.name} to check it against"
        raise error(f"{what} cannot be loaded: {why}{unchecked}") from None


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Loads and verifies one checkpoint file (digest, safe unpickling, format); touches no trainer."""
    path = Path(path)
    check_file(path, "checkpoint", CheckpointError)  # missing, a directory, a FIFO, /dev/null: named
    digest = _io.digest_path(path)
    if digest.is_file() and _io.sha256(path) != _io.read_digest(path):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its sha256 does not match {digest.name} "
            f"(delete both files to resume from the previous checkpoint)"
        )
    payload = safe_load(path, f"checkpoint {path}", CheckpointError)
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
        if "rows" in payload and "model" in payload:
            _check_hot(trainer, payload.get("hot"), path)
        return
    dim = trainer.config.embedding_dim
    if "rows" in payload:  # a disk-store checkpoint: its rows file is checked by _check_rows
        _check_hot(trainer, payload.get("hot"), path)
        return
    for t, (w, s, n) in enumerate(zip(payload["tables"], payload["states"], trainer.dataset.table_sizes)):
        if tuple(w.shape) != (n, dim) or w.dtype != torch.float32:
            raise CheckpointError(
                f"{path}: table {t} has shape {tuple(w.shape)}, expected ({n}, {dim}) float32"
            )
        want = trainer.sparse_opt.state_shape(n)
        if tuple(s.shape) != want:
            raise CheckpointError(
                f"{path}: optimizer state of table {t} has shape {tuple(s.shape)}, expected {want} "
                f"for --optimizer {trainer.config.optimizer}"
            )


def _check_hot(trainer, hot, path: Path) -> None:
    """Raises CheckpointError unless ``hot`` (a disk-store checkpoint's hot tier) is rows of this model."""
    dim, total = trainer.config.embedding_dim, sum(int(n) for n in trainer.dataset.table_sizes)
    ok = isinstance(hot, dict) and {"rows", "w", "s"} <= hot.keys()
    if ok:
        rows, w, s = hot["rows"], hot["w"], hot["s"]
        H = int(rows.shape[0]) if rows.dim() == 1 else -1
        ok = (
            H >= 0
            and tuple(w.shape) == (H, dim)
            and tuple(s.shape) == tuple(trainer.sparse_opt.state_shape(H))
            and (H == 0 or (int(rows.min()) >= 0 and int(rows.max()) < total))
        )
    if not ok:
        raise CheckpointError(f"{path}: its hot rows do not fit this model (--arch-* flags, --optimizer)")


def _rows_record(trainer) -> dict:
    """What this rank's store needs of a disk-store checkpoint's rows file."""
    host = disk_rows(trainer.mode)
    if host is not None:
        return checkpoint_rows.record_of(host.num_rows, host.dim, host.S)
    N, r = trainer.comm.world_size, trainer.comm.rank
    total = sum(int(n) for n in trainer.dataset.table_sizes)
    return checkpoint_rows.record_of(
        len(range(r, total, N)), trainer.config.embedding_dim, trainer.sparse_opt.state_floats_per_row
    )


def _read_for(trainer, base: Path, same_run: bool = False, step: int | None = None) -> tuple[dict, dict]:
    """This rank's payload and rank 0's, checked against ``trainer`` (and its run fingerprint if
    ``same_run``, the step its name says if ``step``)."""
    N, r = trainer.comm.world_size, trainer.comm.rank
    own_path = rank_file(base, r, N)
    if not own_path.is_file() and N > 1:
        raise CheckpointError(f"checkpoint {base}: no file for rank {r} of {N} ({own_path.name})")
    own = read_checkpoint(own_path)
    rank0 = own if r == 0 else read_checkpoint(rank_file(base, 0, N))
    for path, p in ((own_path, own), (rank_file(base, 0, N), rank0)):
        if same_run:
            _check_run(trainer, p, path)  # first: it names the flag that differs
        _check(trainer, p, path)
        if p["step"] != own["step"]:
            raise CheckpointError(f"checkpoint {base}: the ranks' files are of different steps")
        if step is not None and p.get("step") != step:
            raise _misnamed(path, step, p.get("step"))
    if "rows" in own:  # read once whole (its sha256) before anything changes
        checkpoint_rows.check_rows(own_path, own["rows"], own["step"], _rows_record(trainer), CheckpointError)
    return own, rank0


def _misnamed(path: Path, named: int, inside) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is named step {named} but holds step {inside} (copied or renamed?): a checkpoint "
        f"is known by its content; move it out of the directory (or give it its own step's name) to resume"
    )


def load_checkpoint(trainer, base: str | os.PathLike, same_run: bool = False, step: int | None = None) -> int:
    """Restores ``trainer`` from checkpoint ``base`` after verifying everything (a collective on N ranks:
    all load, or none); returns the step it resumes at. ``same_run``: also refuse a checkpoint of a run with
    another fingerprint (``--resume``; ``--load`` may start a different run from a checkpoint); ``step``:
    refuse one that holds another step (its name's)."""
    base = Path(base)
    comm: Comm = trainer.comm
    error = None
    try:
        own, rank0 = _read_for(trainer, base, same_run, step)
    except CheckpointError as e:
        error = e
    if not comm.all_ok(error is None):
        raise error or CheckpointError(
            f"checkpoint {base}: another rank could not load its file (see its error)"
        )
    host = disk_rows(trainer.mode)
    if host is not None:  # what its file held is replaced: no delta on an earlier base
        untrack(host.file)
    try:
        trainer.dense_opt.load_state_dict(rank0["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{base}: the dense optimizer state does not match --optimizer: {e}") from e
    trainer.model.load_state_dict(rank0["model"])
    counts = getattr(getattr(trainer.mode, "dispatcher", None), "counts", None)
    if "hot_rows" in own and counts is not None:  # the placement in force when it was written, first
        trainer.mode.replace(own["hot_rows"].numpy())
        counts.load({k: v.numpy() for k, v in own["online_counts"].items()})
    if "rows" in own:
        _load_rows(trainer, rank_file(base, comm.rank, comm.world_size), rank0["hot"], own["rows"])
    elif comm.world_size == 1:
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


def _hot_to_file(host, rows: np.ndarray, w: np.ndarray, s: np.ndarray) -> None:
    """Writes a checkpoint's hot rows (weights ``w``, state ``s``) into the disk store ``host``'s file, a chunk
    of :data:`~hotline.training.checkpoint_rows.CHUNK_BYTES` at a time, by its bulk writes: the load holds one
    chunk of them beside the checkpoint, and the DRAM tier, not read yet, is read at the first step, once the
    load's memory is freed (``tests/test_checkpoint_memory.py``)."""
    f, U = host.file, rows.shape[0]
    cols = s.reshape(U, host.S)
    chunk = max(1, checkpoint_rows.CHUNK_BYTES // f.record)
    for lo in range(0, U, chunk):
        rec = np.concatenate([w[lo : lo + chunk], cols[lo : lo + chunk]], axis=1)
        host._wrote_nonfinite |= not np.isfinite(rec).all()
        f.put_rows(rows[lo : lo + chunk], rec)
    f.drop_page_cache()


def _hot_from_file(host, mode) -> None:
    """This run's hot tier (``mode.hot_rows``) read from the disk store ``host``'s file, a chunk at a time."""
    rows = mode.hot_rows
    chunk = max(1, checkpoint_rows.CHUNK_BYTES // host.file.record)
    with torch.no_grad():
        for lo in range(0, rows.shape[0], chunk):
            w, s, _ = host.get(rows[lo : lo + chunk])
            mode.hot_w[lo : lo + chunk].copy_(torch.from_numpy(w))
            mode.hot_s[lo : lo + chunk].copy_(torch.from_numpy(s))


def _load_rows(trainer, path: Path, hot: dict, record: dict) -> None:
    """Loads a disk-store checkpoint's rows (the rows file of ``path``) and its hot tier ``hot``: streamed
    into this run's disk store, or whole into a store that keeps its rows in memory."""
    mode, N = trainer.mode, trainer.comm.world_size
    host = disk_rows(mode)
    hot_rows, hot_w, hot_s = hot["rows"].numpy(), hot["w"], hot["s"]
    if host is not None:
        checkpoint_rows.load_rows(host, path, record=record)  # the next checkpoints: deltas on its base
        if N == 1:  # the file's copies of the checkpoint's hot rows are stale: theirs first, then this tier's
            _hot_to_file(host, hot_rows, hot_w.numpy(), hot_s.numpy())
            if not np.array_equal(mode.hot_rows, hot_rows):  # another hot set: the file holds its rows
                _hot_from_file(host, mode)
                return
        with torch.no_grad():  # N ranks: the same placement (the run's fingerprint), so the same hot tier
            mode.hot_w.copy_(hot_w)
            mode.hot_s.copy_(hot_s)
        return
    w, s = checkpoint_rows.read_tables(path, trainer.sparse_opt.state_shape)
    if N > 1:
        cold = {"cold_w": torch.from_numpy(w), "cold_s": torch.from_numpy(s)}
        mode.load_shard_state(cold, {"hot_w": hot_w, "hot_s": hot_s})
        return
    w[hot_rows] = hot_w.numpy()
    if s.size:
        s[hot_rows] = hot_s.numpy()
    layout = TableLayout(trainer.dataset.table_sizes)
    mode.load_tables(layout.split(w), layout.split_state(s))
