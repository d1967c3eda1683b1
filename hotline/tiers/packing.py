"""One host-to-device copy for all of a step's small arrays, instead of one copy each.

A step needs about a dozen index arrays (the micro-batches' positions and slots, the distinct hot rows) and
its dense inputs and labels on the device. Copied one by one from pageable memory, CUDA stages and
synchronises each. A :class:`CopyPack` (one per staging slot, so a pack is not reused before its step is
done) packs the int64 arrays into one pinned buffer and the float32 ones into another: two asynchronous
copies, and the device tensors are views into them.
"""

from __future__ import annotations

import numpy as np
import torch


class CopyPack:
    """Reusable pinned buffers (int64 and float32) a step's arrays are packed into and copied from.

    :meth:`load` is host work (packing), :meth:`send` only queues the copies: a caller that times the copies on
    the device's clock packs first, so the timed interval holds copies, not the host's packing."""

    def __init__(self, pin: bool, int_capacity: int = 0, float_capacity: int = 0):
        self.pin = pin
        self._buffers = {
            np.dtype(np.int64): self._alloc(torch.int64, int_capacity),
            np.dtype(np.float32): self._alloc(torch.float32, float_capacity),
        }
        self._loaded: dict[np.dtype, tuple[int, dict]] = {}

    def _alloc(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        return torch.empty(max(1, int(n)), dtype=dtype, pin_memory=self.pin)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Packs ``arrays`` (int64 or float32 each) into the buffers (the previous copy from them must be done)."""
        missing = [k for k, a in arrays.items() if a.dtype not in self._buffers]
        if missing:
            raise TypeError(
                f"CopyPack packs int64 and float32 arrays, not {[str(arrays[k].dtype) for k in missing]}"
            )
        self._loaded = {}
        for dtype, buffer in list(self._buffers.items()):
            names = [k for k, a in arrays.items() if a.dtype == dtype]
            total = sum(arrays[k].size for k in names)
            if (
                total > buffer.numel()
            ):  # a larger step than planned for: grow (rare; pinned memory is slow to get)
                buffer = self._buffers[dtype] = self._alloc(buffer.dtype, 2 * total)
            host = buffer.numpy()
            at = 0
            offsets = {}
            for k in names:
                a = arrays[k]
                host[at : at + a.size] = a.reshape(-1)
                offsets[k] = (at, a.shape)
                at += a.size
            self._loaded[dtype] = (at, offsets)

    def send(self, device: torch.device, non_blocking: bool) -> dict[str, torch.Tensor]:
        """Device tensors of the loaded arrays, as views of one copy per dtype (on the current stream)."""
        out: dict[str, torch.Tensor] = {}
        for dtype, (at, offsets) in self._loaded.items():
            dev = self._buffers[dtype][:at].to(device, non_blocking=non_blocking)
            for k, (o, shape) in offsets.items():
                out[k] = dev[o : o + int(np.prod(shape, dtype=np.int64))].view(shape)
        return out

    def copy(
        self, arrays: dict[str, np.ndarray], device: torch.device, non_blocking: bool
    ) -> dict[str, torch.Tensor]:
        """Device tensors of ``arrays`` (int64 or float32 each), as views of one copy per dtype."""
        self.load(arrays)
        return self.send(device, non_blocking)


class PackRing:
    """A few :class:`CopyPack` used in turn by a caller with no ring of its own (device mode, the plain
    PyTorch baseline): before a pack is packed again, the copy that last read it must have finished (a CUDA
    event recorded after it, on the current stream of the device; the wait is for that copy alone)."""

    def __init__(self, device: torch.device | str, slots: int = 2):
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self._packs = [CopyPack(pin=cuda) for _ in range(max(1, slots))]
        self._copied: list[object | None] = [None] * len(self._packs)
        self._next = 0

    def copy(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Device tensors of ``arrays`` (one copy per dtype, asynchronous on CUDA)."""
        i = self._next
        self._next = (i + 1) % len(self._packs)
        if self._copied[i] is not None:
            self._copied[i].synchronize()
        cuda = self.device.type == "cuda"
        out = self._packs[i].copy(arrays, self.device, non_blocking=cuda)
        if cuda:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            self._copied[i] = done
        return out
