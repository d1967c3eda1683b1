"""What a path given as an input file is, in words: every reader names a directory, a FIFO, ``/dev/null`` or a
symlink loop as what it is, instead of "does not exist" or a traceback from deep inside numpy or torch."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a regular file, as the end of a sentence that starts with its name
    ("does not exist", "is a directory, not a file", "is a symlink loop", ...); None when it is a regular file
    (a symlink to one included)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symlink loop (a link that leads back to itself), not a file"
        if e.errno == errno.ENOENT and p.is_symlink():
            return f"is a symlink to {os.readlink(p)}, which does not exist"
        if e.errno == errno.ENOENT:
            return "does not exist"
        if e.errno == errno.ENOTDIR:
            return "does not exist (a part of its path is a file, not a directory)"
        return f"cannot be read ({e.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    if p.resolve() == Path(os.devnull):
        kind = f"{os.devnull} (a character device that reads as empty)"
    return f"is {kind}, not a file"


def check_file(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> Path:
    """``path`` if it is a regular file, else raises ``error``: ``"{what} {path} is a directory, not a file"``
    (and alike: :func:`file_problem`)."""
    problem = file_problem(path)
    if problem is not None:
        raise error(f"{what} {path} {problem}")
    return Path(path)
