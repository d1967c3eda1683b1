"""A checkpoint's rows file goes out through :func:`hotline.tiers.direct_out.write_direct`: the bytes given, in
order, with the sha256 of exactly those bytes, atomically, with ``O_DIRECT`` where the filesystem allows it and
the same bytes buffered where it does not."""

import hashlib
import os

import numpy as np
import pytest

from hotline import _io
from hotline.tiers.direct_out import write_direct


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("total", [0, 1, 4095, 4096, 3 * 8192 + 17])
def test_the_file_holds_the_pieces_and_their_digest(tmp_path, direct, total):
    data = np.random.default_rng(total).bytes(total)
    cuts = [0, total // 3, total // 3 + 1, total]  # pieces of any length, across buffer boundaries
    pieces = [np.frombuffer(data[a:b], np.uint8) for a, b in zip(cuts, cuts[1:])]
    size, sha, _ = write_direct(tmp_path / "rows", pieces, direct=direct, buffer_bytes=8192)
    assert (size, sha) == (total, hashlib.sha256(data).hexdigest())
    assert (tmp_path / "rows").read_bytes() == data
    assert os.listdir(tmp_path) == ["rows"]  # no temporary left


def test_o_direct_where_the_filesystem_allows_it(tmp_path):
    _, _, direct = write_direct(tmp_path / "rows", [b"x" * 10_000])
    probe = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    try:
        import fcntl

        fcntl.fcntl(probe, fcntl.F_SETFL, fcntl.fcntl(probe, fcntl.F_GETFL) | os.O_DIRECT)
        allowed = True
    except OSError:
        allowed = False
    finally:
        os.close(probe)
    assert direct == allowed


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    (tmp_path / "rows").write_bytes(b"previous")

    def pieces():
        yield b"x" * 20_000
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="cannot write .*rows"):
        write_direct(tmp_path / "rows", pieces(), buffer_bytes=8192)
    assert (tmp_path / "rows").read_bytes() == b"previous"
    assert [p for p in os.listdir(tmp_path) if _io.TMP_MARKER in p] == []
