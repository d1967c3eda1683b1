"""An export too large for one ``torch.save``: torchrec's DLRM in torch.distributed.checkpoint's format (DCP),
a directory written chunk by chunk.

The directory holds DCP's files (``.metadata`` and one ``.distcp`` file per chunk) and ``hotline-export.json``
(the export's format and config, as a torch.save export records them). Its keys are the torchrec DLRM's
``state_dict`` keys (``sparse_arch.embedding_bag_collection.embedding_bags.t_cat_{t}.weight``, the dense
layers' own), each table stored as row ranges of :data:`~hotline.training.checkpoint_rows.CHUNK_BYTES`:
``torch.distributed.checkpoint.load`` fills any state_dict of those keys and shapes in place, one stored chunk
in memory at a time (torchrec's DLRM, a bare EmbeddingBagCollection under the prefix, plain tensors; no
process group needed). :func:`load` rebuilds the DLRM.

The tables are written in row order, one chunk at a time: from a disk-store checkpoint's rows file through
:class:`~hotline.training.checkpoint_rows.RowOrderedChunks` (a scratch file in the export's own temporary
directory), from a checkpoint's in-memory tables by slicing. Every chunk is a file of its own (DCP's writer
keeps each file's last tensor per key until the file is closed). The directory is written under a temporary
name (``.OUT.hotline-tmp-PID-RANDOM``) and renamed when complete: a killed export leaves no directory under
the final name, and the next Hotline run there removes its temporary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from hotline import _io

MARKER = "hotline-export.json"
"""The file of a sharded export's format and config (the directory's own proof that it is one)."""


def table_key(name: str) -> str:
    """The torchrec DLRM's state_dict key of the embedding table ``name`` (``t_cat_0``)."""
    return f"sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"


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
            for k, (t, lo, m, _) in enumerate(source.grid):
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


def write(out: Path, blob_head: dict, dense: dict, open_source, names: list[str], sizes: list[int],
          dim: int) -> Path:  # fmt: skip
    """Writes the sharded export ``out`` (a directory that does not exist, or a file that ``--force``
    replaces): ``dense`` (torchrec state_dict entries) whole, the tables chunk by chunk from the source
    ``open_source(scratch path)`` returns (``grid``, ``chunk(k)``, ``close()``), ``blob_head`` (format and
    config) as :data:`MARKER`; atomically."""
    import torch.distributed.checkpoint as dcp

    _io.remove_stale_temporaries(out.parent)
    tmp = _io.temporary_name(out)
    tmp.mkdir()
    source = None
    try:
        source = open_source(tmp / ".rows-in-order")
        writer = dcp.FileSystemWriter(tmp, single_file_per_rank=False, sync_files=True, thread_count=1)
        planner = _planner(dense, source, names, sizes, dim)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(dense, storage_writer=writer, planner=planner, no_dist=True)
        _io.write_json(tmp / MARKER, blob_head)
        _io.fsync_dir(tmp)
        if out.is_file() or out.is_symlink():  # --force over a file: moved aside, then removed
            aside = _io.temporary_name(out)
            os.replace(out, aside)
            os.replace(tmp, out)
            aside.unlink()
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if source is not None:
            source.close()
    _io.fsync_dir(out.parent)
    return out


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

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(path), no_dist=True)
