"""``hotline export --format dcp`` (``hotline.training.export_sharded``): a checkpoint as torchrec's DLRM in
torch.distributed.checkpoint's format, written chunk by chunk: the values load back exactly (dcp.load into
torchrec's DLRM, a bare EmbeddingBagCollection, plain tensors), the memory is a chunk's, not the table's, and
bad input is one line with nothing under the final name."""

import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch

from hotline import Trainer, _io
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.training import export_sharded
from hotline.training.checkpoint import save_checkpoint
from hotline.training.checkpoint_rows import rows_path
from hotline.training.export import (
    choose_format,
    export_torchrec_dlrm,
    load_torchrec_dlrm,
)
from tests.test_checkpoint_rows import TABLES, _config, _placement

CHUNK = 512  # bytes: 16 rows of dim 8, so every table is cut into several chunks and tails


def _disk_checkpoint(ds, placement, root, tables=None, steps=6):
    """A disk-store run's checkpoint (rows in a rows file, hot rows in the checkpoint) and its arrays."""
    cold = root / "cold"
    cold.mkdir(parents=True)
    tr = Trainer(_config(placement, cold, steps=steps), ds)
    try:
        tr.fit()
        ck = root / "ck" / f"step-{steps:09d}.pt"
        save_checkpoint(tr, ck)
        return ck, tr.named_arrays()
    finally:
        tr.close()


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    root = tmp_path_factory.mktemp("xdcp")
    ds = Dataset(generate(root / "d", 600, seed=5, table_sizes=TABLES, zipf=1.3, progress=False))
    ck, arrays = _disk_checkpoint(ds, _placement(ds, root / "p.npz", 0.3), root)
    return ds, ck, arrays


def _key(t: int) -> str:
    return export_sharded.table_key(f"t_cat_{t}")


def test_a_disk_store_checkpoint_loads_back_exactly_into_torchrec_and_plain_tensors(disk, tmp_path):
    ds, ck, arrays = disk
    out = tmp_path / "m.dcp"
    config = export_torchrec_dlrm(ck, out, format="dcp", chunk_bytes=CHUNK)
    assert config["storage"] == "dcp" and out.is_dir()
    assert json.loads((out / export_sharded.MARKER).read_text())["config"]["table_sizes"] == TABLES
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary, no scratch left
    # torchrec's DLRM, rebuilt and filled by dcp.load
    module, _ = load_torchrec_dlrm(out)
    state = module.state_dict()
    for t in range(len(TABLES)):
        assert np.array_equal(state[_key(t)].numpy(), arrays[f"embedding.table_{t}"]), t
    # the dense weights are the torch.save export's, the same module
    export_torchrec_dlrm(ck, tmp_path / "m.pt", format="torch-save")
    whole, _ = load_torchrec_dlrm(tmp_path / "m.pt")
    for k, v in whole.state_dict().items():
        assert np.array_equal(v.numpy(), state[k].numpy()), k
    # a bare torchrec EmbeddingBagCollection, its keys under the DLRM's prefix
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t_cat_{t}", embedding_dim=8, num_embeddings=n,
                                   feature_names=[f"cat_{t}"]) for t, n in enumerate(TABLES)]
    )  # fmt: skip
    prefixed = {f"sparse_arch.embedding_bag_collection.{k}": v for k, v in ebc.state_dict().items()}
    export_sharded.load_into(out, prefixed)
    for t in range(len(TABLES)):
        got = ebc.embedding_bags[f"t_cat_{t}"].weight.detach().numpy()
        assert np.array_equal(got, arrays[f"embedding.table_{t}"]), t
    # plain tensors: no torchrec module needed to read it
    plain = {_key(t): torch.zeros(n, 8) for t, n in enumerate(TABLES)}
    export_sharded.load_into(out, plain)
    for t in range(len(TABLES)):
        assert np.array_equal(plain[_key(t)].numpy(), arrays[f"embedding.table_{t}"]), t


def test_an_in_memory_checkpoint_exports_to_dcp_too(disk, tmp_path):
    """A checkpoint whose tables are in it (the host-memory store) goes out the same way, by slices."""
    ds, _, _ = disk
    tr = Trainer(_config(None, mode="device", steps=4), ds)
    try:
        tr.fit()
        save_checkpoint(tr, tmp_path / "c.pt")
        arrays = tr.named_arrays()
    finally:
        tr.close()
    export_torchrec_dlrm(tmp_path / "c.pt", tmp_path / "m", format="dcp", chunk_bytes=CHUNK)
    state = load_torchrec_dlrm(tmp_path / "m")[0].state_dict()
    for t in range(len(TABLES)):
        assert np.array_equal(state[_key(t)].numpy(), arrays[f"embedding.table_{t}"]), t


def test_auto_takes_dcp_when_two_copies_of_the_tables_do_not_fit():
    gib = 1 << 30
    assert choose_format(4 * gib, 3 * gib) == "dcp"
    assert choose_format(gib, 3 * gib) == "torch-save"
    assert choose_format(100 * gib, None) == "torch-save"  # no figure: the one file, as before


def test_the_export_takes_a_chunk_of_memory_not_the_table(tmp_path):
    """40 MB of weights (and their state) out at a 64 KiB chunk: numpy's and Python's allocations
    (tracemalloc) stay at a few chunks and the rows file's digest blocks; the whole-table path allocates the
    table, so a regression to it fails here."""
    tables = [250_000] * 5
    ds = Dataset(generate(tmp_path / "d", 300, seed=2, table_sizes=tables, progress=False))
    ck, arrays = _disk_checkpoint(ds, _placement(ds, tmp_path / "p.npz", 0.001), tmp_path, steps=2)
    chunk = 64 << 10
    table_bytes = sum(tables) * 4 * 8
    import torch.distributed.checkpoint.default_planner  # noqa: F401 -- imports are not the export's memory
    import torch.distributed.checkpoint.filesystem  # noqa: F401
    import torchrec.models.dlrm  # noqa: F401

    import hotline.outputs  # noqa: F401
    import hotline.training.host_memory  # noqa: F401

    tracemalloc.start()
    export_torchrec_dlrm(ck, tmp_path / "m", format="dcp", chunk_bytes=chunk)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    bound = (8 << 20) + 8 * chunk + (1 << 20)  # the digest's blocks, a few chunks, the plan's small things
    assert table_bytes > 3 * bound
    assert peak < bound, peak
    plain = {_key(t): torch.zeros(n, 8) for t, n in enumerate(tables)}
    export_sharded.load_into(tmp_path / "m", plain)
    for t in range(len(tables)):
        assert np.array_equal(plain[_key(t)].numpy(), arrays[f"embedding.table_{t}"]), t


# -- bad input: one line, nothing under the final name ---------------------------------------------------------
def _export(capsys, *argv) -> tuple[int, list[str]]:
    code = main(["export", *argv])
    return code, capsys.readouterr().err.strip().splitlines()


def test_an_existing_destination_is_refused_and_kept(disk, tmp_path, capsys):
    _, ck, _ = disk
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes").write_text("mine")
    (tmp_path / "f.txt").write_text("mine too")
    for dest in ("mine", "f.txt"):
        code, err = _export(capsys, str(tmp_path / dest), "--load", str(ck), "--format", "dcp")
        assert code == 2 and len(err) == 1 and dest in err[0], err
    assert (tmp_path / "mine" / "notes").read_text() == "mine"
    assert (tmp_path / "f.txt").read_text() == "mine too"
    # --force replaces a file (the new directory is complete first), never a directory
    code, err = _export(capsys, str(tmp_path / "f.txt"), "--load", str(ck), "--format", "dcp", "--force")
    assert code == 0 and (tmp_path / "f.txt" / export_sharded.MARKER).is_file(), err
    code, err = _export(capsys, str(tmp_path / "mine"), "--load", str(ck), "--format", "dcp", "--force")
    assert code == 2 and len(err) == 1 and (tmp_path / "mine" / "notes").read_text() == "mine"


def test_not_enough_disk_is_refused_before_anything_is_written(disk, tmp_path, capsys):
    """A checkpoint whose tables would need more than any disk holds (its table sizes scaled up: the dense
    model is the same): refused on the real filesystem's free space, before a byte is written."""
    _, ck, _ = disk
    big = tmp_path / "ck" / ck.name
    big.parent.mkdir()
    payload = torch.load(ck, weights_only=True)
    payload["table_sizes"] = [n * 10**9 for n in payload["table_sizes"]]
    _io.write_with_digest(big, lambda f: torch.save(payload, f))
    rows_path(big).symlink_to(rows_path(ck))
    for fmt in ("dcp", "torch-save"):
        code, err = _export(capsys, str(tmp_path / "out"), "--load", str(big), "--format", fmt)
        assert code == 2 and len(err) == 1 and "free disk" in err[0] and "nothing was written" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_damaged_rows_file_is_one_line_and_nothing_is_left(disk, tmp_path, capsys):
    _, ck, _ = disk
    copy = tmp_path / "ck" / ck.name
    copy.parent.mkdir()
    for p in (ck, ck.with_name(ck.name + ".sha256"), rows_path(ck)):
        (copy.parent / p.name).write_bytes(p.read_bytes())
    rows = rows_path(copy)
    raw = bytearray(rows.read_bytes())
    raw[-100] ^= 1
    rows.write_bytes(bytes(raw))
    code, err = _export(capsys, str(tmp_path / "out"), "--load", str(copy), "--format", "dcp")
    assert code == 2 and len(err) == 1 and rows.name in err[0] and "corrupt" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"] and rows.read_bytes() == bytes(raw)


def killed_export(export: str) -> subprocess.CompletedProcess:
    """Runs the Python lines ``export`` (an export) in a new process that SIGKILLs itself at the fifth chunk the
    export sorts (the real chunk before it)."""
    code = (
        "import os, signal\n"
        "from hotline.training import export_rows\n"
        "real, seen = export_rows.StreamedRows.chunk, []\n"
        "def chunk(self, k):  # the real chunk; the fifth request kills the process\n"
        "    seen.append(k)\n"
        "    if len(seen) == 5: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(self, k)\n"
        "export_rows.StreamedRows.chunk = chunk\n"
    )
    return subprocess.run([sys.executable, "-c", code + export], capture_output=True, text=True)


def test_a_killed_export_leaves_no_directory_under_its_name(disk, tmp_path):
    """An export killed mid-write (SIGKILL once its temporary directory holds chunk files) leaves only its
    temporary, which the next export there removes."""
    _, ck, _ = disk
    out = tmp_path / "m"
    proc = killed_export(
        "from hotline.training.export import export_torchrec_dlrm\n"
        f"export_torchrec_dlrm({str(ck)!r}, {str(out)!r}, format='dcp', chunk_bytes={CHUNK})\n"
    )
    assert proc.returncode == -9, proc.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert not out.exists() and len(left) == 1 and ".hotline-tmp-" in left[0], left
    export_torchrec_dlrm(ck, out, format="dcp", chunk_bytes=CHUNK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
