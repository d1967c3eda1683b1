"""Pinning host memory IN PLACE for asynchronous copies to CUDA (``cudaHostRegister``), never by copying
unless the registration fails.

``tensor.pin_memory()`` copies the whole tensor into a block of the pinned allocator, which rounds it up to
a power of two: for an 8.6 GB cold tier that is a 17.2 GB block and about 26 GB of host memory at peak.
Registering the existing pages costs no memory and keeps numpy views valid. Without CUDA nothing is pinned.

A failed ``cudaHostRegister`` also leaves CUDA's last error set, which the next unrelated kernel launch would
raise; :func:`clear_cuda_error` clears it before anything else runs.
"""

from __future__ import annotations

import ctypes
import warnings

import torch


def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process has loaded (torch's own copy), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line and "/" in line}
    except OSError:
        paths = set()
    for name in [*sorted(paths), "libcudart.so", "libcudart.so.13", "libcudart.so.12"]:
        try:
            return ctypes.CDLL(name)  # a library already loaded: the same handle, the same error state
        except OSError:
            continue
    return None


def clear_cuda_error() -> bool:
    """Clears this thread's last CUDA runtime error (``cudaGetLastError``): a failed runtime call such as a
    refused ``cudaHostRegister`` leaves it set, and the next kernel launch's check would raise it there.
    False when no CUDA runtime library could be found (nothing to clear)."""
    lib = _cudart()
    if lib is None:
        return False
    lib.cudaGetLastError()
    return True


class PinnedRegion:
    """A host tensor's memory registered with CUDA (page-locked) until :meth:`close`."""

    def __init__(self, tensor: torch.Tensor):
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("only a contiguous host tensor can be pinned in place")
        self.tensor = tensor
        self.ptr = tensor.data_ptr()
        self.nbytes = tensor.numel() * tensor.element_size()
        self.registered = False
        if self.nbytes:
            cudart = torch.cuda.cudart()
            try:
                torch.cuda.check_error(cudart.cudaHostRegister(self.ptr, self.nbytes, 0))
            except Exception:
                clear_cuda_error()  # or the next unrelated kernel would raise this refusal
                raise
            self.registered = True

    def close(self) -> None:
        """Unregisters the memory (idempotent)."""
        if self.registered:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self.ptr))
            self.registered = False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: CUDA may be gone already
            pass


def _gib(tensor: torch.Tensor) -> str:
    return f"{tensor.numel() * tensor.element_size() / 2**30:.2f} GiB"


def pin_in_place(tensor: torch.Tensor) -> PinnedRegion | None:
    """Registers ``tensor``'s memory with CUDA when CUDA is available (None otherwise, or when empty).

    Pinning only speeds copies up: when the registration fails (a locked-memory limit, a driver that refuses)
    it clears CUDA's error, warns and returns None, and the caller goes on with pageable memory."""
    if not torch.cuda.is_available() or tensor.numel() == 0:
        return None
    try:
        return PinnedRegion(tensor)
    except Exception as e:  # noqa: BLE001 - whatever refused it (CUDA error, torch without CUDA): unpinned
        warnings.warn(
            f"could not pin {_gib(tensor)} of host memory in place ({e}); going on unpinned",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def pinned(tensor: torch.Tensor) -> tuple[torch.Tensor, PinnedRegion | None]:
    """``tensor`` pinned for asynchronous copies when CUDA is available: ``(tensor, region)`` registered in
    place; if the registration fails, its CUDA error cleared and ``(a pinned copy, None)`` with a warning that
    says so (the caller uses the copy from then on); if that fails too, ``(tensor, None)``, unpinned, with a
    warning. Without CUDA (or empty): ``(tensor, None)``, silently."""
    if not torch.cuda.is_available() or tensor.numel() == 0:
        return tensor, None
    if tensor.is_pinned():  # already page-locked (registered or from the pinned allocator): nothing to do
        return tensor, None
    try:
        return tensor, PinnedRegion(tensor)
    except Exception as e:  # noqa: BLE001 - the registration refused (its CUDA error is cleared): copy
        refused = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    try:
        copy = tensor.pin_memory()
    except Exception as e:  # noqa: BLE001 - no pinned memory at all: pageable copies still work
        warnings.warn(
            f"could not pin {_gib(tensor)} of host memory in place ({refused}) nor copy it to pinned memory "
            f"({type(e).__name__}: {e}); going on unpinned",
            RuntimeWarning,
            stacklevel=2,
        )
        return tensor, None
    warnings.warn(
        f"could not pin {_gib(tensor)} of host memory in place ({refused}); using a pinned copy of it instead "
        f"(the pinned allocator's block, up to twice its size)",
        RuntimeWarning,
        stacklevel=2,
    )
    return copy, None
