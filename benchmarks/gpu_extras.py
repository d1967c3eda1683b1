"""What gpu_bench.py needs beside the sweep: versions, a probe of zero-copy options, the plain-PyTorch
baseline users pick instead (``nn.EmbeddingBag(sparse=True)`` in HBM), and how far a run is from device mode."""

from __future__ import annotations

import importlib
import os
import subprocess
import time

import numpy as np


def versions() -> dict:
    """GPU, torch, CUDA, driver and Numba (with the threading layer parallel kernels run on)."""
    import numba
    import torch

    import hotline
    import hotline.kernels
    from hotline.kernels.probe import threading_layer

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "numba": numba.__version__,
           "numba_threading_layer": threading_layer(), "numpy": np.__version__,
           # which checkout ran (a plain checkout on the GPU image: its own package and kernels)
           "hotline_path": os.path.dirname(hotline.__file__),
           "kernels_path": os.path.dirname(hotline.kernels.__file__)}  # fmt: skip
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        try:
            q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            out["driver"] = subprocess.run(q, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out["driver"] = None
    return out


def zero_copy_probe() -> dict:
    """What this machine offers for reading pinned host memory from the device directly (the next step)."""
    import torch

    out: dict = {}
    if torch.cuda.is_available():
        t = torch.ones(1 << 20)
        cudart = torch.cuda.cudart()
        try:
            torch.cuda.check_error(cudart.cudaHostRegister(t.data_ptr(), t.numel() * 4, 2))  # mapped
            out["cudaHostRegister_mapped"] = bool(t.is_pinned())
            out["cudaHostGetDevicePointer"] = hasattr(cudart, "cudaHostGetDevicePointer")
            torch.cuda.check_error(cudart.cudaHostUnregister(t.data_ptr()))
        except Exception as e:  # noqa: BLE001 - a probe: record what failed
            from hotline.tiers.pinning import clear_cuda_error

            # the refusal stays CUDA's last error, which the next unrelated kernel would raise: cleared here
            out["cudaHostRegister_mapped"] = f"failed: {e}"
            out["cuda_error_cleared"] = clear_cuda_error()
    for name in ("numba.cuda", "triton", "cupy"):
        try:
            m = importlib.import_module(name)
            version = getattr(m, "__version__", None) or getattr(
                importlib.import_module(name.split(".")[0]), "__version__", "?"
            )
            usable = bool(m.is_available()) if name == "numba.cuda" else True
            out[name] = {"version": version, "usable": usable}
        except Exception as e:  # noqa: BLE001
            out[name] = {"missing": str(e).splitlines()[0][:120]}
    return out


def run_embedding_bag(dataset, args, cfg, device: str, probe=None) -> dict:
    """A plain PyTorch DLRM: one ``nn.EmbeddingBag(sparse=True)`` per table in device memory, torch's SGD on
    dense and sparse gradients; the same initial weights, dense model and batches as the Hotline modes.

    Fair to it: the initial tables are the benchmark's one computed set (not computed again), each table is
    copied straight to the device (no second host copy of all of them), and a step's ids, dense inputs and
    labels go in two asynchronous copies from pinned packs (no synchronising pageable copies)."""
    import gc

    import torch

    from hotline.models.dlrm import DLRM
    from hotline.table_layout import TableLayout
    from hotline.tiers.base import initial_tables, loss_and_backward
    from hotline.tiers.packing import PackRing
    from hotline.training.config import TrainConfig

    config = TrainConfig(**{**cfg, "mini_batch_size": args.batch}, optimizer="sgd", learning_rate=0.01,
                         progress=False, device=device)  # fmt: skip
    cuda = device == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # its peaks are its own, not the cache of the runs before it
        torch.cuda.reset_peak_memory_stats()
    model = DLRM(config.model_config(dataset.table_sizes), seed=config.seed).to(device)
    layout = TableLayout(dataset.table_sizes)
    tables = layout.split(initial_tables(layout, args.dim, config.seed, copy=False))
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag.from_pretrained(
            torch.from_numpy(w).to(device, copy=True), freeze=False, mode="sum", sparse=True
        )
        for w in tables
    )
    del tables
    opt = torch.optim.SGD([*model.parameters(), *bags.parameters()], lr=config.learning_rate)
    packs = PackRing(device)
    batches = dataset.train.batches(args.batch, num_batches=args.steps + args.warmup_steps)
    samples, t0 = 0, None
    for i, b in enumerate(batches):
        if i == args.warmup_steps:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x = packs.copy({"ids": np.ascontiguousarray(b.sparse, dtype=np.int64), "dense": b.dense,
                        "labels": b.labels})  # fmt: skip
        opt.zero_grad(set_to_none=True)
        pooled = torch.stack([bags[t](x["ids"][:, t, :]) for t in range(len(bags))], dim=1)
        loss_and_backward(model, x["dense"], pooled, x["labels"], len(b))
        opt.step()
        if i >= args.warmup_steps:
            samples += len(b)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    rec = {
        "mode": "torch_embeddingbag",
        "steps": args.steps,
        "samples_per_s": samples / elapsed,
        "step_ms": 1e3 * elapsed / args.steps,
    }
    if cuda:
        rec.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30)  # fmt: skip
    if probe is not None:
        with torch.no_grad():
            ids = torch.from_numpy(probe.sparse.astype(np.int64)).to(device)
            pooled = torch.stack([bags[t](ids[:, t, :]) for t in range(len(bags))], dim=1).cpu()
        rec["_probe"] = {
            "pooled": pooled,
            "dense": {k: v.detach().cpu().clone() for k, v in model.named_parameters()},
        }
    return rec


def max_rel_diff(ref: dict, got: dict) -> dict:
    """The largest difference from the reference run, relative to each tensor's scale: probe rows, dense."""

    def rel(a, b):
        return float((a - b).abs().max() / max(float(a.abs().max()), 1e-12))

    dense = max((rel(ref["dense"][k], got["dense"][k]) for k in ref["dense"]), default=0.0)
    return {"diff_probe_rows": rel(ref["pooled"], got["pooled"]), "diff_dense": dense}
