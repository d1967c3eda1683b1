"""hotline.kernels.page_io: runs of pages read and written in a loop without the GIL equal the same requests
through os.preadv / os.pwritev (the twin), byte for byte; a request that falls short (the file's end, a bad
descriptor) is reported by its index, and the store's transfer then names the error as before."""

from __future__ import annotations

import os

import numpy as np
import pytest

from hotline.kernels.page_io import AVAILABLE, io_runs, io_runs_twin
from hotline.tiers.disk_pages import transfer

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="no libc pread here: the store uses the twin alone")
PAGE = 4096


def _requests(rng, pages: int):
    """Runs of 1-5 pages at random places of a file of ``pages`` pages, packed one after another in a buffer."""
    n = int(rng.integers(1, 40))
    size = rng.integers(1, 6, n).astype(np.int64) * PAGE
    off = rng.integers(0, pages - 5, n).astype(np.int64) * PAGE
    at = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
    return at, off, size


@pytest.mark.parametrize("seed", range(4))
def test_reads_and_writes_equal_the_os_calls(tmp_path, seed):
    rng = np.random.default_rng(seed)
    pages = 64
    content = rng.integers(0, 256, pages * PAGE, dtype=np.uint8)
    files = [tmp_path / f"{k}.bin" for k in ("kernel", "twin")]
    for f in files:
        f.write_bytes(content.tobytes())
    fds = [os.open(f, os.O_RDWR) for f in files]
    try:
        for _ in range(5):
            at, off, size = _requests(rng, pages)
            got, want = (np.zeros(int(size.sum()), np.uint8) for _ in range(2))
            assert io_runs(False, fds[0], got, at, off, size) == -1
            assert io_runs_twin(False, fds[1], want, at, off, size) == size.tolist()
            assert np.array_equal(got, want)
            new = rng.integers(0, 256, int(size.sum()), dtype=np.uint8)
            assert io_runs(True, fds[0], new, at, off, size) == -1
            io_runs_twin(True, fds[1], new, at, off, size)
    finally:
        for fd in fds:
            os.close(fd)
    assert files[0].read_bytes() == files[1].read_bytes() != content.tobytes()


def test_a_request_that_falls_short_is_named_by_its_index(tmp_path):
    f = tmp_path / "short.bin"
    f.write_bytes(bytes(3 * PAGE))
    fd = os.open(f, os.O_RDONLY)
    try:
        buf = np.zeros(3 * PAGE, np.uint8)
        at, off, size = (
            np.array(x, np.int64) for x in ([0, PAGE, 2 * PAGE], [0, PAGE, 3 * PAGE], [PAGE] * 3)
        )
        assert io_runs(False, fd, buf, at, off, size) == 2  # the third starts at the file's end
    finally:
        os.close(fd)
    assert io_runs(False, -1, buf, at, off, size) == 0  # a bad descriptor: the first request
    with pytest.raises(OSError, match="short read: cold store"):  # the store's transfer names it as before
        transfer(os.open(f, os.O_RDONLY), f, None, 1, False, np.array([0, 3]), np.zeros(2 * PAGE, np.uint8))
