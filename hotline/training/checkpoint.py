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

A checkpoint directory belongs to one run. Every checkpoint records the run's fingerprint (model, optimizer,
dataset, mini-batch size, number of ranks, and on N ranks the placement): :class:`CheckpointManager` refuses a
new run into a directory that holds checkpoints (resume it, or choose another directory), refuses a
``--resume`` whose fingerprint differs, holds an ``fcntl`` lock on the directory so that a second live run is
refused, and its rotation removes only checkpoints of its own run.

A checkpoint is trusted by its content, never by its name: the step, the run fingerprint and the digest inside
decide what it is. A file whose name says another step than the one inside (copied or renamed) is refused;
rotation removes only checkpoints verified as this run's and older than the newest verified one. A checkpoint
of N ranks is complete only with its commit marker (``step-000000123.of-002.commit``), which rank 0 writes
after every rank's file and digest are written; the parts of one a crash left without its marker are removed
by the next run of the same fingerprint.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from hotline import _io
from hotline._paths import check_file
from hotline.distributed.comm import Comm

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
            **dcn_arch(trainer.config),
            "optimizer": trainer.config.optimizer,
        },
        "run": run_fingerprint(trainer),
    }
    counts = getattr(getattr(trainer.mode, "dispatcher", None), "counts", None)
    if counts is not None:  # re-placement: the placement in force and the counts it will choose from
        payload["hot_rows"] = torch.from_numpy(trainer.mode.hot_rows.copy())
        payload["online_counts"] = {k: torch.from_numpy(np.asarray(v)) for k, v in counts.state().items()}
    if comm.world_size == 1:
        tables, states = trainer.mode.export_tables_and_state()
        payload["tables"] = [torch.from_numpy(np.ascontiguousarray(t)) for t in tables]
        payload["states"] = [torch.from_numpy(np.ascontiguousarray(s)) for s in states]
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
        return
    dim = trainer.config.embedding_dim
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
    """Periodic checkpoints of ONE run in a directory shared by the ranks; keeps the newest ``keep`` complete
    ones of this run. A step counts when the files and digests of all N ranks are there, and on N ranks its
    commit marker.

    :meth:`start` claims the directory (an ``fcntl`` lock held until :meth:`close`; rank 0 holds it), removes
    the incomplete checkpoints of this run a crash left, and refuses a directory that holds checkpoints unless
    the run resumes them; :meth:`save` writes a checkpoint and removes only this run's old ones, verified."""

    def __init__(self, directory: str | os.PathLike, comm: Comm | None = None, keep: int = 2):
        self.directory = Path(directory)
        self.comm = comm if comm is not None else Comm()
        self.keep = max(1, keep)
        self._own: set[int] = set()  # steps of this run (written here, or resumed and verified)
        self._lock_fd: int | None = None

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

    def _marker(self, step: int) -> Path:
        """The commit marker of an N-rank checkpoint (written by rank 0 after every rank's file)."""
        return self.directory / f"step-{step:09d}.of-{self.comm.world_size:03d}.commit"

    @staticmethod
    def _step_of(base: Path) -> int:
        return int(base.name.split("-")[1].split(".")[0])

    def _committed(self, step: int) -> bool:
        if self.comm.world_size == 1:
            return True  # one file: its digest, written after it, is its commit
        try:
            marker = json.loads(self._marker(step).read_text())
        except (OSError, ValueError):
            return False
        return (
            isinstance(marker, dict) and marker.get("step") == step and marker.get("format") == COMMIT_FORMAT
        )

    def complete(self) -> list[Path]:
        """The checkpoints complete for this run's number of ranks, oldest first (one rank: the files)."""
        N = self.comm.world_size
        steps = self._steps().get(N, {})
        done = [s for s in sorted(steps) if len(steps[s]) == N and self._committed(s)]
        return [self._base(s) for s in done]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def _content(self, base: Path, rank: int = 0) -> dict | None:
        """The small fields of ``rank``'s file of checkpoint ``base`` (memory-mapped: no tensor is read), or
        None when it cannot be read."""
        try:
            payload = torch.load(
                rank_file(base, rank, self.comm.world_size), map_location="cpu", weights_only=True, mmap=True
            )
        except Exception:  # unreadable: not provably anything, so never removed
            return None
        return payload if isinstance(payload, dict) and payload.get("format") == CHECKPOINT_FORMAT else None

    def _verified(self, base: Path, run: dict, digest: bool = False) -> bool:
        """Whether checkpoint ``base`` is provably this run's and of the step its name says (every rank's
        file; ``digest``: their sha256 too)."""
        step = self._step_of(base)
        for r in range(self.comm.world_size):
            payload = self._content(base, r)
            if payload is None or payload.get("run") != run or payload.get("step") != step:
                return False
            f = rank_file(base, r, self.comm.world_size)
            if digest and _io.sha256(f) != _io.read_digest(f):
                return False
        return True

    # -- one run per directory -----------------------------------------------------------------------------
    def _lock(self) -> None:
        """Takes the directory's lock (no lock file: ``flock`` on the directory itself) or raises."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointError(
                f"--checkpoint-dir {self.directory} is in use by another run that is still going: wait for "
                f"it to end, or choose another --checkpoint-dir"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        """Releases the directory's lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _remove_incomplete(self, run: dict) -> None:
        """Removes the parts of this run's checkpoints that a crash left incomplete (rank 0, under the lock):
        rank files without their commit marker (or a marker without all its files), a file without its
        digest. Parts of other runs, or unreadable ones, are left alone."""
        N = self.comm.world_size
        parts: dict[int, list[Path]] = defaultdict(list)
        for p in self.directory.iterdir():
            m = _STEP_NAME.match(p.name)
            if m and int(m.group(3) or 1) == N:
                parts[int(m.group(1))].append(p)
        complete = {self._step_of(b) for b in self.complete()}
        for step, files in parts.items():
            if step in complete:
                continue
            payload = None
            for f in files:  # any readable part tells whose it is
                try:
                    payload = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
                    break
                except Exception:
                    continue
            if not isinstance(payload, dict) or payload.get("run") != run or payload.get("step") != step:
                continue
            if N > 1:
                self._marker(step).unlink(missing_ok=True)
            for f in files:
                _io.digest_path(f).unlink(missing_ok=True)
                f.unlink(missing_ok=True)
            print(f"removed the incomplete checkpoint of step {step} a stopped run left in {self.directory}",
                  file=sys.stderr)  # fmt: skip

    def start(self, trainer, resume: bool, if_present: bool = False) -> int | None:
        """Claims the directory for this run and resumes it if asked (a collective on N ranks); returns the
        step resumed at, or None for a fresh start.

        Refused (CheckpointError): a directory in use by a live run; a fresh run into a directory holding
        checkpoints; ``resume`` without a checkpoint (unless ``if_present``); a checkpoint of another run; a
        checkpoint whose name says another step than its content."""
        error = None
        if self.comm.rank == 0:
            try:
                self._lock()
                self._remove_incomplete(run_fingerprint(trainer))
            except (CheckpointError, OSError) as e:
                error = e
        if not self.comm.all_ok(error is None):
            self.close()
            raise error or CheckpointError(f"--checkpoint-dir {self.directory}: rank 0 could not claim it")
        try:
            if not resume:
                found = {n: max(steps) for n, steps in self._steps().items() if steps}
                refusal = None
                if found:
                    n, step = max(found.items(), key=lambda kv: kv[1])
                    ranks = f" of {n} ranks" if n > 1 else ""
                    refusal = CheckpointError(
                        f"--checkpoint-dir {self.directory} holds checkpoints of another run (newest: step {step}"
                        f"{ranks}): pass --resume to continue that run (same dataset, model, optimizer, "
                        f"--mini-batch-size and --nproc), or choose another --checkpoint-dir"
                    )
                if not self.comm.all_ok(refusal is None):  # all ranks refuse together, none waits
                    raise refusal or CheckpointError(
                        f"--checkpoint-dir {self.directory}: another rank found checkpoints there"
                    )
                return None
            step = self.resume(trainer)
            if step is None and not if_present:
                raise CheckpointError(
                    f"--resume: {self.directory} holds no complete checkpoint to resume: run without --resume "
                    f"to start (or pass --resume-if-present to start when there is none)"
                )
            return step
        except BaseException:
            self.close()
            raise

    def _write_marker(self, step: int) -> None:
        N = self.comm.world_size
        files = {}
        for r in range(N):
            f = rank_file(self._base(step), r, N)
            files[f.name] = _io.read_digest(f)
        marker = {"format": COMMIT_FORMAT, "step": step, "world_size": N, "files": files}
        _io.write_json(self._marker(step), marker)

    def save(self, trainer) -> Path:
        """Writes the checkpoint of this step (every rank its file, then rank 0 the commit marker), then
        removes this run's checkpoints beyond the newest ``keep``: only those verified by content as this
        run's and older than the one just written."""
        step = trainer.step_count
        base = self._base(step)
        save_checkpoint(trainer, base)  # ends when every rank's file and digest are written
        r, N = self.comm.rank, self.comm.world_size
        if N > 1:
            if r == 0:
                self._write_marker(step)
            self.comm.barrier()
        self._own.add(step)
        run = run_fingerprint(trainer)
        own = [b for b in self.complete() if self._step_of(b) in self._own and self._step_of(b) < step]
        for old in own[: max(0, len(own) - (self.keep - 1))]:
            if not self._verified(old, run):  # replaced under us: not provably ours any more, left alone
                self._own.discard(self._step_of(old))
                continue
            if N > 1 and r == 0:
                self._marker(self._step_of(old)).unlink(missing_ok=True)  # first: never complete-looking
            f = rank_file(old, r, N)  # each rank removes its own old file
            _io.digest_path(f).unlink(missing_ok=True)
            f.unlink(missing_ok=True)
            self._own.discard(self._step_of(old))
        return base

    def resume(self, trainer) -> int | None:
        """Loads the newest checkpoint complete on all ranks (refused if another run wrote it, or if a
        checkpoint's name disagrees with the step inside it); None when there is none (for any N). The older
        checkpoints of the same run, verified by content and digest, become this run's to rotate."""
        done = self.complete()
        for base in done:  # a copied or renamed checkpoint would be believed, and rotate the real ones away
            payload = self._content(base)
            if payload is not None and payload.get("step") != self._step_of(base):
                raise _misnamed(
                    rank_file(base, 0, self.comm.world_size), self._step_of(base), payload.get("step")
                )
        latest = done[-1] if done else None
        step = -1 if latest is None else self._step_of(latest)
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
        resumed = load_checkpoint(trainer, latest, same_run=True, step=step)
        run = run_fingerprint(trainer)
        self._own = {self._step_of(b) for b in done if b == latest or self._verified(b, run, digest=True)}
        return resumed
