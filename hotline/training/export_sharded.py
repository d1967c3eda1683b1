"""An export too large for one ``torch.save``: torchrec's DLRM in torch.distributed.checkpoint's format (DCP),
a directory written chunk by chunk.

The directory holds DCP's files (``.metadata`` and one ``.distcp`` file per chunk) and ``hotline-export.json``
(the export's format and config, as a torch.save export records them). Its keys are the torchrec DLRM's
``state_dict`` keys (``sparse_arch.embedding_bag_collection.embedding_bags.t_cat_{t}.weight``, the dense
layers' own), each table stored as row ranges of :data:`~hotline.training.checkpoint_rows.CHUNK_BYTES`:
``torch.distributed.checkpoint.load`` fills any state_dict of those keys and shapes in place, one stored chunk
in memory at a time (torchrec's DLRM, a bare EmbeddingBagCollection under the prefix, plain tensors; no
process group needed). :func:`load` rebuilds the DLRM.

The tables are written one chunk at a time: from a disk-store checkpoint's rows files (one, or each rank's)
as each chunk completes on one streamed pass (:class:`~hotline.training.export_rows.StreamedRows`), from a
checkpoint's in-memory tables by slicing, from N ranks' cold shards and rank 0's hot tier by
:class:`ShardChunks`. Every chunk is a file of its own (DCP's writer
keeps each file's last tensor per key until the file is closed). The directory is written under a temporary
name (``.OUT.hotline-tmp-PID-RANDOM``) and renamed when complete (over an export that ``--force`` replaces:
swapped with it in one step, :func:`put_in_place`): a killed export leaves no directory under the final name,
or the old export whole, and the next Hotline run there removes its temporary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from hotline import _io

EXPORT_FORMAT = "hotline-torchrec-dlrm/1"
"""The format of an export (a torch.save file's ``format``, a sharded export's :data:`MARKER`'s)."""
MARKER = "hotline-export.json"
"""The file of a sharded export's format and config (the directory's own proof that it is one)."""


def table_key(name: str) -> str:
    """The torchrec DLRM's state_dict key of the embedding table ``name`` (``t_cat_0``)."""
    return f"sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"


_RANK_NAME = re.compile(r"^(.*)\.rank(\d{3})-of-(\d{3})\.pt$")


def rank_files(path: str | os.PathLike, error: type[Exception]) -> list[Path]:
    """The files of the checkpoint ``path`` in rank order: itself (one process), or every rank's file of a
    run of N ranks, named by one of them (``step-000000020.rank000-of-002.pt``) or by their common stem
    (``step-000000020``, ``--save``'s path); ``error`` when one is missing."""
    path = Path(path)
    m = _RANK_NAME.match(path.name)
    if m is None and path.exists():
        return [path]
    if m is None:
        stem = path.name[:-3] if path.name.endswith(".pt") else path.name
        found = sorted(path.parent.glob(f"{glob.escape(stem)}.rank*-of-*.pt")) if path.parent.is_dir() else []
        m = next((m for m in map(_RANK_NAME.match, (f.name for f in found)) if m), None)
        if m is None:
            return [path]  # missing: the checkpoint reader names it
    stem, N = m.group(1), int(m.group(3))
    files = [path.with_name(f"{stem}.rank{r:03d}-of-{N:03d}.pt") for r in range(N)]
    missing = [f.name for f in files if not f.is_file() or not _io.digest_path(f).is_file()]
    if missing:
        raise error(
            f"checkpoint {path}: a checkpoint of {N} ranks needs every rank's file and its digest; "
            f"{missing[0]} is missing (an incomplete checkpoint: export a complete one)"
        )
    return files


def read_ranks(files: list[Path], error: type[Exception]) -> list[dict]:
    """The verified payloads of an N-rank checkpoint's ``files`` (:func:`rank_files`): one run, one step, each
    file its rank's."""
    from hotline.training.checkpoint import read_checkpoint

    N = len(files)
    payloads = [read_checkpoint(f) for f in files]
    for r, (f, p) in enumerate(zip(files, payloads)):
        if p.get("world_size") != N or p.get("rank") != r:
            raise error(f"checkpoint {f} is not rank {r} of {N} by its content (renamed?)")
        same = ("rows" in p) == ("rows" in payloads[0]) and ("tiers" in p) == ("tiers" in payloads[0])
        if p.get("step") != payloads[0].get("step") or p.get("run") != payloads[0].get("run") or not same:
            raise error(f"checkpoint {f} is of another step or run than {files[0].name}: not one checkpoint")
    if "model" not in payloads[0]:
        raise error(f"checkpoint {files[0]} holds no model: not rank 0's file")
    return payloads


def rank_source(files: list[Path], payloads: list[dict], chunk_bytes: int, error: type[Exception]):
    """``open_source(scratch)`` of an N-rank checkpoint, for :func:`write`: its rows in row order, chunk by
    chunk, from its rank files' rows files (a disk-store run), its ranks' cold shards and rank 0's hot tier
    (the host-memory store), or rank 0's tables (``--mode device``)."""
    from hotline.training.checkpoint_rows import CHUNK_BYTES
    from hotline.training.export_rows import StreamedRows

    rank0, sizes = payloads[0], [int(n) for n in payloads[0]["table_sizes"]]
    tiers = rank0.get("tiers", {})
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    if "rows" in rank0:
        parts = [(f, p["rows"]) for f, p in zip(files, payloads)]
        return lambda scratch: StreamedRows(parts, sizes, rank0["hot"], scratch, chunk_bytes, error)
    if "weight" in tiers:
        tables = list(torch.split(tiers["weight"], sizes))
        return lambda scratch: TableChunks(tables, max(1, chunk_bytes // (4 * tables[0].shape[1])))
    if "cold_w" not in tiers or "hot_ids" not in rank0:
        raise error(
            f"checkpoint {files[0]}: its hot tier does not say which rows it holds (written by an older Hotline): "
            f"export it from a one-process checkpoint (`hotline train --load` it on one process and --save)"
        )
    hot = {"rows": rank0["hot_ids"], "w": tiers["hot_w"]}
    shards = [p["tiers"]["cold_w"] for p in payloads]
    return lambda scratch: ShardChunks(shards, sizes, hot, chunk_bytes)


class ShardChunks:
    """The cold shards of N ranks (rank ``r``: rows ``r, r + N, ...``) and the hot tier, cut by
    :func:`~hotline.training.checkpoint_rows.chunk_grid` in row order."""

    def __init__(self, shards, sizes: list[int], hot: dict, chunk_bytes: int):
        from hotline.training.checkpoint_rows import chunk_grid

        self.shards = [s.numpy() for s in shards]
        self.grid = chunk_grid(sizes, max(1, chunk_bytes // (4 * self.shards[0].shape[1])))
        order = np.argsort(hot["rows"].numpy(), kind="stable")
        self._hot_rows = hot["rows"].numpy()[order].astype(np.int64)
        self._hot_w = hot["w"].numpy()[order]

    def chunk(self, k: int) -> np.ndarray:
        _, _, m, g = self.grid[k]
        N = len(self.shards)
        out = np.empty((m, self.shards[0].shape[1]), np.float32)
        for r, shard in enumerate(self.shards):
            first = (r - g) % N  # the chunk's first row that rank r holds
            lo = (g + first) // N
            out[first::N] = shard[lo : lo + len(range(first, m, N))]
        lo, hi = np.searchsorted(self._hot_rows, [g, g + m])
        out[self._hot_rows[lo:hi] - g] = self._hot_w[lo:hi]
        return out

    def close(self) -> None:
        pass


def tables_of(source, sizes: list[int]) -> list[np.ndarray]:
    """Every table of ``source`` (:func:`rank_source`'s, opened) whole in memory: a torch.save export's."""
    tables = [None] * len(sizes)
    for k in schedule(source):
        t, lo, m, _ = source.grid[k]
        w = source.chunk(k)
        if tables[t] is None:
            tables[t] = np.empty((sizes[t], w.shape[1]), np.float32)
        tables[t][lo : lo + m] = w
    finish(source)
    return tables


def schedule(source) -> list[int]:
    """The order in which ``source`` hands out its chunks (a rows file's: as they complete; else the grid's)."""
    return list(getattr(source, "schedule", range(len(source.grid))))


def finish(source) -> None:
    """After the last chunk: ``source`` checks what it read (a rows file's sha256), before anything is put
    under the export's name."""
    if hasattr(source, "finish"):
        source.finish()


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a sharded export (by its :data:`MARKER`'s format)."""
    path = Path(path)
    if not path.is_dir():
        return False
    head = read_head(path)
    return head is not None and head.get("format") == EXPORT_FORMAT


put_in_place = _io.replace_whole
"""Makes the complete export ``tmp`` ``out`` (over an export that ``--force`` replaces: swapped with it in one
step, so that ``out`` is at every moment the old export or the new one)."""


class TableChunks:
    """A checkpoint's in-memory tables (row order) cut by :func:`~hotline.training.checkpoint_rows.chunk_grid`."""

    def __init__(self, tables, chunk_rows: int):
        from hotline.training.checkpoint_rows import chunk_grid

        self.tables = tables
        self.grid = chunk_grid([int(t.shape[0]) for t in tables], chunk_rows)

    def chunk(self, k: int) -> np.ndarray:
        t, lo, m, _ = self.grid[k]
        return self.tables[t][lo : lo + m].numpy().astype(np.float32, copy=True)

    def close(self) -> None:
        pass


def _planner(dense: dict, source, names: list[str], sizes: list[int], dim: int):
    """DCP's default planner for ``dense``, plus each table as the row ranges of ``source``'s grid, each
    resolved (read) only when the writer asks for it."""
    from torch.distributed.checkpoint.default_planner import (
        DefaultSavePlanner,
        create_default_local_save_plan,
    )
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    properties = TensorProperties.create_from_tensor(torch.empty(0, dtype=torch.float32))

    class ChunkedTables(DefaultSavePlanner):
        def __init__(self):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self.chunk_of: dict[tuple[str, int], int] = {}

        def create_local_plan(self):
            plan = create_default_local_save_plan(self.state_dict, self.is_coordinator)
            items = list(plan.items)
            for k in schedule(source):  # DCP's writer resolves them in this order, one file each
                t, lo, m, _ = source.grid[k]
                key = table_key(names[t])
                offsets = torch.Size([lo, 0])
                self.chunk_of[(key, lo)] = k
                items.append(
                    WriteItem(
                        index=MetadataIndex(key, offsets),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([m, dim])),
                            properties=properties,
                            size=torch.Size([sizes[t], dim]),
                        ),
                    )
                )
            self.plan = dataclasses.replace(plan, items=items)
            return self.plan

        def resolve_data(self, write_item):
            k = self.chunk_of.get((write_item.index.fqn, int((write_item.index.offset or [0])[0])))
            if k is None or write_item.type != WriteItemType.SHARD:
                return super().resolve_data(write_item)
            return torch.from_numpy(source.chunk(k))

    return ChunkedTables()


def write(out: Path, tmp: Path, blob_head: dict, dense: dict, source, names: list[str], sizes: list[int],
          dim: int) -> Path:  # fmt: skip
    """Writes the sharded export ``out`` (a directory that does not exist, or a file that ``--force``
    replaces) in the new directory ``tmp`` (:func:`hotline._io.temporary_name`): ``dense`` (torchrec state_dict
    entries) whole, the tables chunk by chunk from ``source`` (``grid``, ``chunk(k)``; :func:`schedule`,
    :func:`finish`), ``blob_head`` (format and config) as :data:`MARKER`; atomically (:func:`put_in_place`)."""
    import torch.distributed.checkpoint as dcp

    tmp.mkdir()
    try:
        writer = dcp.FileSystemWriter(tmp, single_file_per_rank=False, sync_files=True, thread_count=1)
        planner = _planner(dense, source, names, sizes, dim)
        with warnings.catch_warnings(), _unwrapped():  # "assuming the intent is to save in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(dense, storage_writer=writer, planner=planner, no_dist=True)
        finish(source)
        _io.write_json(tmp / MARKER, blob_head)
        _io.fsync_dir(tmp)
        put_in_place(tmp, out)  # --force over a file or an export: the old one goes only now
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@contextlib.contextmanager
def _unwrapped():
    """DCP's own exception (a BaseException holding each rank's) made the one it holds: a full disk's OSError, a
    damaged file's error, a SIGTERM's SystemExit or a Ctrl-C unwind as they would without DCP between."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        inner = next((f[0] for f in e.failures.values() if isinstance(f, tuple)), None)
        if inner is None:
            raise
        raise inner from None


def read_head(path: str | os.PathLike) -> dict | None:
    """A sharded export's format and config (:data:`MARKER`), or None when ``path`` is not one."""
    try:
        head = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return head if isinstance(head, dict) else None


def load_into(path: str | os.PathLike, state_dict: dict) -> None:
    """Fills ``state_dict`` (torchrec DLRM keys, tensors of the export's shapes) from the sharded export
    ``path``, in place."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings(), _unwrapped():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(path), no_dist=True)
