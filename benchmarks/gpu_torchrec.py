"""gpu_bench's torchrec stage: Hotline's torchrec collection against torchrec's EmbeddingBagCollection on the
device, side by side on the same batches (samples/s, the hot-lookup share, and the tables' drift after training).

:func:`torchrec_stage` returns a dict for gpu_bench's JSON; without torchrec (the GPU image ships torch, numba,
numpy and pandas only) it returns ``{"skipped": <the reason>}`` and runs nothing.
"""

from __future__ import annotations

import time


def torchrec_stage(device: str, steps: int = 50, batch: int = 4096, dim: int = 64, rows: int = 200_000,
                   tables: int = 8, seed: int = 0) -> dict:  # fmt: skip
    """Trains torchrec's DLRM over torchrec's EBC (dense SGD) and over Hotline's collection (a tenth of the rows
    hot, the most popular under a Zipf trace) for ``steps`` steps on ``device``; returns the figures."""
    try:
        import torchrec  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the stage cannot run here
        return {"skipped": f"torchrec is not importable: {type(e).__name__}: {e}"}
    import numpy as np
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.models.dlrm import DLRM

    from hotline.placement import Placement
    from hotline.torchrec_bridge import HotlineEmbeddingBagCollection, embedding_bag_configs, kjt_from_sparse

    dev = torch.device(device)
    sizes = [rows] * tables
    configs = embedding_bag_configs(sizes, dim)
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.05, size=(steps + 2, batch, tables, 1)) - 1, rows - 1)
    hot = [np.arange(rows // 10) for _ in sizes]  # zipf ids: the low ranks are the popular rows
    placement = Placement.from_hot_ids(sizes, hot, embedding_dim=dim)

    def dlrm(ebc):
        torch.manual_seed(seed)
        return DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[64, dim],
                    over_arch_layer_sizes=[64, 1], dense_device=dev)  # fmt: skip

    torch.manual_seed(seed)
    ref = dlrm(EmbeddingBagCollection(tables=configs, device=dev))
    ours_ebc = HotlineEmbeddingBagCollection(configs, placement, optimizer_type=torch.optim.SGD,
                                             optimizer_kwargs={"lr": 0.1}, device=dev, max_lookups=batch * tables)  # fmt: skip
    ours = dlrm(ours_ebc)
    ours.load_state_dict({k: v.cpu() for k, v in ref.state_dict().items()})
    feats = [c.feature_names[0] for c in configs]
    batches = [(torch.rand(batch, 13, device=dev), kjt_from_sparse(ranks[s], feats).to(dev),
                torch.from_numpy((rng.random(batch) < 0.3).astype(np.float32)).to(dev)) for s in range(steps + 2)]  # fmt: skip
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_dense = torch.optim.SGD([p for n, p in ours.named_parameters() if "embedding_bags" not in n], lr=0.1)
    out: dict = {
        "device": device,
        "steps": steps,
        "batch": batch,
        "dim": dim,
        "rows_per_table": rows,
        "tables": tables,
    }
    hot_lookups = lookups = 0
    for label, model, opts in (("torchrec_ebc_dense", ref, [opt_ref]), ("hotline_collection", ours, [opt_dense, ours_ebc.fused_optimizer])):  # fmt: skip
        for s, (dense, kjt, labels) in enumerate(batches):
            if s == 2:  # two warm-up steps
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).squeeze(1), labels)
            loss.backward()
            for o in opts:
                o.step()
                o.zero_grad()
            if model is ours and s >= 2:
                hot_lookups += ours_ebc.last_stats["hot_lookups"]
                lookups += ours_ebc.last_stats["lookups"]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        out[f"{label}_samples_per_s"] = steps * batch / (time.perf_counter() - t0)
    out["ratio_hotline_to_torchrec"] = (
        out["hotline_collection_samples_per_s"] / out["torchrec_ebc_dense_samples_per_s"]
    )
    out["hot_lookup_share"] = hot_lookups / max(1, lookups)
    got = ours_ebc.export_tables()
    drift = 0.0
    for name, bag in ref.sparse_arch.embedding_bag_collection.embedding_bags.items():
        want = bag.weight.detach().cpu().numpy()
        drift = max(drift, float(np.abs(got[name] - want).max() / max(np.abs(want).max(), 1e-30)))
    out["max_rel_table_drift"] = drift
    return out
