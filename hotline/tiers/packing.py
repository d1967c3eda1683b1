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
    """Reusable pinned buffers (int64 and float32) a step's arrays are packed into and copied from."""

    def __init__(self, pin: bool, int_capacity: int = 0, float_capacity: int = 0):
        self.pin = pin
        self._buffers = {
            np.dtype(np.int64): self._alloc(torch.int64, int_capacity),
            np.dtype(np.float32): self._alloc(torch.float32, float_capacity),
        }

    def _alloc(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        return torch.empty(max(1, int(n)), dtype=dtype, pin_memory=self.pin)

    def copy(
        self, arrays: dict[str, np.ndarray], device: torch.device, non_blocking: bool
    ) -> dict[str, torch.Tensor]:
        """Device tensors of ``arrays`` (int64 or float32 each), as views of one copy per dtype."""
        out: dict[str, torch.Tensor] = {}
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
            dev = buffer[:at].to(device, non_blocking=non_blocking)
            for k, (o, shape) in offsets.items():
                out[k] = dev[o : o + int(np.prod(shape, dtype=np.int64))].view(shape)
        missing = [k for k in arrays if k not in out]
        if missing:
            raise TypeError(
                f"CopyPack packs int64 and float32 arrays, not {[str(arrays[k].dtype) for k in missing]}"
            )
        return out
