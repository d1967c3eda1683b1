"""The distribution as a user gets it: the wheel builds, installs into a fresh virtual environment under its
own name (``hotline-dlrm``), imports ``hotline.kernels`` from outside the source tree and trains.

torch and numba come from the interpreter running the tests (the wheel goes in with ``--no-deps``), so nothing
is downloaded: from the system (``--system-site-packages``) and, when the tests themselves run inside a virtual
environment, from that environment's site-packages too (a new venv's "system" is the base interpreter, which
lacks them). About 30-60 s on 2 busy cores (wheel build, venv, one Numba compile of the kernels)."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST_NAME = "hotline-dlrm"


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    )
    return proc


def _copy_source(dest: Path) -> None:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout.decode().split("\0")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist, say): everything
        shutil.copytree(
            ROOT, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".venv")
        )
        return
    for name in filter(None, listed):
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / name)


def _see_the_running_packages(py: Path) -> None:
    """Lets the venv of ``py`` import what this interpreter imports (torch, numba), after its own packages.

    Plain directory lines in a ``.pth`` file: the directories go on ``sys.path`` after the venv's own
    site-packages, and the ``.pth`` files inside them are not run, so an editable install of this checkout in
    the running environment cannot shadow the wheel."""
    own = subprocess.run(
        [str(py), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    running = [d for d in site.getsitepackages() if Path(d).is_dir()]
    (Path(own) / "zz-running-interpreter.pth").write_text("".join(f"{d}\n" for d in running))


def test_wheel_installs_and_trains_in_a_fresh_venv(tmp_path):
    pytest.importorskip("setuptools")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # A copy of the source (what git would commit: tracked and not-ignored files), so that the build leaves
    # no build/ or .egg-info in the checkout and a developer's datasets or venvs do not travel.
    src = tmp_path / "src"
    _copy_source(src)
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", ".", "-w", str(wheels)],
        src,
        env,
    )
    (wheel,) = wheels.glob("*.whl")
    assert wheel.name.startswith("hotline_dlrm-"), wheel.name

    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    py = env_dir / "bin" / "python"
    _see_the_running_packages(py)
    _run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        tmp_path,
        env,
    )

    work = tmp_path / "work"
    work.mkdir()
    probe = (
        "import importlib.metadata as m, json, hotline, hotline.kernels, hotline.kernels.dispatch;"
        f"print(json.dumps([hotline.__file__, hotline.kernels.__file__, m.version({DIST_NAME!r})]))"
    )
    files = json.loads(_run([str(py), "-c", probe], work, env).stdout)
    site = str(env_dir.resolve())
    assert all(str(Path(f).resolve()).startswith(site) for f in files[:2]), (
        files
    )  # the wheel's, not the checkout's
    assert files[2] == "0.1.0"

    hotline_cmd = env_dir / "bin" / "hotline"
    assert hotline_cmd.is_file()
    _run(
        [str(hotline_cmd), "data", "synthetic", "--out", "ds", "--rows", "3000", "--table-sizes", "50,20,100",
         "--seed", "1"],
        work,
        env,
    )  # fmt: skip
    out = _run(
        [str(hotline_cmd), "train", "ds", "--num-batches", "2", "--mini-batch-size", "64", "--no-progress",
         "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1",
         "--eval-max-samples", "200"],
        work,
        env,
    ).stdout  # fmt: skip
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and 0.0 <= summary["val_auc"] <= 1.0
