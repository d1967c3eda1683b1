"""The notebooks run top to bottom on small data, write only into a fresh temporary folder (the notebooks' own
folder stays as it was), and are committed without outputs.

Each kernel talks to its client over Unix sockets in a fresh folder of its own (``transport="ipc"``), not TCP
ports: notebooks run in parallel (pytest-xdist, two checkouts at once) cannot take each other's ports, which
ended a run in ``ZMQError: Address already in use`` (the ports were chosen free, then bound a moment later)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "profile_dataset.ipynb"


@pytest.fixture
def sockets():
    """A fresh folder with a short path (a Unix socket's path is at most 107 bytes), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="hk-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _client(nb, folder: Path, sockets: Path, timeout: int):
    """A NotebookClient whose kernel runs in ``folder`` and is reached over Unix sockets in ``sockets``."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(sockets / "k"))
    km.connection_file = str(sockets / "connection.json")
    return nbclient.NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(folder)}})


@pytest.fixture
def written():
    """Collects the temporary folders the notebooks say they write into, and removes them afterwards."""
    folders: list[Path] = []
    yield folders
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _work_folder(nb, folder: Path, written: list[Path]) -> Path:
    """The folder a notebook's first cell printed ("writing into PATH"): a fresh temporary one, not the
    notebook's own folder, which is left as it was."""
    text = "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream"
    )
    match = re.search(r"^writing into (.+)$", text, re.M)
    assert match, text
    work = Path(match.group(1))
    written.append(work)
    assert work.is_dir() and Path(tempfile.gettempdir()) in work.parents and folder not in work.parents
    assert not list(folder.iterdir())  # nothing written where the notebook runs
    return work


def test_profile_notebook_runs(tmp_path, sockets, written):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = _client(nb, tmp_path, sockets, timeout=120)
    client.execute()  # raises CellExecutionError naming the failing cell
    work = _work_folder(nb, tmp_path, written)
    assert (work / "placement.npz").is_file() and (work / "synthetic-small" / "meta.json").is_file()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert sum(o.output_type == "display_data" and "image/png" in o.get("data", {}) for o in outputs) == 3
    assert not [o for o in outputs if o.output_type == "error"]
    assert not [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]  # no warnings


TRAINING_NOTEBOOK = NOTEBOOK.with_name("training_run.ipynb")


def test_training_notebook_runs(tmp_path, sockets, written):
    nb = nbformat.read(TRAINING_NOTEBOOK, as_version=4)
    client = _client(nb, tmp_path, sockets, timeout=180)
    client.execute()
    work = _work_folder(nb, tmp_path, written)
    for mode in ("hybrid", "hotline"):
        records = (work / f"{mode}.jsonl").read_text().splitlines()
        assert len(records) == 20 + 3 + 1  # 200 steps / print-freq 10, 3 validations before the end, summary
    assert (work / "run.png").read_bytes()[:4] == b"\x89PNG"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert (
        sum(
            o.output_type in ("display_data", "execute_result") and "image/png" in o.get("data", {})
            for o in outputs
        )
        == 2
    )
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    log = [line for line in stderr.splitlines() if not line.startswith("compiling kernels")]
    assert not log, log  # quiet runs: no pages of log lines, and no warnings
    tables = [o for o in outputs if o.output_type == "execute_result" and "text/html" in o.get("data", {})]
    assert len(tables) == 3  # summaries, train records, eval records


TORCHREC_NOTEBOOK = NOTEBOOK.with_name("torchrec_path.ipynb")


def test_torchrec_notebook_runs(tmp_path, sockets, written):
    pytest.importorskip("torchrec")
    nb = nbformat.read(TORCHREC_NOTEBOOK, as_version=4)
    client = _client(nb, tmp_path, sockets, timeout=300)
    client.execute()  # its last cell asserts torchrec's plain collection predicts what Hotline's does
    assert (_work_folder(nb, tmp_path, written) / "synthetic-small" / "meta.json").is_file()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum(o.output_type == "display_data" and "image/png" in o.get("data", {}) for o in outputs) == 1
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert "largest difference of 1,024 predictions" in text
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, stderr


@pytest.mark.parametrize("name", ["profile_dataset.ipynb", "training_run.ipynb", "torchrec_path.ipynb"])
def test_notebook_is_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOK.with_name(name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
