"""The torchrec bridge on CUDA: lookups that queue without a device sync, cold tables left pageable.

Skipped without CUDA or torchrec (the GPU image has no torchrec; on this project's CPU machines it never runs).
- A training forward of Hotline's collection fed a host KJT, and the sharded module's ``compute`` fed the KJT its
  ``input_dist`` saw on the device, raise nothing under torch's sync debug mode ``"error"``: the ids reach the
  host by one non-blocking copy that only the lookup waits for, and every host array reaches the device through
  a pinned staging buffer without blocking (``tiered_tables.to_device``).
- The cold store registers no table with CUDA (issue 55: pin per staging buffer, never a whole table).
- The pooled outputs equal the CPU collection's within float32 summation noise.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

import torchrec_workers as w  # noqa: E402


def _no_sync(fn, *args):
    """``fn(*args)`` under torch's sync debug mode "error" (a synchronising call raises)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_lookups_queue_without_a_sync_and_cold_tables_stay_pageable():
    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    cpu = HotlineEmbeddingBagCollection(w.configs(), w.placement())
    gpu = HotlineEmbeddingBagCollection(w.configs(), w.placement(), device="cuda")
    assert all(grp.store.host._pinned == [] for grp in gpu._core.groups)
    for step in range(3):
        kjt = w.batch(step, 16).sparse_features  # on the host, as the collection reads ids
        want = cpu(kjt).values()
        got = (_no_sync(gpu, kjt) if step else gpu(kjt)).values()  # step 0: first allocations
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
        got.sum().backward()
        want.sum().backward()
        gpu.fused_optimizer.step()
        cpu.fused_optimizer.step()


def test_sharded_compute_waits_only_for_its_ids():
    import torch.distributed as dist
    from ranks import free_port
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection
    from hotline.torchrec_bridge.sharding import HotlineEmbeddingBagCollectionSharder

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ebc = HotlineEmbeddingBagCollection(w.configs(), w.placement(), device="cuda")
        ref = copy.deepcopy(ebc.export_tables())
        dmp = DistributedModelParallel(w.dlrm(ebc), device=torch.device("cuda"),
                                       sharders=[HotlineEmbeddingBagCollectionSharder()])  # fmt: skip
        sharded = dmp.module.model.sparse_arch.embedding_bag_collection
        cpu = HotlineEmbeddingBagCollection(
            w.configs(), w.placement(), weights=[ref[c.name] for c in w.configs()]
        )
        for step in range(3):
            kjt = w.batch(step, 16).sparse_features
            ctx = sharded.create_context()
            dist_in = sharded.input_dist(ctx, kjt.to(torch.device("cuda"))).wait().wait()
            with torch.no_grad():
                got = _no_sync(sharded.compute, ctx, dist_in).values() if step else None
                want = cpu(kjt).values()
            if got is not None:
                torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()
