"""On N ranks the placement is profiled once, by rank 0, and sent whole to the others
(:func:`hotline.training.placing.placement_for`): one rank reads the sample, and every rank ends with the
placement, the disk file's order and the trained rows it had when each rank profiled for itself."""

import json
from pathlib import Path

import numpy as np
import pytest
from ranks import spawn
from test_auto_disk import CPU_DISK
from test_distributed import ARCH, BATCH, TABLES

from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.training import placing
from hotline.training.checkpoint_rows import disk_rows
from hotline.training.placing import placement_for

STEPS = 6
BUDGET = 1 << 10  # some counted rows stay cold: they lead the disk file's order


def _config(cold_dir, **kw) -> TrainConfig:
    return TrainConfig(mode=kw.pop("mode", "hotline"), optimizer="rowwise-adagrad", learning_rate=0.05,
                       mini_batch_size=BATCH, num_batches=STEPS, progress=False, quiet=True, lookahead=1,
                       cold_store="disk", cold_dir=str(cold_dir), **ARCH, **kw)  # fmt: skip


def _no_profile(*args, **kw):
    raise ValueError("the sample cannot be read (planted)")


def _rank_job(comm, jobs, out) -> None:
    """Spawn target: each ``(name, config, dataset)`` built and trained on this rank, the sample passes of the
    real Profiler counted; writes the passes, the hot rows, its shard's file order and (rank 0) every row."""
    from hotline.profiling.profiler import Profiler

    passes = []
    for kind in ("profile", "count"):  # the two passes that read the sample
        real = getattr(Profiler, kind)

        def counted(self, dataset, _real=real, _kind=kind):
            passes.append(_kind)
            return _real(self, dataset)

        setattr(Profiler, kind, counted)
    for name, config, dataset in jobs:
        passes.clear()
        if name == "fails":  # rank 0's profile fails: every rank says why, none waits for its placement
            with pytest.MonkeyPatch.context() as mp:
                if comm.rank == 0:
                    mp.setattr(placing, "profile_for", _no_profile)
                try:
                    Trainer(config, dataset, comm).close()
                    said = "no error"
                except ValueError as e:
                    said = str(e)
            Path(out, f"fails-{comm.rank}.txt").write_text(said)
            continue
        trainer = Trainer(config, dataset, comm, hardware=CPU_DISK if config.mode == "auto" else None)
        try:
            seen, mode = list(passes), trainer.config.mode
            hot = np.asarray(trainer.mode.placement.fused_hot_ids())
            order = np.array(disk_rows(trainer.mode).file.order)
            for _ in trainer.progress(trainer.batches()):
                pass
            arrays = trainer.named_arrays()
        finally:
            trainer.close()
        Path(out, f"{name}-{comm.rank}.json").write_text(json.dumps({"passes": seen, "mode": mode}))
        np.savez(Path(out, f"{name}-{comm.rank}.npz"), hot=hot, order=order,
                 **(arrays if comm.rank == 0 else {}))  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two ranks: the placement profiled under a budget, the same placement from a file (what each rank
    profiled for itself before), and ``--mode auto`` (rank 0's profile priced the choice)."""
    root = tmp_path_factory.mktemp("placeranks")
    ds = Dataset(generate(root / "d", BATCH * STEPS + 400, seed=5, table_sizes=TABLES, zipf=1.3,
                          progress=False))  # fmt: skip
    for d in ("cold-p", "cold-f", "cold-a", "cold-x"):
        (root / d).mkdir()
    profiled = _config(root / "cold-p", hbm_budget=BUDGET)
    own = placement_for(profiled, ds, progress=False)  # one process's profile: what every rank made
    assert own.num_hot > 0
    own.save(root / "own.npz")
    jobs = [("profiled", profiled, str(ds.path)),
            ("file", _config(root / "cold-f", placement_path=str(root / "own.npz")), str(ds.path)),
            ("auto", _config(root / "cold-a", mode="auto"), str(ds.path)),
            ("fails", _config(root / "cold-x", hbm_budget=BUDGET), str(ds.path))]  # fmt: skip
    spawn(2, _rank_job, jobs, str(root))

    def read(name, r):
        return json.loads((root / f"{name}-{r}.json").read_text()), dict(np.load(root / f"{name}-{r}.npz"))

    got = {(name, r): read(name, r) for name in ("profiled", "file", "auto") for r in range(2)}
    got["fails"] = [(root / f"fails-{r}.txt").read_text() for r in range(2)]
    return got, own


def test_one_rank_profiles_and_the_other_receives_the_placement(runs):
    got, own = runs
    assert got[("profiled", 0)][0]["passes"] == ["profile"]
    assert got[("profiled", 1)][0]["passes"] == []  # no profile, and no counting pass for the file order
    for r in range(2):
        assert np.array_equal(got[("profiled", r)][1]["hot"], own.fused_hot_ids()), r


def test_the_received_placement_trains_the_rows_of_an_own_profile(runs):
    """The same file order on each rank and, bit for bit, the same trained rows and dense weights as the run
    whose ranks each held the placement of their own profile."""
    got, _ = runs
    for r in range(2):
        assert np.array_equal(got[("profiled", r)][1]["order"], got[("file", r)][1]["order"]), r
    mine, theirs = got[("profiled", 0)][1], got[("file", 0)][1]
    names = [k for k in theirs if k not in ("hot", "order")]
    assert names and sorted(names) == sorted(k for k in mine if k not in ("hot", "order"))
    for k in names:
        assert np.array_equal(mine[k], theirs[k]), k


def test_auto_profiles_once_on_two_ranks(runs):
    """``--mode auto`` (hotline or hybrid on the disk store): rank 0's choice profiled the sample, and its
    placement and counted rows come from that profile; the other rank reads the sample for nothing."""
    got, _ = runs
    assert got[("auto", 0)][0]["mode"] == got[("auto", 1)][0]["mode"] in ("hotline", "hybrid")
    assert got[("auto", 0)][0]["passes"] == ["profile"]
    assert got[("auto", 1)][0]["passes"] == []
    assert np.array_equal(got[("auto", 0)][1]["hot"], got[("auto", 1)][1]["hot"])


def test_a_failed_profile_fails_every_rank_with_its_reason(runs):
    got, _ = runs
    assert got["fails"] == ["the sample cannot be read (planted)"] * 2
