"""The one output policy (hotline/outputs.py), tried on every command that writes, for every output flag:
an existing user file, a link to one, one of the command's own inputs, a second output of the same command on
the same path, a concurrent run holding the output, and a full disk. Each time the user's bytes are compared
(sha256) before and after, and the exit is one error line before any work (nothing on stdout, no other
output made). The streamed ``--metrics`` file is tried in test_metrics_file.py."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hotline.cli import main
from hotline.datasets.synthetic import generate
from hotline.outputs import Output, OutputError, claim, lock_path

SIZES = [40, 300, 25]
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
SMALL = [*ARCH, "--mini-batch-size", "32", "--no-progress", "--eval-max-samples", "64", "--threads", "1"]
SYNTH = ["--rows", "300", "--table-sizes", ",".join(["20"] * 26), "--zipf", "1.2", "--no-progress"]
USER = b"a user's own file: not Hotline's to replace\n" * 3


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A dataset, a checkpoint, a placement, a metrics file and a raw Criteo file: the commands' inputs."""
    root = tmp_path_factory.mktemp("outputs")
    ds = generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)
    generate(root / "with_raw", 300, seed=2, table_sizes=[20] * 26, raw_tsv=root / "raw.tsv", progress=False)
    common = ["train", str(ds), *SMALL, "--num-batches", "2", "--print-freq", "1"]
    assert main([*common, "--save", str(root / "C.pt"), "--metrics", str(root / "M.jsonl")]) == 0
    profile = ["profile", str(ds), "--hbm-budget", "1KiB", "--embedding-dim", "8", "--no-progress"]
    assert main([*profile, "--out", str(root / "P.npz")]) == 0
    # Every kernel the commands call compiled and cached now: under a file-size limit Numba could not save them.
    plan = ["plan", str(ds), "--no-progress", "--embedding-dim", "8", "--placement", str(root / "P.npz")]
    assert main(plan) == 0
    hotline = [*common, "--mode", "hotline", "--placement", str(root / "P.npz"), "--lookahead", "0"]
    assert main(hotline) == 0
    return {"root": root, "ds": ds, "ckpt": root / "C.pt", "placement": root / "P.npz",
            "metrics": root / "M.jsonl", "raw": root / "raw.tsv"}  # fmt: skip


@dataclass
class Case:
    """One output flag of one command: how to run it with that output at a path."""

    command: str  # as the error line names it: "train", "data synthetic"
    flag: str
    argv: callable  # (env, out path) -> argv
    name: str = "out.bin"  # a file name the command accepts for this flag
    kind: str = "file"
    own_input: callable | None = None  # env -> an input of the command to give as this output (with --force)
    other: str | None = None  # a second output flag of the command, given the same path
    full_disk: int | None = None  # a file-size limit below this output's size, above the others'
    extra: list = field(default_factory=list)


def _with(base, flag):
    """``base`` (env -> argv) with ``flag PATH`` appended."""

    def argv(env, out):
        return [*base(env), flag, str(out)]

    return argv


def _train_base(*flags):
    return lambda env: ["train", str(env["ds"]), *SMALL, "--num-batches", "2", *flags]


def _profile_base(env):
    return ["profile", str(env["ds"]), "--hbm-budget", "1KiB", "--embedding-dim", "8", "--no-progress"]


def _hotline_base(env):
    return [
        *_train_base()(env),
        "--mode",
        "hotline",
        "--placement",
        str(env["placement"]),
        "--lookahead",
        "0",
    ]


CASES = [
    Case("train", "--metrics", _with(_train_base(), "--metrics"), "m.jsonl",
         own_input=lambda env: env["ds"] / "train_labels.npy", other="--save", full_disk=64),
    Case("train", "--dump-params", _with(_train_base(), "--dump-params"), "p.npz",
         own_input=lambda env: env["ds"] / "train_labels.npy", other="--dump-init", full_disk=4096),
    Case("train", "--dump-init", _with(_train_base("--load", "{ckpt}"), "--dump-init"), "i.npz",
         own_input=lambda env: env["ckpt"], other="--dump-params", full_disk=4096),
    Case("train", "--save", _with(_train_base("--load", "{ckpt}"), "--save"), "c.pt",
         own_input=lambda env: env["ckpt"], other="--metrics", full_disk=4096),
    Case("train", "--save-placement", _with(_hotline_base, "--save-placement"), "s.npz",
         own_input=lambda env: env["placement"], other="--dump-params", full_disk=200),
    Case("train", "--checkpoint-dir", _with(_train_base("--checkpoint-every", "1"), "--checkpoint-dir"), "ck",
         kind="dir", own_input=lambda env: env["ds"], other="--metrics", full_disk=4096),
    Case("profile", "--out", _with(_profile_base, "--out"), "p.npz",
         own_input=lambda env: env["ds"] / "meta.json", other="--json", full_disk=200),
    Case("profile", "--json", _with(_profile_base, "--json"), "p.json",
         own_input=lambda env: env["ds"] / "meta.json", other="--curve-csv", full_disk=200),
    Case("profile", "--curve-csv", _with(_profile_base, "--curve-csv"), "c.csv",
         own_input=lambda env: env["ds"] / "meta.json", other="--out", full_disk=200),
    Case("plan", "--out", _with(lambda env: ["plan", str(env["ds"]), "--no-progress", "--embedding-dim", "8",
                                             "--placement", str(env["placement"])], "--out"), "plan.json",
         own_input=lambda env: env["placement"], full_disk=200),
    Case("data synthetic", "--out", _with(lambda env: ["data", "synthetic", *SYNTH], "--out"), "ds",
         kind="dataset", other="--raw-tsv", full_disk=1024),
    Case("data synthetic", "--raw-tsv", _with(lambda env: ["data", "synthetic", *SYNTH, "--out", "{new}"],
                                              "--raw-tsv"), "raw.tsv", other="--out", full_disk=40 << 10),
    Case("data criteo", "--out", _with(lambda env: ["data", "criteo", str(env["raw"]), "--no-progress"], "--out"),
         "ds", kind="dataset", own_input=lambda env: env["raw"], full_disk=1024),
    Case("predict", "--out", _with(lambda env: ["predict", str(env["ds"]), "--load", str(env["ckpt"]),
                                                "--eval-max-samples", "64", "--no-progress"], "--out"),
         "p.npy", own_input=lambda env: env["ds"] / "val_labels.npy", full_disk=200),
    Case("export", "OUT", lambda env, out: ["export", "--load", str(env["ckpt"]), str(out)], "t.pt",
         own_input=lambda env: env["ckpt"], full_disk=1024),
    Case("report", "--out", _with(lambda env: ["report", str(env["metrics"])], "--out"), "r.png",
         own_input=lambda env: env["metrics"], full_disk=1024),
    Case("calibrate", "--out", _with(lambda env: ["calibrate"], "--out"), "hw.json", full_disk=200),
]  # fmt: skip
IDS = [f"{c.command.replace(' ', '-')}{c.flag}" for c in CASES]


def _argv(case: Case, env, out: Path, tmp: Path) -> list[str]:
    subs = {"{ckpt}": str(env["ckpt"]), "{new}": str(tmp / "new-ds")}
    return [subs.get(a, a) for a in case.argv(env, out)]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (or of ``path``)."""
    if path.is_file():
        return {".": _sha(path)}
    return {str(p.relative_to(path)): _sha(p) for p in sorted(path.rglob("*")) if p.is_file()}


def _refused(capsys, command: str, argv: list[str], *texts: str) -> str:
    """Runs ``argv``: exit 2, nothing on stdout (no work reported), exactly one error line holding ``texts``."""
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert out == "" and len(lines) == 1, (out, lines)
    assert lines[0].startswith(f"hotline {command}: error: "), lines[0]
    for text in texts:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def _user_file(path: Path, kind: str) -> Path:
    """What a user owns at ``path``: a file, or for a directory output a folder of documents."""
    if kind == "file":
        path.write_bytes(USER)
    else:
        path.mkdir()
        (path / "thesis.tex").write_bytes(USER)
    return path


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_existing_user_file_is_refused_before_any_work(env, tmp_path, capsys, case):
    out = tmp_path / case.name
    out.write_bytes(USER)  # a regular file where the output goes
    before = _tree(tmp_path)
    text = "pass --force" if case.kind == "file" else "exists and is not a"
    _refused(capsys, case.command, _argv(case, env, out, tmp_path), case.flag, str(out), text)
    assert _tree(tmp_path) == before  # the user's bytes, and nothing else made (no lock or temporary file)
    if case.kind == "dataset":  # a folder that is not a dataset: refused even with --force
        out.unlink()
        _user_file(out, case.kind)
        before = _tree(tmp_path)
        argv = [*_argv(case, env, out, tmp_path), "--force"]
        _refused(capsys, case.command, argv, "is not a Hotline dataset directory")
        assert _tree(tmp_path) == before


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_link_to_a_user_file_is_judged_by_its_target(env, tmp_path, capsys, case):
    target = tmp_path / "notes.txt"
    target.write_bytes(USER)
    link = tmp_path / case.name
    link.symlink_to(target)
    before = _tree(tmp_path)
    _refused(capsys, case.command, _argv(case, env, link, tmp_path), case.flag, f"a link to {target}")
    assert _tree(tmp_path) == before and link.is_symlink() and os.readlink(link) == str(target)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    _refused(capsys, case.command, _argv(case, env, loop, tmp_path), case.flag, "symbolic link loop")


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.own_input], ids=[i for c, i in zip(CASES, IDS) if c.own_input]
)
def test_an_output_on_its_own_input_is_refused_even_with_force(env, tmp_path, capsys, case):
    source = case.own_input(env)
    holder = source if source.is_dir() else source.parent
    before = _tree(holder)
    argv = _argv(case, env, source, tmp_path)
    _refused(capsys, case.command, argv, case.flag, "an input of this command")
    _refused(
        capsys, case.command, [*argv, "--force"], case.flag, "an input of this command", "even with --force"
    )
    assert _tree(holder) == before
    inside = holder / case.name  # a new name inside the dataset directory the command reads
    if case.kind != "dataset" and (env["ds"] == source or env["ds"] in source.parents):
        argv = [*_argv(case, env, inside, tmp_path), "--force"]
        _refused(capsys, case.command, argv, "is inside DATASET")
        assert _tree(holder) == before


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.other], ids=[i for c, i in zip(CASES, IDS) if c.other]
)
def test_two_outputs_of_one_command_on_one_path_are_refused(env, tmp_path, capsys, case):
    out = tmp_path / case.name
    argv = [*_argv(case, env, out, tmp_path), case.other, str(out)]
    _refused(capsys, case.command, argv, "are the same file", case.flag, case.other)
    assert list(tmp_path.iterdir()) == []  # nothing written, no directory made


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_concurrent_run_holding_the_output_is_refused(env, tmp_path, capsys, case):
    out = tmp_path / case.name
    with claim([Output(case.flag, out, case.kind)]):  # what a first, still running, command holds
        before = _tree(tmp_path)
        _refused(capsys, case.command, _argv(case, env, out, tmp_path), case.flag, "another Hotline run")
        assert _tree(tmp_path) == before
        assert not out.exists() or (
            case.kind == "dir" and not any(out.iterdir())
        )  # at most the held, empty dir
    assert not lock_path(out).exists()  # released with the claim: no lock file left beside the output


def _limited(limit_bytes: int):
    def setup() -> None:  # runs in the child before exec: writes past the limit fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return setup


# calibrate times the host for a minute: its figures are replaced by fixed ones, its writing is what is tried.
_CALIBRATE = """
import sys
from hotline.costmodel import calibrate
hw = {"format": "hotline-hardware", "name": "x", "calibration_s": 1.0, "host": {}, "device": {}, "pad": "x" * 999}
calibrate.calibrate = lambda *a, **k: hw
from hotline.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_full_disk_leaves_the_users_bytes_and_one_line(env, tmp_path, case):
    out = tmp_path / case.name
    if (
        case.kind == "file"
    ):  # replacing it is allowed (--force): the failed write must still leave it as it was
        out.write_bytes(USER)
    before = _tree(tmp_path)
    argv = [*_argv(case, env, out, tmp_path), "--force"]
    python = (
        [sys.executable, "-c", _CALIBRATE]
        if case.command == "calibrate"
        else [sys.executable, "-m", "hotline"]
    )
    r = subprocess.run([*python, *argv], preexec_fn=_limited(case.full_disk), capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    lines = [line for line in r.stderr.splitlines() if line.startswith("hotline ")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"hotline {case.command}: error: [Errno 27] File too large"), lines[0]
    assert "cannot write " in lines[0] and str(out) in lines[0], lines[0]
    after = _tree(tmp_path)
    if case.kind == "file":
        assert after == before  # the user's file, and no partial or temporary file beside it
    else:  # a directory output: no dataset and no partial file; checkpoints: none of the failed step
        assert not any(p.name.startswith(".") for p in tmp_path.rglob("*")), after
        assert not any(name.endswith((".npy", ".pt")) for name in after), after


# ---------------------------------------------------------------------------- the policy's own API
def test_the_policy_names_every_refusal(tmp_path):
    user = tmp_path / "user.txt"
    user.write_bytes(USER)
    with pytest.raises(OutputError, match="exists: pass --force"):
        claim([Output("--x", user)])
    with claim([Output("--x", user)], force=True) as c:  # --force: allowed, written at the target
        assert c.path("--x") == user.resolve()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="is a FIFO"):
        claim([Output("--x", fifo)], force=True)
    with pytest.raises(OutputError, match="is a character device"):
        claim([Output("--x", "/dev/null")], force=True)
    with pytest.raises(OutputError, match="is a directory: give a file name"):
        claim([Output("--x", tmp_path)], force=True)
    with pytest.raises(OutputError, match="user.txt is a file, not a directory"):
        claim([Output("--x", user / "below" / "f")])
    deep = tmp_path / "a" / "b" / "f.json"
    with claim([Output("--x", deep)]):
        assert deep.parent.is_dir()  # parents made where nothing was in the way
    assert user.read_bytes() == USER and not fifo.is_file()
    with pytest.raises(ValueError, match="kind"):
        Output("--x", user, kind="pipe")
    shutil.rmtree(tmp_path / "a")


# ------------------------------------------------------------------------------------------ library writers
def _library_writers(env):
    """Every library function that writes a user-named file: name -> (write(out, force), suffix, own input).
    ``own input``: an input of the call given as its output (refused even with force=True), or None."""
    import numpy as np

    from hotline.datasets.criteo_raw import write_raw_tsv
    from hotline.datasets.format import Dataset
    from hotline.placement import Placement
    from hotline.torchrec_bridge.plan_files import save_hot_rows
    from hotline.training.export import export_torchrec_dlrm
    from hotline.training.inference import trainer_from_checkpoint, write_predictions
    from hotline.training.report import write_report

    placement = Placement.load(env["placement"])
    names = [f"t{t}" for t in range(placement.num_tables)]
    trainer = trainer_from_checkpoint(Dataset(env["ds"]), env["ckpt"], progress=False)
    zeros = np.zeros
    return {
        "Placement.save": (lambda out, force: placement.save(out, force=force), ".npz", None),
        "save_hot_rows": (lambda out, force: save_hot_rows(out, placement, names, force=force), ".npz", None),
        "write_predictions": (
            lambda out, force: write_predictions(out, zeros(4), zeros(4), force=force),
            ".npy",
            None,
        ),
        "write_report": (
            lambda out, force: write_report([env["metrics"]], out, force=force),
            ".png",
            "metrics",
        ),
        "export_torchrec_dlrm": (
            lambda out, force: export_torchrec_dlrm(env["ckpt"], out, force=force),
            ".pt",
            "ckpt",
        ),
        "dump_params": (lambda out, force: trainer.dump_params(out, force=force), ".npz", "ds_labels"),
        "write_raw_tsv": (
            lambda out, force: write_raw_tsv(
                out, zeros(1, int), zeros((1, 13), int), zeros((1, 26), int), force=force
            ),  # fmt: skip
            ".tsv",
            None,
        ),
    }


LIBRARY_WRITERS = ["Placement.save", "save_hot_rows", "write_predictions", "write_report",
                   "export_torchrec_dlrm", "dump_params", "write_raw_tsv"]  # fmt: skip


@pytest.fixture(scope="module")
def writers(env):
    return _library_writers(env)


@pytest.mark.parametrize("name", LIBRARY_WRITERS)
def test_library_writers_refuse_a_user_file_unless_forced(env, writers, tmp_path, name):
    """The functions a notebook calls judge their output as the commands do: an existing file or a link to
    one is refused (bytes unchanged, nothing else made) unless force=True, which then replaces it."""
    write, suffix, _ = writers[name]
    out = tmp_path / f"mine{suffix}"
    out.write_bytes(USER)
    target = tmp_path / "notes.txt"
    target.write_bytes(USER)
    link = tmp_path / f"link{suffix}"
    link.symlink_to(target)
    before = _tree(tmp_path)
    with pytest.raises(OutputError, match=f"{name}.* exists: pass force=True to replace it"):
        write(out, False)
    with pytest.raises(OutputError, match="a link to"):
        write(link, False)
    assert _tree(tmp_path) == before
    write(out, True)
    write(link, True)
    assert out.read_bytes() != USER and target.read_bytes() != USER  # replaced: the link's target written
    assert link.is_symlink()
    fresh = tmp_path / "new" / f"made{suffix}"
    write(fresh, False)  # a new path: written, parents made
    assert fresh.stat().st_size > 0


@pytest.mark.parametrize("name", [n for n in LIBRARY_WRITERS if n in ("write_report", "export_torchrec_dlrm",
                                                                      "dump_params")])  # fmt: skip
def test_library_writers_never_write_onto_their_own_input(env, writers, name, tmp_path):
    write, _, own = writers[name]
    sources = {"metrics": env["metrics"], "ckpt": env["ckpt"], "ds_labels": env["ds"] / "train_labels.npy"}
    source = sources[own]
    if name == "write_report":  # a metrics file with an image's name, read and given as the image
        from hotline.training.report import write_report

        source = shutil.copy(source, tmp_path / "run.png")
        write = lambda out, force: write_report([out], out, force=force)  # noqa: E731
    before = _sha(source)
    with pytest.raises(OutputError, match="refused even with --force|would delete it"):
        write(source, True)
    assert _sha(source) == before


def test_library_writers_refuse_a_path_another_run_holds(env, writers, tmp_path):
    """A file that a live command (another process) has claimed is refused even with force=True."""
    out = tmp_path / "held.npz"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom hotline.outputs import Output, "
         "claim\nc = claim([Output('--out', Path(sys.argv[1]))])\nprint('held', flush=True)\ntime.sleep(600)",
         str(out)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputError, match="being written by another Hotline run"):
            writers["Placement.save"][0](out, True)
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists()


def test_export_plan_refuses_its_file_and_its_side_car_before_any_work(tmp_path):
    """export_plan judges plan.json and its hot-rows side-car before it reads its arguments (none given here)."""
    from hotline.torchrec_bridge.plan_files import export_plan, hot_rows_path

    plan = tmp_path / "plan.json"
    plan.write_bytes(USER)
    with pytest.raises(OutputError, match="export_plan path .* exists: pass force=True"):
        export_plan(plan, None, None, None)
    plan.unlink()
    hot_rows_path(plan).write_bytes(USER)
    with pytest.raises(OutputError, match="hot-rows file .* exists: pass force=True"):
        export_plan(plan, None, None, None)
    assert hot_rows_path(plan).read_bytes() == USER and not plan.exists()


def test_dataset_writers_keep_an_existing_dataset_unless_overwrite(env, tmp_path):
    """generate / preprocess replace an existing dataset only with overwrite=True (the CLI's --force), and
    generate's raw_tsv is a user's file like any other."""
    from hotline.datasets.criteo import preprocess

    ds = generate(tmp_path / "ds", 300, seed=5, table_sizes=[20] * 26, progress=False)
    before = _tree(ds)
    with pytest.raises(ValueError, match="pass --force|already holds a Hotline dataset"):
        generate(ds, 300, seed=6, table_sizes=[20] * 26, progress=False)
    with pytest.raises(ValueError, match="already holds a Hotline dataset|pass --force"):
        preprocess(env["raw"], ds, progress=False)
    assert _tree(ds) == before
    raw = tmp_path / "mine.tsv"
    raw.write_bytes(USER)
    with pytest.raises(OutputError, match="raw_tsv .* exists: pass force=True"):
        generate(tmp_path / "new", 300, seed=6, table_sizes=[20] * 26, raw_tsv=raw, progress=False)
    assert raw.read_bytes() == USER and not (tmp_path / "new").exists()
    link = tmp_path / "link.tsv"
    link.symlink_to(raw)
    generate(
        tmp_path / "new", 300, seed=6, table_sizes=[20] * 26, raw_tsv=link, progress=False, overwrite=True
    )
    assert link.is_symlink() and raw.read_bytes() != USER  # the link's target written, as every writer does
    generate(ds, 300, seed=6, table_sizes=[20] * 26, progress=False, overwrite=True)
    assert _tree(ds) != before
