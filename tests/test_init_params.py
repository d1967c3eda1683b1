"""``hotline train --init-params FILE.npz`` and ``--dump-init FILE.npz``: start from given parameters, write the
parameters before the first step (names and layout as ``--dump-params``), in every mode."""

import numpy as np
import pytest
from reference import random_params

from hotline.cli import main
from hotline.datasets.synthetic import generate

TABLES = [30, 200, 12, 500]
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
COMMON = [
    *ARCH,
    "--mini-batch-size",
    "32",
    "--no-progress",
    "--eval-max-samples",
    "64",
    "--learning-rate",
    "0.05",
]
MODES = {
    "device": ["--mode", "device"],
    "hybrid": ["--mode", "hybrid"],
    "hotline": ["--mode", "hotline", "--hbm-budget", "1KiB"],
    "hotline-split": ["--mode", "hotline", "--hbm-budget", "1KiB", "--lookahead", "0"],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("init")
    ds = generate(root / "ds", 400, seed=5, table_sizes=TABLES, zipf=1.2, progress=False)
    init = root / "init.npz"
    np.savez(init, **random_params(TABLES, 8, [13, 16, 8], [16, 1], "dot", seed=1))
    return str(ds), init


def _load(path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _train(data, tmp_path, name, *flags) -> tuple[dict, dict]:
    ds, _ = data
    init, end = tmp_path / f"{name}-init.npz", tmp_path / f"{name}-end.npz"
    argv = ["train", ds, *COMMON, *flags, "--dump-init", str(init), "--dump-params", str(end)]
    assert main(argv) == 0
    return _load(init), _load(end)


@pytest.mark.parametrize("mode", list(MODES))
def test_init_params_round_trip_in_every_mode(data, tmp_path, mode, capsys):
    """--dump-init after --init-params is the given file, bit for bit; training moves every table; a run
    started from a --dump-init file ends where the run that wrote it ended."""
    _, given = data
    first, end = _train(data, tmp_path, "a", *MODES[mode], "--num-batches", "5", "--init-params", str(given))
    assert first.keys() == _load(given).keys()
    for k, v in _load(given).items():
        assert np.array_equal(first[k], v), k
    assert not np.array_equal(end["embedding.table_1"], first["embedding.table_1"])
    # the default start (no --init-params), written, then fed back: the same run bit for bit
    own, own_end = _train(data, tmp_path, "b", *MODES[mode], "--num-batches", "5")
    assert not np.array_equal(own["embedding.table_0"], first["embedding.table_0"])
    again, again_end = _train(
        data, tmp_path, "c", *MODES[mode], "--num-batches", "5", "--init-params", str(tmp_path / "b-init.npz")
    )
    for k in own:
        assert np.array_equal(again[k], own[k]) and np.array_equal(again_end[k], own_end[k]), k
    capsys.readouterr()


def test_dump_init_is_the_start_of_device_mode(data, tmp_path, capsys):
    """The same start in every mode: --dump-init of hotline equals device mode's."""
    dev, _ = _train(data, tmp_path, "d", *MODES["device"], "--num-batches", "1")
    hot, _ = _train(data, tmp_path, "h", *MODES["hotline"], "--num-batches", "1")
    assert dev.keys() == hot.keys() and {"embedding.table_3", "model.over_arch.mlp.0.weight"} <= dev.keys()
    for k in dev:
        assert np.array_equal(dev[k], hot[k]), k
    capsys.readouterr()


def _error(data, tmp_path, capsys, arrays=None, raw: bytes | None = None) -> str:
    ds, _ = data
    bad = tmp_path / "bad.npz"
    if raw is not None:
        bad.write_bytes(raw)
    else:
        np.savez(bad, **arrays)
    capsys.readouterr()
    out = tmp_path / "never.npz"
    assert (
        main(["train", ds, *COMMON, "--num-batches", "2", "--init-params", str(bad), "--dump-init", str(out)])
        == 2
    )
    assert not out.exists()
    return capsys.readouterr().err


def test_init_params_mismatch_names_the_tensor(data, tmp_path, capsys):
    good = _load(data[1])
    missing = {k: v for k, v in good.items() if k != "embedding.table_2"}
    assert "embedding.table_2" in _error(data, tmp_path, capsys, missing)
    extra = {**good, "model.extra": np.zeros(3, np.float32)}
    assert "model.extra" in _error(data, tmp_path, capsys, extra)
    shape = {**good, "embedding.table_1": np.zeros((199, 8), np.float32)}
    err = _error(data, tmp_path, capsys, shape)
    assert "embedding.table_1" in err and "199" in err and "200" in err
    w = "model.dense_arch.mlp.0.weight"
    assert w in _error(data, tmp_path, capsys, {**good, w: good[w][:, :5]})
    nan = {**good, w: np.full_like(good[w], np.nan)}
    err = _error(data, tmp_path, capsys, nan)
    assert w in err and "non-finite" in err
    assert "not a readable parameter .npz" in _error(data, tmp_path, capsys, raw=b"not a zip file")
