"""A large file written once, in order, atomically, with ``O_DIRECT`` where the filesystem allows it: a
checkpoint's rows file (:mod:`hotline.training.checkpoint_rows`), a disk store's order (:mod:`hotline.tiers.disk_file`).

:func:`write_direct` copies the pieces it is given into two page-aligned buffers in turn; a full buffer is
written by one thread while a second one computes its sha256 and the caller fills the other buffer with the
next pieces (the store's file read in order), so the read, the write and the digest overlap. With ``O_DIRECT``
the bytes skip the page cache: nothing is copied twice, no dirty page counts against a memory limit, and no
periodic ``fdatasync`` is needed. A filesystem that refuses ``O_DIRECT`` (tmpfs) gets the same writes buffered,
made durable and dropped from the page cache every few buffers, as :mod:`hotline.tiers.disk_file` does for the
store. The file's last partial page is written padded and the file then cut to its size.

Atomic as :func:`hotline._io.atomic_write`: a temporary name in the same directory, fsync, rename, fsync of the
directory; a failed write (a full disk) raises OSError naming the file and leaves no temporary behind.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hotline import _io
from hotline.tiers.disk_pages import PAGE, aligned_bytes

BUFFER_BYTES = 32 << 20
"""Each of the two aligned buffers (a multiple of the page): the host memory a write takes besides its pieces."""
_SYNC_BUFFERS = 4
"""Buffered (no ``O_DIRECT``): the bytes are made durable and dropped from the page cache every this many."""


def npy_header(a: np.ndarray) -> bytes:
    """The ``.npy`` header of ``a`` (C order): with ``a``'s bytes after it, the file ``numpy.save`` writes."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, np.lib.format.header_data_from_array_1_0(np.ascontiguousarray(a))
    )
    return out.getvalue()


def _open(tmp: Path, direct: bool) -> tuple[int, bool]:
    """A new file's descriptor, and whether ``O_DIRECT`` is on (asked for, and allowed by the filesystem)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    if not direct or not hasattr(os, "O_DIRECT"):
        return fd, False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError:  # tmpfs and a few others: EINVAL
        return fd, False
    return fd, True


def _pwrite_all(fd: int, view: memoryview, at: int) -> None:
    while view.nbytes:
        n = os.pwrite(fd, view, at)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, at = view[n:], at + n


def write_direct(path: str | os.PathLike, pieces: Iterable, direct: bool = True,
                 buffer_bytes: int = BUFFER_BYTES) -> tuple[int, str, bool]:  # fmt: skip
    """Writes the bytes of ``pieces`` (buffer-like objects, in order) to ``path`` atomically; returns the file's
    size, its sha256 and whether it went out with ``O_DIRECT``."""
    path = Path(path)
    buffer_bytes = max(PAGE, buffer_bytes // PAGE * PAGE)
    _io.remove_stale_temporaries(path.parent)
    tmp = _io.temporary_name(path)
    digest = hashlib.sha256()
    size = 0
    try:
        fd, direct = _open(tmp, direct)
        try:
            buffers = [aligned_bytes(buffer_bytes) for _ in range(2)]
            with (
                ThreadPoolExecutor(1, thread_name_prefix="hotline-rows-out") as writer,
                ThreadPoolExecutor(1, thread_name_prefix="hotline-rows-digest") as hasher,  # in order
            ):
                jobs: list = [[], []]  # each buffer's write and digest in flight
                cur, fill, written, sent = 0, 0, 0, 0

                def send(n: int) -> None:  # buffer ``cur``'s first ``n`` bytes (the file's last: padded)
                    nonlocal written, sent
                    buf, at = buffers[cur], written
                    whole = -(-n // PAGE) * PAGE
                    buf[n:whole] = 0
                    jobs[cur] = [writer.submit(_pwrite_all, fd, memoryview(buf[:whole]), at),
                                 hasher.submit(digest.update, memoryview(buf[:n]))]  # fmt: skip
                    written += whole
                    sent += 1
                    if not direct and sent % _SYNC_BUFFERS == 0:
                        [j.result() for j in jobs[cur]]
                        os.fdatasync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

                for piece in pieces:
                    src = memoryview(piece).cast("B")
                    while src.nbytes:
                        if fill == 0:  # the buffer's previous write and digest are done before it is reused
                            [j.result() for j in jobs[cur]]
                        take = min(src.nbytes, buffer_bytes - fill)
                        buffers[cur][fill : fill + take] = np.frombuffer(src[:take], np.uint8)
                        fill, src, size = fill + take, src[take:], size + take
                        if fill == buffer_bytes:
                            send(fill)
                            cur, fill = 1 - cur, 0
                if fill:
                    [j.result() for j in jobs[cur]]
                    send(fill)
                for j in jobs[0] + jobs[1]:
                    j.result()
            if written != size:
                os.ftruncate(fd, size)  # the last page's padding
            os.fsync(fd)
            if not direct:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"{e.strerror}: cannot write {path} (no partial file was left)") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _io.fsync_dir(path.parent)
    return size, digest.hexdigest(), direct
