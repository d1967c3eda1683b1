"""The cost model's prediction for one GPU (default H200) with Kaggle-sized tables: the figures a GPU run checks.

``--workload mlperf-dcnv2`` predicts MLPerf DLRM-DCNv2 instead, as ``gpu_bench.py``'s dcnv2 part runs it
(dim 128, bottom 13-512-256-128, DCN-v2 3 x rank 512, top 1024-1024-512-256-1, its 26 tables capped at 10M rows
with its multi-hot bags, 500k samples): the cross layers priced as GEMMs at the dense rate.

Data: synthetic, the 26 Criteo Kaggle tables at full size (33.8 M rows), Zipf ``--zipf`` ids, ``--rows``
samples. Half the training split is profiled, the other half held out; the model is given the held-out
figures at HBM budgets of ``--budgets`` (shares of the embedding bytes: dim 64, SGD), batch 4096, the
gpu_bench model (bottom 13-512-256-64, top 512-256-1) and look-ahead worker threads 4, on the shipped GPU
table's ``--gpu`` with its typical host (or ``--host`` from ``hotline calibrate`` on the GPU's host).

Run: ``python benchmarks/predict_h200.py --json h200_prediction.json`` (a few minutes: most of it generating).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import mlperf  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    import hotline
    from hotline import costmodel
    from hotline.datasets.synthetic import generate

    p = common.parser(__doc__)
    p.add_argument("--gpu", default="H200")
    p.add_argument("--host", default=None, help="the GPU host's `hotline calibrate` JSON")
    p.add_argument("--workload", choices=["kaggle", mlperf.NAME], default="kaggle",
                   help="kaggle: the gpu_bench model on Kaggle-sized tables; mlperf-dcnv2: MLPerf DLRM-DCNv2 (dim 128, "
                        "its MLPs and DCN-v2 cross layers) on its 26 tables with multi-hot bags, as gpu_bench's "
                        "dcnv2 part runs it")  # fmt: skip
    p.add_argument(
        "--rows", type=int, default=0, help="synthetic samples generated (0: 4M; 500k for mlperf-dcnv2)"
    )
    p.add_argument("--max-rows-per-table", type=int, default=0,
                   help="cap table sizes (0: none for kaggle; 10M for mlperf-dcnv2, as gpu_bench)")  # fmt: skip
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--budgets", type=lambda v: [float(x) for x in v.split(",")], default=[0.01, 0.05, 0.10])
    p.add_argument("--worker-threads", type=int, default=4)
    p.add_argument("--data", default=None, help="an existing dataset directory instead")
    args = p.parse_args(argv)
    shape: dict = {}
    if args.workload == mlperf.NAME:  # the model and tables gpu_bench's dcnv2 part runs
        model = {k: v for k, v in mlperf.config().items() if k != "mini_batch_size"}
        args.dim, shape = model["embedding_dim"], mlperf.data_options()
        args.rows = args.rows or 500_000
        args.max_rows_per_table = args.max_rows_per_table or 10_000_000
    else:
        model = {"embedding_dim": args.dim, "bottom_mlp": [13, 512, 256, args.dim], "top_mlp": [512, 256, 1]}
        args.rows = args.rows or 4_000_000
    if args.smoke:
        args.rows, args.max_rows_per_table = 20_000, 2000
    common.setup_threads(args.threads)
    hw = costmodel.load_hardware(args.gpu, args.host)
    with tempfile.TemporaryDirectory(prefix="predict_gpu_") as tmp:
        path = args.data or generate(
            Path(tmp) / args.workload, args.rows, seed=args.seed, zipf=args.zipf,
            max_rows_per_table=args.max_rows_per_table or None, progress=False, **shape,
        )  # fmt: skip
        prof = hotline.profile(path, sample_fraction=0.5, mini_batch_size=args.batch, embedding_dim=args.dim,
                               seed=args.seed, progress=False)  # fmt: skip
        w = costmodel.workload_for(prof, worker_threads=args.worker_threads, **costmodel.arch_of(model))
        table_bytes = sum(prof.table_sizes) * prof.bytes_per_row
        rows = []
        for share in args.budgets:
            budget = int(share * table_bytes)
            s = costmodel.Stats.from_profile(prof, budget)
            preds = costmodel.predict_all(w, s, hw)
            for m, pr in preds.items():
                rows.append(
                    {
                        "budget_share": share,
                        "budget_gib": budget / 2**30,
                        "hot_rows": prof.hot_rows_for(budget),
                        "heldout_coverage": s.hot_lookup_share,
                        "heldout_popular": s.popular_sample_share,
                        "cold_rows_per_batch": s.cold_rows_per_batch,
                        "mode": m,
                        "samples_per_s": pr.samples_per_s,
                        "vs_hybrid": pr.samples_per_s / preds["hybrid"].samples_per_s,
                        "bottleneck": pr.bottleneck,
                    }
                )
    common.print_table(
        rows,
        [
            ("budget_share", "budget", ".0%"),
            ("budget_gib", "GiB", ".2f"),
            ("hot_rows", "hot rows", ""),
            ("heldout_coverage", "held-out cov", ".3f"),
            ("heldout_popular", "popular", ".3f"),
            ("cold_rows_per_batch", "cold rows/batch", ".0f"),
            ("mode", "mode", ""),
            ("samples_per_s", "predicted samples/s", ".0f"),
            ("vs_hybrid", "vs hybrid", ".2f"),
            ("bottleneck", "bottleneck", ""),
        ],
        title=f"predicted on {hw['name']}: {args.workload} ({w.interaction} interaction), "
        f"{sum(prof.table_sizes):,} rows, dim {args.dim}, batch {args.batch}, "
        f"{prof.num_samples:,} samples profiled ({prof.num_accessed:,} rows seen: the most a budget makes hot), "
        f"{prof.heldout.num_samples:,} held out (zipf {args.zipf})",
    )
    payload = {
        "benchmark": "predict_h200",
        "workload": args.workload,
        "hardware": hw,
        "results": rows,
        "machine": common.machine_info(args.threads),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
