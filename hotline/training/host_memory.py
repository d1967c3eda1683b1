"""The host memory a run may take: the machine's available memory and the memory limit the process lives under.

A container or a batch scheduler gives a process a memory cgroup whose limit is far below the machine's memory;
the kernel kills a process that passes it, with no message. :func:`host_memory` reads both figures, so the
preflight (:func:`hotline.training.preflight.check_memory`) refuses a run that will not fit before it writes
anything, naming the one that binds:

- the machine: Linux ``MemAvailable`` (``/proc/meminfo``), what a new allocation can get without swapping;
- the cgroup: v2 ``memory.max`` (the smallest over the process's cgroup and its ancestors) less
  ``memory.current``, else v1 ``memory.limit_in_bytes`` (and ``hierarchical_memory_limit``, the ancestors'
  smallest) less ``memory.usage_in_bytes``; the usage counts clean file pages (``active_file`` and ``inactive_file``
  less dirty and writeback) as free, as the kernel reclaims them before it kills anything.

:func:`per_row_bytes` finds the host structures of a built mode that grow with the row count (the claim of
at most 8 bytes a row on one rank and on N, ``tests/test_host_bytes.py``,
``tests/test_host_bytes_ranks.py``, ``benchmarks/bench_scale.py``).

The cgroup files are read under a root (``/sys/fs/cgroup``), with the process's cgroup paths from
``/proc/self/cgroup``: tests pass a directory of fixture files.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

UNLIMITED = 1 << 62
"""A cgroup v1 limit at or above this is no limit (the kernel writes 2**63 - 4096 rounded to its page size)."""


@dataclass(frozen=True)
class CgroupLimit:
    """The memory limit of the cgroup this process lives in."""

    limit: int
    """Bytes the cgroup may hold (the smallest limit of the process's cgroup and its ancestors)."""
    used: int
    """Bytes charged to the cgroup now, less its reclaimable file pages."""
    where: str
    """The file the limit was read from, named in messages (``cgroup v2 /sys/fs/cgroup/x/memory.max``)."""

    @property
    def free(self) -> int:
        """Bytes a new allocation can still get under the limit."""
        return max(0, self.limit - self.used)


@dataclass(frozen=True)
class HostMemory:
    """What a run may allocate now: the smaller of the machine's available memory and its cgroup's room."""

    machine: int | None
    """The machine's ``MemAvailable`` in bytes, or None where the kernel does not say."""
    cgroup: CgroupLimit | None = None
    """The memory limit the process lives under, or None (no cgroup limit)."""

    @property
    def available(self) -> int | None:
        """Bytes a new allocation can get: the smaller figure (None when neither is known)."""
        figures = [f for f in (self.machine, self.cgroup.free if self.cgroup else None) if f is not None]
        return min(figures) if figures else None

    @property
    def limited_by_cgroup(self) -> bool:
        """Whether the cgroup's limit is the figure that binds."""
        return self.cgroup is not None and (self.machine is None or self.cgroup.free < self.machine)

    def describe(self) -> str:
        """Both figures in words, the binding one first (for a message)."""
        from hotline.units import format_size

        machine = (
            "MemAvailable unknown" if self.machine is None else f"{format_size(self.machine)} MemAvailable"
        )
        if self.cgroup is None:
            return f"{machine}; no cgroup memory limit"
        c = self.cgroup
        group = (
            f"the {format_size(c.limit)} memory limit of {c.where} ({format_size(c.used)} of it in use, "
            f"{format_size(c.free)} free)"
        )
        return (
            f"{group}, below the machine's {machine}"
            if self.limited_by_cgroup
            else f"{machine}, below {group}"
        )


def machine_available(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """Bytes the kernel says can be allocated without swapping (Linux ``MemAvailable``), or None."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    """The integer in ``path`` (None: missing, unreadable, or ``max``)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None  # "max": no limit


def _stat(path: Path) -> dict[str, int]:
    """A cgroup ``memory.stat`` file as a dict (empty when it cannot be read)."""
    out = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                out[key] = int(value)
    except OSError:
        pass
    return out


def _cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path (the ``0::`` line) and its v1 memory controller's path, from
    ``/proc/self/cgroup``."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _inside(root: Path, path: str) -> Path:
    """The directory of cgroup ``path`` under the hierarchy's ``root``; the root itself where the path is not
    visible there (a container sees its own cgroup as the root)."""
    d = root / path.lstrip("/")
    return d if d.is_dir() else root


def _clean_file_pages(stat: dict[str, int], prefix: str, dirty: str, writeback: str) -> int:
    """The page cache the kernel reclaims before it kills anything: the file pages on both LRU lists, active
    ones included (a file read twice is active, yet dropped under pressure), less those not yet written."""
    files = stat.get(prefix + "active_file", 0) + stat.get(prefix + "inactive_file", 0)
    return max(0, files - stat.get(prefix + dirty, 0) - stat.get(prefix + writeback, 0))


def _v2_limit(root: Path, path: str) -> CgroupLimit | None:
    """The smallest ``memory.max`` from the process's v2 cgroup up to the hierarchy's root, with its usage."""
    leaf = _inside(root, path)
    limit, where, d = None, None, leaf
    while True:
        m = _read_int(d / "memory.max")
        if m is not None and (limit is None or m < limit):
            limit, where = m, d / "memory.max"
        if d == root or root not in d.parents:
            break
        d = d.parent
    if limit is None:
        return None
    current = _read_int(leaf / "memory.current") or 0
    reclaimable = _clean_file_pages(_stat(leaf / "memory.stat"), "", "file_dirty", "file_writeback")
    return CgroupLimit(limit, max(0, current - reclaimable), f"cgroup v2 {where}")


def _v1_limit(root: Path, path: str) -> CgroupLimit | None:
    """The v1 memory controller's limit of the process's cgroup (its ancestors' smallest included)."""
    d = _inside(root, path)
    limit = _read_int(d / "memory.limit_in_bytes")
    stat = _stat(d / "memory.stat")
    limits = [x for x in (limit, stat.get("hierarchical_memory_limit")) if x is not None and x < UNLIMITED]
    if not limits:
        return None
    usage = _read_int(d / "memory.usage_in_bytes") or 0
    total = "total_" if "total_active_file" in stat or "total_inactive_file" in stat else ""
    reclaimable = _clean_file_pages(stat, total, "dirty", "writeback")
    return CgroupLimit(min(limits), max(0, usage - reclaimable), f"cgroup v1 {d / 'memory.limit_in_bytes'}")


def cgroup_limit(
    root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> CgroupLimit | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, else v1 ``memory.limit_in_bytes``), read
    under ``root`` with the paths of ``proc_cgroup``; None where there is no limit."""
    root, proc_cgroup = Path(root), Path(proc_cgroup)
    v2, v1 = _cgroup_paths(proc_cgroup)
    found = []
    if v2 is not None:
        for unified in (root, root / "unified"):  # a pure v2 host mounts it at the root; a hybrid one below
            if (unified / "cgroup.controllers").exists():
                limit = _v2_limit(unified, v2)
                if limit is not None:
                    found.append(limit)
                break
    if v1 is not None and (root / "memory").is_dir():
        limit = _v1_limit(root / "memory", v1)
        if limit is not None:
            found.append(limit)
    return min(found, key=lambda c: c.free) if found else None


def host_memory(
    cgroup_root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    meminfo: str | Path = "/proc/meminfo",
) -> HostMemory:
    """The machine's available memory and the process's cgroup limit (files read under the given paths)."""
    return HostMemory(machine_available(meminfo), cgroup_limit(cgroup_root, proc_cgroup))


def _buffer(a: np.ndarray):
    """The object that owns ``a``'s memory (an ndarray, or the mmap of a memory map)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def _address(a) -> int:
    """Where the memory of ``a`` (an array or a tensor) starts: views of one buffer from its start agree."""
    import torch

    if isinstance(a, torch.Tensor):
        return a.untyped_storage().data_ptr()
    owner = _buffer(a)
    return (owner if isinstance(owner, np.ndarray) else a).__array_interface__["data"][0]


def per_row_bytes(root, rows: int, exclude=()) -> dict[str, int]:
    """The host structures that grow with the row count: bytes of every array (or CPU tensor) reachable from
    ``root`` through the attributes of Hotline's objects that holds at least a byte per row, or that its object
    names in its class's ``per_row`` (a bitmap of a bit a row: :class:`~hotline.tiers.written_rows.WrittenRows`,
    :class:`~hotline.tiers.pending_rows.PendingRows`); not those its class names in ``budgeted`` (sized by a
    flag, not the row count: :class:`~hotline.tiers.held_rows.HeldRows`),
    by the attribute path that first reached it (anonymous memory only, huge-page arrays included: memory maps
    of files are on disk); ``exclude``: arrays not counted (a memory store's table and state). Per rank: a
    machine of N ranks holds the sum of theirs."""
    import torch

    skip = {_address(x) for x in exclude}
    seen, found = set(), {}
    stack = [("mode", root, False)]
    while stack:
        path, o, counted = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            o = o.detach().cpu().numpy() if o.device.type == "cpu" else None
            if o is None:
                continue
        if isinstance(o, np.ndarray):
            owner = _buffer(o)
            if isinstance(o, np.memmap) or isinstance(owner, mmap.mmap) or _address(o) in skip:
                continue
            nbytes = owner.nbytes if isinstance(owner, np.ndarray) else o.nbytes
            if (nbytes >= rows or counted) and ("buffer", _address(o)) not in seen:
                seen.add(("buffer", _address(o)))
                found[path] = nbytes
            continue
        if isinstance(o, dict):
            stack += [(f"{path}[{k!r}]", v, False) for k, v in o.items()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += [(f"{path}[{i}]", v, False) for i, v in enumerate(o)]
        elif type(o).__module__.startswith(("hotline", "kernels")) and hasattr(o, "__dict__"):
            named, budgeted = getattr(type(o), "per_row", ()), getattr(type(o), "budgeted", ())
            stack += [(f"{path}.{k}", v, k in named) for k, v in vars(o).items() if k not in budgeted]
    return found
