"""The torchrec bridge on CUDA: a training step that queues without a device sync, cold tables left pageable.

Skipped without CUDA or torchrec (the GPU image has no torchrec; on this project's CPU machines it never runs).
tests/test_torchrec_syncs.py runs the same step on a CPU with the device path's ops, under its SyncRecorder.
- A training step of Hotline's collection fed a host KJT (forward, backward, the fused optimizer's sparse update),
  and the sharded module's ``compute`` fed the KJT its ``input_dist`` saw on the device, then its sparse update,
  raise nothing under torch's sync debug mode ``"error"``, and the SyncRecorder sees no read back by Hotline's code:
  the ids reach the host by one non-blocking copy that only the lookup waits for, every host array reaches the
  device through a pinned staging buffer without blocking (``tiered_tables.to_device``), the update's distinct hot
  rows come from the host, and the updated rows go home into pinned buffers, waited for by the next lookup.
- The cold store registers no table with CUDA (issue 55: pin per staging buffer, never a whole table).
- The pooled outputs, and the tables after the steps, equal the CPU collection's within float32 summation noise.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

import torchrec_workers as w  # noqa: E402


def _no_sync(fn, *args):
    """``fn(*args)`` under torch's sync debug mode "error" (a synchronising call raises) and the SyncRecorder
    (asserting that Hotline's code read no device tensor back)."""
    from test_torchrec_syncs import SyncRecorder

    recorder = SyncRecorder(on="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with recorder:
            out = fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert recorder.events == [], recorder.events
    return out


def _step(ebc, kjt):
    """One training step of a collection: forward, backward of the pooled sum, the fused optimizer's update."""
    out = ebc(kjt).values()
    out.sum().backward()
    ebc.fused_optimizer.step()
    return out


def _assert_tables_close(got, want):
    for name, table in want.items():
        torch.testing.assert_close(torch.as_tensor(got[name]), torch.as_tensor(table), rtol=1e-5, atol=1e-6)


def test_a_training_step_queues_without_a_sync_and_cold_tables_stay_pageable():
    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    cpu = HotlineEmbeddingBagCollection(w.configs(), w.placement())
    gpu = HotlineEmbeddingBagCollection(w.configs(), w.placement(), device="cuda")
    assert all(grp.store.host._pinned == [] for grp in gpu._core.groups)
    assert not any(grp.host_kernels for grp in gpu._core.groups)
    for step in range(4):
        kjt = w.batch(step, 16).sparse_features  # on the host, as the collection reads ids
        want = _step(cpu, kjt)
        got = _no_sync(_step, gpu, kjt) if step else _step(gpu, kjt)  # step 0: first allocations
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    _assert_tables_close(gpu.export_tables(), cpu.export_tables())


def test_sharded_compute_and_update_wait_only_for_their_ids():
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

        def compute_and_update(ctx, dist_in):
            out = sharded.compute(ctx, dist_in).values()
            out.sum().backward()
            sharded.sparse_step()
            return out

        for step in range(4):
            kjt = w.batch(step, 16).sparse_features
            ctx = sharded.create_context()
            dist_in = sharded.input_dist(ctx, kjt.to(torch.device("cuda"))).wait().wait()
            got = _no_sync(compute_and_update, ctx, dist_in) if step else compute_and_update(ctx, dist_in)
            want = _step(cpu, kjt)
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
        _assert_tables_close(sharded.export_tables(), cpu.export_tables())
    finally:
        dist.destroy_process_group()
