"""The one way Hotline writes a file: atomically, with a digest when asked, and a clear error when it cannot.

Every writer (datasets' metadata, placements, checkpoints and their digests, plans and side-cars, profile
JSON/CSV, parameter dumps, benchmark JSON) goes through :func:`atomic_write`: the bytes go to a temporary file
in the same directory (a name only Hotline uses: ``.<name>.hotline-tmp-<pid>-<random>``), are flushed and
fsynced, and replace the target with one ``rename``; the directory is fsynced after. A crash or a full disk
leaves the previous version of the file intact and no temporary file behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TMP_MARKER = ".hotline-tmp-"


def temporary_name(path: Path) -> Path:
    """A temporary sibling of ``path`` that only this process of Hotline uses (pid and a random part)."""
    return path.with_name(f".{path.name}{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}")


_TEMPORARY = re.compile(
    r"^\..+" + re.escape(TMP_MARKER) + r"(?:old-)?(?P<pid>\d+)-[0-9a-f]+(?:\.[A-Za-z0-9]{1,8})?$"
)  # an optional suffix: a temporary that keeps its file's (synthetic's raw TSV, ``.tsv``)


def scratch_folder(directory: str | os.PathLike, stem: str) -> Path:
    """A fresh scratch folder in ``directory`` named as Hotline's temporaries are (``.STEM.hotline-tmp-PID-RANDOM``),
    so that the next run finds and removes it if this process is killed before it removes it itself; what
    killed runs left there is removed first (named on stderr)."""
    say_removed(remove_stale_temporaries(directory))
    path = temporary_name(Path(directory) / stem)
    path.mkdir()
    return path


def say_removed(removed: list[Path]) -> None:
    """One line on stderr per temporary file or folder of a killed Hotline run that was just removed."""
    import sys

    for path in removed:
        print(f"hotline: removed {path}, left by a Hotline run that was killed (pid gone)", file=sys.stderr)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Removes the temporary files and folders that Hotline processes which no longer run left in
    ``directory`` (``.NAME.hotline-tmp-PID-RANDOM``, PID gone: a ``kill -9`` during a write); returns them.
    Names of any other form, and temporaries of live processes, are left alone."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMPORARY.match(entry.name) if TMP_MARKER in entry.name else None
        if m is None or int(m["pid"]) == os.getpid() or _alive(int(m["pid"])):
            continue
        path = Path(entry.path)
        if f"{TMP_MARKER}old-" in entry.name and _restore(path):
            continue  # the old output of a replacement killed before the new one took its name: back
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _restore(old: Path) -> bool:
    """Puts ``old`` (``.NAME.hotline-tmp-old-PID-RANDOM``, :func:`replace_whole`'s) back under ``NAME`` if
    nothing is there; whether it did."""
    name = old.parent / old.name[1 : old.name.index(TMP_MARKER)]
    if name.exists() or name.is_symlink():
        return False
    os.rename(old, name)
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Swaps the paths ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``); False where the
    system or the filesystem has no such call."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"cannot swap {a} and {b} ({os.strerror(err)})")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def replace_whole(tmp: Path, out: Path) -> None:
    """Makes the complete ``tmp`` (a file or a directory, beside ``out``) ``out``: renamed, or, over an existing
    ``out``, swapped with it in one atomic step and the old one then removed, so that ``out`` is at every moment
    the old output or the new one. Where the filesystem cannot swap, the old one is moved aside
    (``.NAME.hotline-tmp-old-PID-RANDOM``) and the new one renamed: an exception between the two (a SIGTERM's
    unwinding) puts the old one back, and a kill there leaves it for :func:`remove_stale_temporaries` to put
    back. The directory is fsynced after."""
    tmp, out = Path(tmp), Path(out)
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
    elif _exchange(tmp, out):
        _remove(tmp)  # the old one, now under the temporary name
    else:
        aside = out.with_name(f".{out.name}{TMP_MARKER}old-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.replace(out, aside)
            os.replace(tmp, out)
        except BaseException:
            if aside.exists() and not (out.exists() or out.is_symlink()):
                os.replace(aside, out)
            raise
        _remove(aside)
    fsync_dir(out.parent)


def fsync_dir(directory: str | os.PathLike) -> None:
    """Makes a rename or a new file in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Checked:
    """A file as writers see it: every byte through Python's ``write``, which reports a failed write.

    numpy's ``tofile`` (behind ``np.save``) writes a real file through C stdio, and a write cut short by a
    full disk or a file-size limit can pass unreported; a file object that is not an ``io`` file makes numpy
    (and every other writer) use ``write``."""

    def __init__(self, f: BinaryIO):
        self._f = f

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Writes ``path`` through ``write(file)`` atomically; returns the path.

    A failed write (full disk, file-size limit) raises OSError naming the file, and leaves the previous file
    as it was. torch.save's zip writer reports a failed write as a RuntimeError whose context is the OSError:
    that, too, becomes the OSError it is.
    """
    path = Path(path)
    remove_stale_temporaries(path.parent)  # what a killed Hotline process left here
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(_Checked(f))
            f.flush()
            if os.fstat(f.fileno()).st_size < f.tell():  # a lost write no writer reported
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        cause = e if isinstance(e, OSError) else e.__context__
        if not isinstance(cause, OSError):
            raise
        raise OSError(cause.errno, f"{cause.strerror}: cannot write {path} (no partial file was left)") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` to ``path``, atomically."""
    return atomic_write(path, lambda f: f.write(data))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` (UTF-8) to ``path``, atomically."""
    return write_bytes(path, text.encode())


def write_json(path: str | os.PathLike, obj, indent: int | None = 2) -> Path:
    """``obj`` as JSON (one trailing newline) to ``path``, atomically."""
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


def sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def digest_path(path: str | os.PathLike) -> Path:
    """The ``.sha256`` file beside ``path``."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def write_with_digest(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Writes ``path`` atomically, then its ``.sha256`` digest atomically; the file counts only with it.

    If the digest cannot be written, the data file is removed too (it was this call's own), so no file
    without its digest is left behind."""
    path = atomic_write(path, write)
    try:
        write_text(digest_path(path), f"{sha256(path)}  {path.name}\n")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def read_digest(path: str | os.PathLike) -> str:
    """The hex digest recorded beside ``path`` ("" when the digest file is empty)."""
    text = digest_path(path).read_text().split()
    return text[0] if text else ""
