"""One run's checkpoints in a directory: :class:`CheckpointManager` claims it, writes a checkpoint every so many
steps, rotates the old ones and resumes the newest complete one.

A checkpoint directory belongs to one run. Every checkpoint records the run's fingerprint
(:func:`~hotline.training.checkpoint.run_fingerprint`: model, optimizer, dataset, mini-batch size, number of
ranks, and on N ranks the placement): the manager refuses a new run into a directory that holds checkpoints
(resume it, or choose another directory), refuses a ``--resume`` whose fingerprint differs, holds an
``fcntl`` lock on the directory so that a second live run is refused, and its rotation removes only
checkpoints of its own run.

A checkpoint is trusted by its content, never by its name: the step, the run fingerprint and the digest inside
decide what it is. A file whose name says another step than the one inside (copied or renamed) is refused;
rotation removes only checkpoints verified as this run's and older than the newest verified one. A checkpoint
of N ranks is complete only with its commit marker (``step-000000123.of-002.commit``), which rank 0 writes
after every rank's file and digest are written; the parts of one a crash left without its marker are removed
by the next run of the same fingerprint, and so are the rows files of a disk-store checkpoint
(:mod:`hotline.training.checkpoint_rows`) whose checkpoint file a crash kept from being written. Rotation keeps a
checkpoint whose rows file a kept delta checkpoint stands on (:mod:`hotline.training.checkpoint_delta`) until no
kept one needs it: ``keep`` counts the checkpoints a run may resume from, and at most one base is kept besides.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

from hotline import _io
from hotline.distributed.comm import Comm
from hotline.training.checkpoint import (
    _STEP_NAME,
    CHECKPOINT_FORMAT,
    COMMIT_FORMAT,
    CheckpointError,
    _misnamed,
    load_checkpoint,
    rank_file,
    run_fingerprint,
    save_checkpoint,
)
from hotline.training.checkpoint_delta import is_delta
from hotline.training.checkpoint_rows import read_header, rows_path


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
        self._remove_orphan_rows(run, N)
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
                rows_path(f).unlink(missing_ok=True)
            print(f"removed the incomplete checkpoint of step {step} a stopped run left in {self.directory}",
                  file=sys.stderr)  # fmt: skip

    def _remove_orphan_rows(self, run: dict, N: int) -> None:
        """Removes the rows files of this run's checkpoints whose checkpoint file a crash kept from being
        written (known by the header inside: this run's, of the step its name says)."""
        for p in self.directory.iterdir():
            if not p.name.endswith(".rows"):
                continue
            m = _STEP_NAME.match(p.name[: -len(".rows")])
            if m is None or int(m.group(3) or 1) != N or p.with_name(p.name[: -len(".rows")]).exists():
                continue
            found = read_header(p) if p.is_file() and not p.is_symlink() else None
            if found is None or found[0].get("run") != run or found[0].get("step") != int(m.group(1)):
                continue
            p.unlink(missing_ok=True)
            print(f"removed {p.name}, the rows of a checkpoint a stopped run did not finish, from "
                  f"{self.directory}", file=sys.stderr)  # fmt: skip

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
        done = self.complete()
        own = [b for b in done if self._step_of(b) in self._own and self._step_of(b) < step]
        going = own[: max(0, len(own) - (self.keep - 1))]
        bases = self._bases([b for b in done if b not in going])
        for old in going:
            if not self._verified(old, run):  # replaced under us: not provably ours any more, left alone
                self._own.discard(self._step_of(old))
                continue
            needed = rows_path(rank_file(old, r, N)).name in bases
            if needed if N == 1 else not self.comm.all_ok(not needed):
                continue  # the base of a kept delta: kept with it, rotated once no kept one needs it
            if N > 1 and r == 0:
                self._marker(self._step_of(old)).unlink(missing_ok=True)  # first: never complete-looking
            f = rank_file(old, r, N)  # each rank removes its own old file
            _io.digest_path(f).unlink(missing_ok=True)
            f.unlink(missing_ok=True)
            rows_path(f).unlink(missing_ok=True)
            self._own.discard(self._step_of(old))
        return base

    def _bases(self, kept: list[Path]) -> set[str]:
        """The rows files (names) that this rank's files of the checkpoints ``kept`` are deltas on
        (:mod:`hotline.training.checkpoint_delta`)."""
        names = set()
        for b in kept:
            f = rows_path(rank_file(b, self.comm.rank, self.comm.world_size))
            found = read_header(f) if f.is_file() and not f.is_symlink() else None
            if found is not None and is_delta(found[0]):
                names.add(found[0]["base"]["file"])
        return names

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
