"""The one output policy of every ``hotline`` command: nothing a user owns is overwritten, nothing is mixed.

Each command declares its outputs (flag, path, kind) and its inputs (flag, path) once, and :func:`claim`
judges them all before the command does any work, in this order:

- a symbolic link is resolved and its target judged (and written: what is judged is what is written); a
  link loop is refused. An output declared ``follow=False`` (the disk store's files) is never written
  through a link: a link there is refused, and with ``--force`` the link itself is replaced (its target is
  left as it is);
- an output that is, or lies inside, one of the command's inputs is refused even with ``--force`` (and a
  directory replaced as a whole may not hold an input either);
- two outputs of one command on one path are refused;
- an existing directory, FIFO or device where a file goes is refused; an existing file (or a Hotline
  dataset, for a dataset directory) is refused unless ``--force`` -- except a file that the run continues
  (``continues``: only one Hotline wrote, see :func:`_continuable`) or one that ``owned`` proves, by its
  content, to be the writer's own (the disk store's files: a name beside it proves nothing);
- the parent directories are created, unless something that is not a directory is in the way; the temporary
  files and scratch folders that killed Hotline runs left in them (``.NAME.hotline-tmp-PID-RANDOM``, the pid
  gone) are removed, one line on stderr each;
- every output is locked (``flock`` on a lock file beside it, ``.NAME.hotline-lock``) until the command ends:
  a second run writing the same output while the first is alive is refused with one line.

The library functions that write a user's file (``Placement.save``, ``export_plan``, ``write_predictions``,
``write_report``, ``export_torchrec_dlrm``, ``Trainer.dump_params``, ``write_raw_tsv``; the dataset writers
through ``overwrite``) judge it by the same rules through :func:`guard`, with ``force=True`` for ``--force``.

Every refusal is an :class:`OutputError` (a ValueError: one line ``hotline CMD: error: ...``, exit 2).
:class:`LineFile` is the writer of streamed files (``--metrics``): whole lines only, continued from a step.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hotline._io import fsync_dir, remove_stale_temporaries, say_removed, temporary_name

LOCK_SUFFIX = ".hotline-lock"
KINDS = ("file", "dir", "dataset")


class OutputError(ValueError):
    """An output path would destroy or mix something: exists, is an input, is shared, or is in use."""


@dataclass(frozen=True)
class Output:
    """One output of a command."""

    flag: str
    """The flag that names it, as the user typed it (``--metrics``); side files say what they are."""
    path: str | os.PathLike
    """The path as given."""
    kind: str = "file"
    """``file``; ``dir``: a directory files are added to (existing: fine, nothing in it is replaced);
    ``dataset``: a directory replaced as a whole (existing: only an empty one or, with --force, a dataset)."""
    continues: str | None = None
    """A file that this run continues, existing is fine if Hotline wrote it: ``records`` (``--metrics`` on
    ``--resume``) or ``document`` (``calibrate --disk-only``'s ``--out``); None: a new file."""
    follow: bool = True
    """False: never written through a symbolic link (a link there is refused; ``--force`` replaces the link
    itself, never its target)."""
    owned: Callable[[Path], bool] | None = None
    """Proves, by the file's content, that an existing file is the writer's own: replaced without ``--force``."""
    explain: Callable[[Path], str | None] | None = None
    """What an existing file ``owned`` does not prove is, if the writer can tell (its own older format)."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Output kind must be one of {KINDS}, got {self.kind!r}")
        if self.continues not in (None, "records", "document"):
            raise ValueError(
                f"Output continues must be None, 'records' or 'document', got {self.continues!r}"
            )


def _resolve(flag: str, path: Path) -> Path:
    try:
        return Path(os.path.abspath(path)).resolve(strict=False)
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13)
        raise OutputError(f"{flag} {path} is a symbolic link loop: give a file name") from e


def _resolve_output(out: Output) -> Path:
    """Where ``out`` is written: a link's target, or (``follow=False``) the path itself in its resolved folder."""
    if out.follow:
        return _resolve(out.flag, Path(out.path))
    path = Path(out.path)
    return _resolve(out.flag, path.parent) / path.name


def _shown(given: Path, target: Path) -> str:
    """``given``, and where it leads when that is elsewhere (a link; relative to here when below it)."""
    if Path(os.path.abspath(given)) == target:
        return str(given)
    relative = os.path.relpath(target)
    return f"{given} (a link to {target if relative.startswith('..') else relative})"


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _continuable(path: Path, what: str) -> bool:
    """Whether ``path`` is a file Hotline wrote that a run may continue: ``records`` (``--metrics``: JSON
    objects, one a line) or ``document`` (a JSON document with a Hotline format tag: a hardware description
    that ``calibrate --disk-only`` adds to)."""
    if what == "records":
        return _is_records(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith("hotline-")


def _is_records(path: Path) -> bool:
    """Whether ``path`` holds only JSON objects, one a line (a Hotline ``--metrics`` file; a cut last line
    from a crash is allowed)."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        whole = lines[:-1]
        return all(isinstance(json.loads(line), dict) for line in whole if line.strip())
    except (OSError, ValueError):
        return False


def _judge_existing(out: Output, given: Path, target: Path, force: bool, force_name: str = "--force") -> None:
    """Refuses what is at ``target`` if this output would destroy it (``force_name``: how the caller says
    "replace it": the CLI's ``--force``, a library function's ``force=True``)."""
    try:
        st = os.stat(target) if out.follow else os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file in the way: _make_parents says)
        return
    except OSError as e:
        raise OutputError(f"{out.flag} {given}: cannot use it ({e.strerror})") from None
    shown = _shown(given, target)
    if stat.S_ISLNK(st.st_mode):  # follow=False only
        if force:
            return
        raise OutputError(
            f"{out.flag} {given} is a symbolic link (to {os.readlink(target)}): this file is never written "
            f"through a link; pass {force_name} to replace the link itself (its target is left as it is), or "
            f"remove it"
        )
    if out.kind == "file":
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{out.flag} {shown} is a directory: give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{out.flag} {shown} is {_kind_of(st.st_mode)}: give a regular file name")
        from hotline.datasets.format import is_dataset_dir  # a dataset's file goes only with the dataset

        if (target.name == "meta.json" or target.suffix == ".npy") and is_dataset_dir(target.parent):
            raise OutputError(f"{out.flag} {shown} is a file of dataset {target.parent}: refused even with --force "
                              f"(a dataset is replaced only whole, by `hotline data ... --force`); choose another name")  # fmt: skip
        if out.continues and _continuable(target, out.continues):
            return
        if out.owned is not None and out.owned(target):
            return
        if not force:
            _refuse_if_held(out.flag, given, target)  # the more useful line: --force would not help
            note = out.explain(target) if out.explain is not None else None
            if note:
                raise OutputError(f"{out.flag} {shown} is {note}")
            raise OutputError(
                f"{out.flag} {shown} exists: pass {force_name} to replace it, or choose another name"
            )
        return
    if not stat.S_ISDIR(st.st_mode):
        what = "a dataset directory" if out.kind == "dataset" else "a directory"
        raise OutputError(f"{out.flag} {shown} exists and is not {what}: refusing to replace it")
    if out.kind == "dir" or not any(target.iterdir()):
        return
    from hotline.datasets.format import FORMAT_TAG, is_dataset_dir

    if not is_dataset_dir(target):
        raise OutputError(
            f"{out.flag} {shown}: output directory exists and is not a Hotline dataset directory (no meta.json "
            f"with format {FORMAT_TAG!r}): refusing to replace it; choose a new or empty directory"
        )
    if not force:
        raise OutputError(
            f"{out.flag} {shown}: output directory already holds a Hotline dataset: pass {force_name} to replace it"
        )


def _make_parents(flag: str, given: Path, directory: Path) -> None:
    """Creates ``directory`` and its missing parents, unless a file is in the way (OutputError naming it);
    then proves a file can be created there (permissions, read-only mounts)."""
    blocker = next((a for a in (directory, *directory.parents) if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise OutputError(f"{flag} {given}: cannot write there ({blocker} is a file, not a directory)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = temporary_name(directory / "probe")
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise OutputError(f"{flag} {given}: cannot write there ({e.strerror or e})") from None


def lock_path(target: Path) -> Path:
    """The lock file beside output ``target`` (inside it for a directory whose parent is not writable, such
    as ``/tmp``)."""
    if target.is_dir() and not os.access(target.parent, os.W_OK):
        return target / LOCK_SUFFIX
    return target.with_name(f".{target.name}{LOCK_SUFFIX}")


def _held_message(flag: str, given: Path, fd: int) -> str:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    return (
        f"{flag} {given} is being written by another Hotline run that is still going (pid {holder}): wait for "
        f"it to end, or choose another name"
    )


def _refuse_if_held(flag: str, given: Path, target: Path) -> None:
    """Raises OutputError if a live run other than this process holds ``target``'s lock (an existing lock
    file; none is made)."""
    try:
        fd = os.open(lock_path(target), os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        if os.pread(fd, 32, 0).decode(errors="replace").strip() in (str(os.getpid()), str(os.getppid())):
            return  # this process claimed it, or the launcher of this rank did (a command calling a writer)
        raise OutputError(_held_message(flag, given, fd)) from None
    finally:
        os.close(fd)


class _Lock:
    """An exclusive ``flock`` on the lock file beside an output, held until :meth:`release`."""

    def __init__(self, flag: str, given: Path, target: Path):
        self.path = lock_path(target)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                message = _held_message(flag, given, fd)
                os.close(fd)
                raise OutputError(message) from None
            try:  # the file may have been removed by the holder that just released it: lock the current one
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held: a waiting run then locks a new file
        finally:
            os.close(self.fd)
            self.fd = None


class Claim:
    """The judged, locked outputs of one command run (a context manager: :meth:`release` at the end)."""

    def __init__(self, targets: dict[str, Path], locks: Sequence[_Lock] = ()):
        self._targets = targets
        self._locks = list(locks)

    def path(self, flag: str, default: str | os.PathLike | None = None) -> Path | None:
        """Where output ``flag`` is written (its link's target); ``default`` if it was not declared."""
        if flag in self._targets:
            return self._targets[flag]
        return None if default is None else Path(default)

    def release(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks = []

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def unclaimed(outputs: Iterable[Output]) -> Claim:
    """The outputs' targets without judging or locking them (a rank whose launcher claimed them)."""
    return Claim({o.flag: _resolve_output(o) for o in outputs if o.path is not None})


def claim(
    outputs: Iterable[Output],
    inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
    force: bool = False,
) -> Claim:
    """Judges every output against the policy (module docstring) and locks them all; raises OutputError
    naming the flag and the path before anything is written. ``None`` paths are skipped."""
    resolved = _judge(outputs, inputs, force, "--force")
    locks: list[_Lock] = []
    try:
        for out, given, target in resolved:
            locks.append(_Lock(out.flag, given, target))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return Claim({o.flag: t for o, _, t in resolved}, locks)


def guard(
    what: str,
    path: str | os.PathLike,
    inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
    force: bool = False,
) -> Path:
    """The policy for a library function that writes one file (``what``: the function and argument, as the
    error names it, e.g. ``"Placement.save path"``): judges ``path`` as :func:`claim` judges an output, with
    ``force=True`` in place of ``--force``, refuses it if another live run holds it, and returns where to
    write (a link's target). Nothing is locked: the function writes the file whole with one atomic rename. A
    command that claimed the path first passes ``force=True`` (its own lock is not in the way)."""
    return judge([Output(what, path)], inputs, force)[what]


def judge(
    outputs: Iterable[Output],
    inputs: Iterable[tuple[str, str | os.PathLike | None]] = (),
    force: bool = False,
) -> dict[str, Path]:
    """:func:`guard` for several outputs of one caller at once (a benchmark's ``--json`` and
    ``--hardware-out``): each judged as :func:`claim` judges it, two on one path refused, none locked; returns
    where to write each (flag -> a link's target). ``None`` paths are skipped."""
    resolved = _judge(outputs, inputs, force, "force=True")
    for out, given, target in resolved:
        _refuse_if_held(out.flag, given, target)
    return {out.flag: target for out, _, target in resolved}


def _judge(
    outputs: Iterable[Output], inputs: Iterable[tuple[str, str | os.PathLike | None]], force: bool,
    force_name: str,
) -> list[tuple[Output, Path, Path]]:  # fmt: skip
    """Every output judged (the module docstring's rules, parents made): (output, path given, target)."""
    outs = [o for o in outputs if o.path is not None]
    resolved = [(o, Path(o.path), _resolve_output(o)) for o in outs]
    ins = []
    for flag, p in inputs:  # an input that cannot be resolved (a link loop) is the input checks' to name
        if p is not None:
            try:
                ins.append((flag, Path(p), Path(os.path.abspath(p)).resolve(strict=False)))
            except (RuntimeError, OSError):
                continue
    for out, given, target in resolved:
        for flag, p, source in ins:
            if target == source or source in target.parents:
                where = "is" if target == source else "is inside"
                raise OutputError(
                    f"{out.flag} {_shown(given, target)} {where} {flag} {p}, an input of this command: refused "
                    f"even with --force (it would be destroyed while it is read); choose another name"
                )
            if out.kind == "dataset" and target in source.parents:
                raise OutputError(
                    f"{out.flag} {given}: output directory holds {flag} {p}: writing the dataset there would "
                    f"delete it; choose another output directory"
                )
    for i, (out, given, target) in enumerate(resolved):
        for j, (other, other_given, other_target) in enumerate(resolved):
            if j < i and target == other_target:
                raise OutputError(
                    f"{other.flag} {other_given} and {out.flag} {given} are the same file: one would be lost; "
                    f"give each output its own name"
                )
            if j != i and other.kind == "dataset" and other_target in target.parents:
                raise OutputError(
                    f"{out.flag} {given} is inside {other.flag} {other_given}, which is replaced as a whole: "
                    f"writing the dataset there would delete it; choose another name"
                )
    for out, given, target in resolved:
        _judge_existing(out, given, target, force, force_name)
    for out, given, target in resolved:
        _make_parents(out.flag, given, target if out.kind == "dir" else target.parent)
    for folder in dict.fromkeys(t if o.kind == "dir" else t.parent for o, _, t in resolved):
        say_removed(remove_stale_temporaries(folder))  # what killed runs left where this one writes
    return resolved


# ------------------------------------------------------------------------------------------ streamed files
class LineFile:
    """A streamed file of whole lines (``--metrics``): every line is one ``write``; a write that fails (a
    full disk, a file-size limit) is cut back to the last whole line and raises OSError naming the file.

    The file is built under a temporary name beside ``path`` and takes its place once its first line is
    written whole (or at :meth:`close`): until then an existing file (``--force``) is as it was, and a run
    that fails first (:meth:`abort`) leaves it so. ``keep`` (a resumed run): the lines of the existing file
    to keep (the records of steps up to the checkpoint's) are copied first, then the file is continued."""

    def __init__(self, path: str | os.PathLike, keep: Callable[[str], bool] | None = None):
        self.path = Path(path)
        kept = b""
        if keep is not None and self.path.is_file():
            text = self.path.read_bytes().decode(errors="replace")
            lines = text.split("\n")[:-1]  # the last part: "" after a newline, else a cut line
            kept = "".join(line + "\n" for line in lines if line and keep(line)).encode()
        self._tmp: Path | None = temporary_name(self.path)
        self._fd: int | None = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            self._write(kept)
        except BaseException:
            self.abort()
            raise

    def _write(self, data: bytes) -> None:
        end = os.fstat(self._fd).st_size
        done = 0
        try:
            while done < len(data):
                n = os.write(self._fd, data[done:])
                if n == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError as e:
            os.ftruncate(self._fd, end)
            raise OSError(
                e.errno, f"{e.strerror}: cannot write {self.path} (it ends at its last whole record)"
            ) from None

    def _publish(self) -> None:
        """The file takes ``path``'s place (an existing one is replaced only now, by bytes already durable: a
        power loss leaves the old file or the new one, never an empty one in its place)."""
        if self._tmp is not None:
            os.fsync(self._fd)
            os.replace(self._tmp, self.path)
            self._tmp = None
            fsync_dir(self.path.parent)

    def write_line(self, line: str) -> None:
        """Appends ``line`` and a newline, whole or not at all."""
        if "\n" in line:
            raise ValueError("a record must be one line")
        self._write((line + "\n").encode())
        self._publish()

    def close(self) -> None:
        """Makes the file durable and in place."""
        if self._fd is None:
            return
        try:
            if self._tmp is None:  # published: the lines since
                os.fsync(self._fd)
            self._publish()
        finally:
            os.close(self._fd)
            self._fd = None

    def abort(self) -> None:
        """Closes after a failure: a file that never took its place is removed (an existing one kept)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None


def records_up_to(step: int) -> Callable[[str], bool]:
    """The ``keep`` of a run resumed at ``step``: JSON records of steps up to it (no summary: the run goes
    on), so that replayed steps are written again once, never twice."""

    def keep(line: str) -> bool:
        try:
            rec = json.loads(line)
        except ValueError:
            return False
        if not isinstance(rec, dict) or rec.get("kind") == "summary":
            return False
        s = rec.get("step")
        return isinstance(s, int) and s <= step

    return keep
