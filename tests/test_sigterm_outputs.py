"""SIGTERM mid-write of the outputs that replace or add large files: a ``--force`` export over an export (the
swap in one step, and the fallback that moves the old one aside) and a delta checkpoint's rows file. The command
unwinds (exit 143, one line), leaves nothing half-written and loses nothing already written: the old export whole
under its name, the checkpoints before the delta whole and resumable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hotline import _io
from hotline.cli import main
from hotline.training.checkpoint_rows import rows_path
from hotline.training.export import export_torchrec_dlrm
from tests.test_checkpoint_rows import BATCH, CLI_ARCH, data, resume_argv  # noqa: F401 -- data: a fixture
from tests.test_export_sharded import CHUNK, disk  # noqa: F401 -- disk: a fixture

ROOT = Path(__file__).resolve().parents[1]


def _terminated(patch: str, argv: list[str]) -> tuple[int, list[str]]:
    """``hotline ARGV`` in a new process after the Python lines ``patch`` (which send it SIGTERM mid-write):
    its exit status and stderr lines."""
    code = f"import os, signal, sys\n{patch}\nfrom hotline.cli import main\nsys.exit(main({argv!r}))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    return proc.returncode, proc.stderr.strip().splitlines()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


SIGTERM_AT_FIFTH_CHUNK = """
from hotline.training import export_rows
real, seen = export_rows.StreamedRows.chunk, []
def chunk(self, k):
    seen.append(k)
    if len(seen) == 5: os.kill(os.getpid(), signal.SIGTERM)
    return real(self, k)
export_rows.StreamedRows.chunk = chunk
"""

SIGTERM_ONCE_MOVED_ASIDE = """
from hotline import _io
_io._exchange = lambda a, b: False  # a filesystem without renameat2's exchange
real = os.replace
def replace(a, b):
    real(a, b)
    if ".hotline-tmp-old-" in str(b): os.kill(os.getpid(), signal.SIGTERM)  # the old one aside, the new not in
os.replace = replace
"""


def test_sigterm_mid_export_keeps_the_old_export_whole(disk, tmp_path):  # noqa: F811
    """``--force`` over a sharded export, SIGTERM while its chunks are written, and SIGTERM between moving the
    old one aside and renaming the new one (where the filesystem cannot swap): exit 143, one line, the old
    export byte for byte under its name, no temporary left."""
    _, ck, _ = disk
    out = tmp_path / "m"
    export_torchrec_dlrm(ck, out, format="dcp", chunk_bytes=CHUNK)
    old = _files(out)
    for patch in (SIGTERM_AT_FIFTH_CHUNK, SIGTERM_ONCE_MOVED_ASIDE):
        code, err = _terminated(patch, ["export", str(out), "--load", str(ck), "--format", "dcp", "--force"])
        assert code == 143 and err[-1] == "hotline export: terminated", "\n".join(err)
        assert not any("Traceback" in line for line in err), err
        assert _files(out) == old
        left = sorted(p.name for p in tmp_path.iterdir())
        assert all(n == "m" or n.endswith(".hotline-lock") for n in left), left


def test_a_killed_replacement_moved_aside_is_put_back_by_the_next_run(tmp_path):
    """A kill (no unwinding) between moving the old output aside and renaming the new one: the next run that
    writes in the folder puts the old one back under its name, and removes the new one's temporary."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    (tmp_path / f".m{_io.TMP_MARKER}old-{pid}-0a1b2c3d").mkdir()
    (tmp_path / f".m{_io.TMP_MARKER}old-{pid}-0a1b2c3d" / "x").write_text("the old export")
    (tmp_path / f".m{_io.TMP_MARKER}{pid}-0badc0de").mkdir()  # the new one, incomplete as far as anyone knows
    removed = _io.remove_stale_temporaries(tmp_path)
    assert [p.name for p in removed] == [f".m{_io.TMP_MARKER}{pid}-0badc0de"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and (tmp_path / "m" / "x").read_text() == (
        "the old export"
    )
    # the same name where the new one did take its place: the old one is removed, the new one kept
    (tmp_path / f".m{_io.TMP_MARKER}old-{pid}-0a1b2c3d").mkdir()
    assert len(_io.remove_stale_temporaries(tmp_path)) == 1 and (tmp_path / "m" / "x").is_file()


SIGTERM_MID_DELTA = """
from hotline.training import checkpoint_delta
real = checkpoint_delta.pieces
def pieces(host, chunk):
    for i, piece in enumerate(real(host, chunk)):
        yield piece
        os.kill(os.getpid(), signal.SIGTERM)  # the delta's temporary file holds its first piece
checkpoint_delta.pieces = pieces
"""


def test_sigterm_mid_delta_checkpoint_leaves_the_checkpoints_before_it_resumable(data, tmp_path, capsys):  # noqa: F811
    """SIGTERM while step 8's delta rows file is written (step 4's full copy is its base): exit 143, one line,
    no temporary and no step-8 file; step 4's checkpoint whole (its digests), and the resume from it runs."""
    ds, placement, _ = data
    ck, cold = tmp_path / "ck", tmp_path / "cold"
    cold.mkdir()
    argv = ["train", str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement, "--optimizer",
            "rowwise-adagrad", "--mini-batch-size", str(BATCH), "--no-progress", "--num-batches", "12",
            "--cold-store", "disk", "--cold-dir", str(cold), "--checkpoint-dir", str(ck),
            "--checkpoint-every", "4"]  # fmt: skip
    code, err = _terminated(SIGTERM_MID_DELTA, argv)
    assert code == 143 and err[-1] == "hotline train: terminated", err
    assert not any("Traceback" in line for line in err), err
    names = sorted(p.name for p in ck.iterdir())
    assert not [n for n in names if _io.TMP_MARKER in n], names
    assert "step-000000004.pt" in names and not [n for n in names if n.startswith("step-000000008")], names
    four = ck / "step-000000004.pt"
    assert _io.read_digest(four) == _io.sha256(four) and rows_path(four).is_file()
    capsys.readouterr()
    assert main([*resume_argv(ds, placement, cold, ck), "--num-batches", "8"]) == 0  # its digests checked
    assert "resum" in capsys.readouterr().err
