"""The torchrec bridge's device path reads nothing back from the device, and its replicated rows stay bit-identical.

A GPU pays for every host read of a device tensor (``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()``) and for
every op whose output size depends on the data (``torch.unique``, ``nonzero``, a boolean mask): each waits for the
device to finish. No GPU runs here, so :class:`SyncRecorder` watches a training step of Hotline's collection under
torchrec's ``DistributedModelParallel`` (gloo, CPU) with the bridge on its device path (``host_kernels=False``:
the ops CUDA runs, on the CPU). It marks the device's tensors (the model's dense parameters, the hot rows and
their state, every host array the bridge copies over, and all that is computed from them) and records each such
read that Hotline's code makes (torchrec's own ops are not Hotline's to change). tests/test_torchrec_cuda.py runs
the same checks on CUDA under torch's sync debug mode when a GPU exists.

What is not a read back: a non-blocking copy into a host buffer (the updated rows' way home, waited for by an
event at the next lookup, which reads them); the KJT's ids, which the lookup reads on the host (a device KJT's
host copy is started by ``input_dist`` and checked on CUDA only).

- one and three ranks, SGD, row-wise Adagrad, Adagrad and Adam: no read back in a step (forward, backward, the fused
  optimizer's sparse update and the dense one; and a step of the prefetch pipeline);
- three ranks whose local batches differ: every rank's hot rows and their state equal bit for bit (``torch.equal``)
  on both paths (the hot gradients summed in rank order, ``hotline.tiers.replicated.update_replicas``; three, as
  with two a row's sum has two addends and float addition is commutative: no order of them could differ);
- the device path trains the same model as the CPU kernels' path, within float32 reassociation
  (``torchrec_workers.TOLERANCE``), and under torchrec's prefetch pipeline (the claim rule reading rows again) the
  same bits as without it;
- the recorder itself sees each kind of read back (so the tests above can fail).
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_workers as w  # noqa: E402
from ranks import spawn  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.weak import WeakTensorKeyDictionary  # noqa: E402

STEPS, BATCH = 5, 16
KINDS = ("sgd", "rowwise-adagrad", "adagrad", "adam")
PATHS = (
    "device",
    "host",
    "prefetch",
)  # the device path, the CPU kernels' path, the device path looking ahead

SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten._unique2.default",
            "aten.unique_dim.default", "aten.unique_consecutive.default", "aten._unique.default",
            "aten.masked_select.default", "aten.repeat_interleave.Tensor"}  # fmt: skip
"""aten ops that wait for the device: a scalar read back, an output sized by the data."""
HOST_READS = {"item", "tolist", "numpy", "cpu", "__array__", "__bool__", "__int__", "__float__", "__index__"}
"""Tensor methods that read a device tensor on the host (on a CPU they never reach aten: seen one level up)."""

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)
_OURS = (os.sep + "hotline" + os.sep, os.sep + "kernels" + os.sep)


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this recorder (who made the op)."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith(_TORCH_DIR) or f.f_code.co_filename == _HERE):
        f = f.f_back
    return "?" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


class SyncRecorder:
    """Records the reads back of device tensors (see the module docstring) made inside ``with recorder:``.

    ``mark(t)`` declares ``t`` a device tensor; the outputs of any op with a device input are device tensors, and
    so is a non-blocking copy to the device (``to_device``'s), and what an in-place op or a collective writes
    from one; a non-blocking ``copy_`` into a host buffer leaves the buffer a host tensor. ``events``: ``(what, where)`` of each read that Hotline's code made; ``others``:
    those of torchrec / torch. ``on``: a device type whose tensors are all device tensors (``"cuda"`` on a GPU)."""

    def __init__(self, on: str | None = None):
        self.on = on
        self.device = WeakTensorKeyDictionary()
        self.events: list[tuple[str, str]] = []
        self.others: list[tuple[str, str]] = []
        recorder = self

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                name = str(func)
                on_device = recorder._any_device((args, kwargs))
                if name in SYNC_OPS and on_device:
                    recorder._record(name)
                elif name == "aten.index.Tensor" and on_device and recorder._bool_index(args):
                    recorder._record(name + " (boolean mask)")
                async_copy = kwargs.get("non_blocking", False) or (
                    name == "aten.copy_.default" and args[2:3] == (True,)
                )
                if name == "aten._to_copy.default" and kwargs.get("non_blocking", False):
                    on_device = True  # a host array on its way to the device
                elif name == "aten.copy_.default" and async_copy:
                    on_device = False  # the device's rows on their way to a host buffer
                if on_device:
                    written = list(tree_flatten(out)[0])
                    if name.startswith("c10d."):  # a collective writes into its tensor arguments
                        written += tree_flatten((args, kwargs))[0]
                    elif name.split(".")[1].endswith("_") and args:  # in place: a view's base is written too
                        written += [args[0], getattr(args[0], "_base", None)]
                    recorder.mark(*(t for t in written if isinstance(t, torch.Tensor)))
                return out

        class Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                if name in HOST_READS and args and recorder._is_device(args[0]):
                    recorder._record(f"Tensor.{name}")
                return func(*args, **kwargs)

        self._modes = (Function(), Dispatch())

    def mark(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self.device[t] = True

    def _is_device(self, t) -> bool:
        return isinstance(t, torch.Tensor) and (t in self.device or t.device.type == self.on)

    def _any_device(self, tree) -> bool:
        return any(self._is_device(a) for a in tree_flatten(tree)[0])

    def _bool_index(self, args) -> bool:
        index = args[1] if len(args) > 1 else []
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)

    def _record(self, what: str) -> None:
        where = _caller()
        ours = any(part in where for part in _OURS) and "site-packages" not in where
        (self.events if ours else self.others).append((what, where))

    def __enter__(self):
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)


def mark_device_tensors(recorder: SyncRecorder, dmp) -> None:
    """The device's tensors of a DMP model over Hotline's collection: its dense parameters and buffers, and the
    collection's hot rows and their state (the tables' host rows are host memory)."""
    ebc = dmp.module.model.sparse_arch.embedding_bag_collection
    recorder.mark(*(p for n, p in dmp.named_parameters() if "embedding_bags" not in n), *dmp.buffers())
    for grp in ebc._core.groups:
        recorder.mark(grp.hot_weight, grp.hot_state)


def _ranks_agree(comm, t: torch.Tensor) -> bool:
    """Every rank's ``t`` equals rank 0's bit for bit (a collective)."""
    parts = comm.all_gather_varlen(t.detach().reshape(-1, 1).contiguous(), "check")
    return all(torch.equal(p, parts[0]) for p in parts)


def steps_on_both_paths(comm, kinds: tuple[str, ...], out: str) -> None:
    """Spawned rank: per optimizer and path (the device's, the device's under the prefetch pipeline, the CPU
    kernels'), trains ``STEPS`` steps under DMP (each rank its slice of the global batch) recording the last one;
    rank 0 saves the reads back, the final state, whether the ranks' hot rows agree bit for bit and the rows the
    claim rule read again."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from hotline.torchrec_bridge.pipelines import CpuPrefetchTrainPipelineSparseDist
    from hotline.torchrec_bridge.sharding import HotlineEmbeddingBagCollectionSharder, hotline_sharding_plan

    N, r = comm.world_size, comm.rank
    results = {}
    for kind in kinds:
        for path in PATHS:
            model = w.hotline_model(kind)
            dmp = DistributedModelParallel(model, device=torch.device("cpu"),
                                           sharders=[HotlineEmbeddingBagCollectionSharder()],
                                           plan=hotline_sharding_plan(model, N))  # fmt: skip
            ebc = dmp.module.model.sparse_arch.embedding_bag_collection
            for grp in ebc._core.groups:
                grp.host_kernels = path == "host"
            opt = w.combined_optimizer(dmp)
            recorder = SyncRecorder()
            mark_device_tensors(recorder, dmp)
            batches = iter([w.batch(s, BATCH, r, N) for s in range(STEPS)])
            pipe = (
                CpuPrefetchTrainPipelineSparseDist(dmp, opt, torch.device("cpu"))
                if path == "prefetch"
                else None
            )
            for s in range(STEPS):
                with recorder if s == STEPS - 1 else _nothing():  # the last step, after the first allocations
                    if pipe is not None:
                        pipe.progress(batches)
                        continue
                    loss, _ = dmp(next(batches))
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
            if pipe is not None:
                pipe.detach()
            agree = all(
                _ranks_agree(comm, t) for grp in ebc._core.groups for t in (grp.hot_weight, grp.hot_state)
            )
            state = {k: w.full(v, r) for k, v in dmp.state_dict().items()}
            refreshed = sum(grp.refreshed_rows for grp in ebc._core.groups)
            for grp in ebc._core.groups:
                grp.stop_prefetching()
            if r == 0:
                results[(kind, path)] = {"events": recorder.events, "others": recorder.others, "agree": agree,
                                         "state": state, "refreshed": refreshed}  # fmt: skip
    if r == 0:
        torch.save(results, out)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.mark.parametrize("world", [1, 3])
def test_a_device_path_step_reads_nothing_back_and_replicas_agree(world, tmp_path):
    out = str(tmp_path / "steps.pt")
    spawn(world, steps_on_both_paths, KINDS, out)
    results = torch.load(out)
    for kind in KINDS:
        device, host, ahead = (results[(kind, path)] for path in PATHS)
        for got in (device, ahead):
            assert got["events"] == [], (kind, got["events"])
        assert device["agree"] and host["agree"] and ahead["agree"], (
            kind
        )  # every rank's hot rows, the same bits
        for k, want in host["state"].items():
            have = device["state"][k]
            scale = max(float(want.abs().max()), 1e-30)
            assert float((have - want).abs().max()) / scale <= w.TOLERANCE[kind], (kind, k)
            assert torch.equal(ahead["state"][k], have), (kind, k)  # the look-ahead changes no bit
        assert ahead["refreshed"] > 0 and device["refreshed"] == 0  # the claim rule really read rows again
    # the host path reads its own tensors in place: the recorder sees those reads (it is not blind)
    assert results[("sgd", "host")]["events"]


def test_the_recorder_sees_each_kind_of_read_back():
    dev = torch.arange(6.0).reshape(3, 2)
    host = torch.arange(6.0).reshape(3, 2)
    reads = [lambda t: t.sum().item(), lambda t: t.cpu(), lambda t: t.numpy(), lambda t: t.tolist(),
             lambda t: torch.unique(t), lambda t: t.nonzero(), lambda t: t[t > 2], lambda t: bool(t[0, 0] > 0),
             lambda t: torch.masked_select(t, t > 1)]  # fmt: skip
    for read in reads:
        recorder = SyncRecorder()
        recorder.mark(dev)
        with recorder:
            read(host)  # a host tensor: nothing to record
            assert recorder.events == recorder.others == []
            read(dev * 2)  # computed from a device tensor
        assert len(recorder.events + recorder.others) >= 1
    recorder = SyncRecorder()
    recorder.mark(dev)
    with recorder:
        staged = torch.empty(3, 2)
        staged.copy_(dev * 2, non_blocking=True)  # the rows' way home: a host buffer
        staged.numpy()
        sent = host.to("cpu", copy=True, non_blocking=True)  # a host array's way to the device
        sent.numpy()
    assert [what for what, _ in recorder.events + recorder.others] == ["Tensor.numpy"]
