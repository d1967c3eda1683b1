"""Evaluation on 2 gloo ranks equals one process: evaluate, predict and the end-of-run metrics, every mode.

Training on N ranks is compared with one process in tests/test_distributed.py; this file compares what is
scored after it. Each rank scores its shard of every evaluation batch, reading its cold rows back from the
sharded cold store (hotline/tiers/sharded_store.py, ``read``): a row read back in the wrong order leaves
training identical and changes only the scores, so the scores are compared sample by sample. The parameters
of 2 ranks differ from one process by reassociation of the dense all-reduce (within 1e-5 of each tensor's
scale, tests/test_distributed.py); the scores are compared within ``PROB_ATOL`` and the metrics within
``METRIC_ATOL`` (measured drift: below 1e-6 on every case here).
"""

import json

import numpy as np
import pytest
from ranks import spawn
from test_distributed import ARCH, BATCH, TABLES, _placement, assert_close

from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate

STEPS = 24
PROB_ATOL = 1e-5
METRIC_ATOL = 1e-5
# (name, mode, optimizer, extra config): re-placement every 8 steps moves rows between the tiers mid-run.
CASES = [
    ("device", "device", "sgd", {}),
    ("hybrid", "hybrid", "sgd", {}),
    ("hotline", "hotline", "rowwise-adagrad", {}),
    ("hotline-k2", "hotline", "sgd", {"lookahead": 2}),
    ("hotline-replace", "hotline", "rowwise-adagrad", {"replace_every": 8}),
]


def _config(mode, optimizer, placement, **kw):
    return TrainConfig(
        mode=mode,
        optimizer=optimizer,
        learning_rate=0.05,
        mini_batch_size=BATCH,
        num_batches=STEPS,
        progress=False,
        placement_path=placement if mode != "device" else None,
        lookahead=kw.pop("lookahead", 0),
        print_freq=STEPS,
        test_freq=12,  # one validation in the middle of the run, one at its end
        eval_batch_size=101,  # uneven shards (50 + 51) and a short last batch
        eval_max_samples=0,
        **ARCH,
        **kw,
    )


def fit_and_score(comm, jobs) -> None:
    """Spawn target (and the one-process reference with ``comm`` None): fit, then predict the whole test
    split; rank 0 writes the summary, the mid-run evaluations, the scores and the parameters to ``out``."""
    for config, dataset, out in jobs:
        trainer = Trainer(config, dataset, comm) if comm is not None else Trainer(config, dataset)
        try:
            summary = trainer.fit()
            probs, labels = trainer.predict(trainer.dataset.split("test"))
            evals = [r for r in trainer.history if r.get("kind") == "eval"]
            arrays = trainer.named_arrays()
            if comm is None or comm.rank == 0:
                record = json.dumps({"summary": summary, "evals": evals, "val": trainer.evaluate("val")})
                np.savez(out, probs=probs, labels=labels, record=np.asarray(record), **arrays)
            elif comm is not None:
                trainer.evaluate("val")  # a collective: every rank takes part
        finally:
            trainer.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalranks")
    ds = Dataset(generate(root / "ds", BATCH * STEPS * 7 // 6 + 900, seed=5, table_sizes=TABLES, zipf=1.3,
                          progress=False))  # fmt: skip
    place = _placement(ds, root / "p.npz")
    jobs = {name: (_config(mode, opt, place, **dict(kw)), str(ds.path)) for name, mode, opt, kw in CASES}
    two = [(cfg, path, str(root / f"{name}-2.npz")) for name, (cfg, path) in jobs.items()]
    one = [(cfg, path, str(root / f"{name}-1.npz")) for name, (cfg, path) in jobs.items()]
    spawn(2, fit_and_score, two)
    fit_and_score(None, one)
    load = lambda p: dict(np.load(p))  # noqa: E731
    return {name: (load(o[2]), load(t[2])) for name, o, t in zip(jobs, one, two)}


def _metrics(record: dict) -> dict:
    """Every scored figure of a run: the summary's val_/test_ metrics, each mid-run evaluation, evaluate."""
    s = record["summary"]
    out = {k: s[k] for k in s if k.startswith(("val_", "test_"))}
    for e in record["evals"]:
        out.update({f"eval@{e['step']}_{k}": v for k, v in e.items() if k not in ("kind", "step")})
    out.update({f"evaluate_{k}": v for k, v in record["val"].items()})
    return out


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_two_ranks_score_as_one_process(runs, case):
    one, two = runs[case]
    # training agrees (as tests/test_distributed.py asserts): what follows is the evaluation alone
    assert_close({k: v for k, v in one.items() if k.startswith(("model.", "embedding."))}, two)
    np.testing.assert_array_equal(two["labels"], one["labels"])
    assert one["probs"].size == len(one["labels"]) > 0
    np.testing.assert_allclose(two["probs"], one["probs"], rtol=0, atol=PROB_ATOL)
    m1, m2 = (_metrics(json.loads(str(r["record"]))) for r in (one, two))
    assert m1.keys() == m2.keys() and any(k.startswith("eval@12_") for k in m1)
    for k, v in m1.items():
        if k.endswith("samples"):
            assert m2[k] == v, k
        else:
            assert abs(m2[k] - v) <= METRIC_ATOL, f"{k}: 2 ranks {m2[k]!r}, one process {v!r}"
