"""A Hotline checkpoint as torchrec's DLRM (``torchrec.models.dlrm.DLRM``, or ``DLRM_DCN`` for the ``dcn``
interaction), weights included.

The architectures map one to one: Hotline's DenseArch is torchrec's DenseArch (an MLP with ReLU after every
layer), OverArch the same (ReLU between layers, none after the last), each table one
``EmbeddingBagConfig`` (sum pooling, feature ``cat_{t}``, table ``t_cat_{t}``) in table order. Only the dot
interaction's column order differs: Hotline takes the pairs (i, j), i > j, of the strict lower triangle row by
row, torchrec those of the strict upper triangle (i < j) row by row, so the first top-MLP layer's input columns
are permuted. The ``dcn`` interaction is torchrec's ``InteractionDCNArch`` with the same parameter names and
layout (``inter_arch.crossnet.{W,V}_kernels.l``, ``bias.l``), copied as they are. ``cat`` interaction and a
one-layer top MLP have no torchrec counterpart and are refused.

The exported file is ``torch.save`` of ``{"format", "config", "state_dict"}`` (tensors, lists and strings
only: it loads with ``weights_only=True``), or, for tables too large to hold twice in memory, a
torch.distributed.checkpoint directory of the same keys written chunk by chunk
(:mod:`hotline.training.export_sharded`; :func:`choose_format`); :func:`load_torchrec_dlrm` rebuilds the
module from either.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hotline import _io
from hotline.models.dlrm import DLRM, DLRMConfig
from hotline.training.export_sharded import EXPORT_FORMAT
from hotline.training.inference import checkpoint_payload, model_spec

TARGETS = ("torchrec-dlrm",)


class ExportError(ValueError):
    """A model that torchrec's DLRM cannot express, or an exported file that is not one of ours."""


def feature_name(t: int) -> str:
    return f"cat_{t}"


def _interaction_permutation(num_tables: int) -> torch.Tensor:
    """For torchrec's interaction column c (pair i < j, upper triangle row-major), Hotline's column index."""
    F = num_tables + 1
    li, lj = torch.tril_indices(F, F, offset=-1)
    hotline_pos = {(int(i), int(j)): c for c, (i, j) in enumerate(zip(li, lj))}
    ui, uj = torch.triu_indices(F, F, offset=1)
    return torch.tensor([hotline_pos[(int(j), int(i))] for i, j in zip(ui, uj)], dtype=torch.long)


def _build(config: dict):
    """An (untrained) torchrec DLRM of ``config`` (table_sizes, embedding_dim, bottom_mlp, top_mlp; and with
    ``interaction`` dcn, a DLRM_DCN of dcn_num_layers and dcn_low_rank_dim)."""
    from torchrec.models.dlrm import DLRM as TorchrecDLRM
    from torchrec.models.dlrm import DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = [
        EmbeddingBagConfig(
            name=f"t_{feature_name(t)}",
            embedding_dim=int(config["embedding_dim"]),
            num_embeddings=int(n),
            feature_names=[feature_name(t)],
            pooling=PoolingType.SUM,
        )
        for t, n in enumerate(config["table_sizes"])
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    common = {
        "embedding_bag_collection": ebc,
        "dense_in_features": int(config["bottom_mlp"][0]),
        "dense_arch_layer_sizes": [int(x) for x in config["bottom_mlp"][1:]],
        "over_arch_layer_sizes": [int(x) for x in config["top_mlp"]],
    }
    if config.get("interaction", "dot") == "dcn":
        return DLRM_DCN(
            **common,
            dcn_num_layers=int(config["dcn_num_layers"]),
            dcn_low_rank_dim=int(config["dcn_low_rank_dim"]),
        )
    return TorchrecDLRM(**common)


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def torchrec_dlrm(model: DLRM, tables: list[np.ndarray] | None):
    """torchrec's DLRM with the weights of Hotline's ``model`` and embedding ``tables`` (original row order);
    ``tables`` None: one-row tables (the dense weights only, for a sharded export)."""
    cfg = model.config
    if cfg.interaction == "cat":
        raise ExportError(
            "--arch-interaction-op cat has no torchrec DLRM counterpart (torchrec's are dot and dcn)"
        )
    if len(cfg.top_mlp) < 2:
        raise ExportError(f"--arch-mlp-top {cfg.top_mlp}: torchrec's OverArch needs at least two layers")
    config = {
        "table_sizes": list(cfg.table_sizes) if tables is not None else [1] * cfg.num_tables,
        "embedding_dim": cfg.embedding_dim,
        "bottom_mlp": list(cfg.bottom_mlp),
        "top_mlp": list(cfg.top_mlp),
        **_dcn_config(cfg),
    }
    out = _build(config)
    D = cfg.embedding_dim
    perm = _interaction_permutation(cfg.num_tables)
    with torch.no_grad():
        for theirs, ours in zip(_linears(out.dense_arch), _linears(model.dense_arch), strict=True):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
        for k, (theirs, ours) in enumerate(
            zip(_linears(out.over_arch), _linears(model.over_arch), strict=True)
        ):
            w = ours.weight.detach().cpu()
            if (
                k == 0 and cfg.interaction == "dot"
            ):  # [dense D | interaction pairs]: pairs in torchrec's order
                w = torch.cat([w[:, :D], w[:, D:][:, perm]], dim=1)
            theirs.weight.copy_(w)
            theirs.bias.copy_(ours.bias)
        if cfg.interaction == "dcn":
            ours = model.inter_arch.crossnet.state_dict()  # the same names: strict loading checks them
            out.inter_arch.crossnet.load_state_dict({k: v.detach().cpu() for k, v in ours.items()})
        bags = out.sparse_arch.embedding_bag_collection.embedding_bags
        for t, w in enumerate(tables or []):
            bags[f"t_{feature_name(t)}"].weight.copy_(torch.from_numpy(np.asarray(w)))
    out.eval()
    return out


def _dcn_config(cfg: DLRMConfig) -> dict:
    """The cross net's shape in an export's config (nothing for dot: an older export reads the same)."""
    if cfg.interaction != "dcn":
        return {}
    return {
        "interaction": "dcn",
        "dcn_num_layers": cfg.dcn_num_layers,
        "dcn_low_rank_dim": cfg.dcn_low_rank_dim,
    }


def hotline_model(payload: dict, path: str | os.PathLike, flags: dict | None = None) -> DLRM:
    """Hotline's DLRM with a checkpoint payload's dense weights."""
    spec = model_spec(payload, path, flags)
    model = DLRM(DLRMConfig(table_sizes=list(payload["table_sizes"]), **spec.arch()))
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise ExportError(f"{path} does not match the --arch-* flags: {e}") from None
    return model.eval()


FORMATS = ("auto", "torch-save", "dcp")
"""How an export is written: ``torch-save`` one file, ``dcp`` a torch.distributed.checkpoint directory
(:mod:`hotline.training.export_sharded`), ``auto`` the one :func:`choose_format` picks."""
_ALLOWANCE = 512 << 20
"""Memory beside the tables that a torch.save export takes (the libraries, the dense weights, the pickler)."""


def choose_format(table_bytes: int, available: int | None) -> str:
    """``dcp`` when a torch.save export, which holds the tables twice (the checkpoint's and the module's), and
    :data:`_ALLOWANCE` would not fit in ``available`` bytes of memory (the cgroup's room or the machine's, the
    smaller: :func:`hotline.training.host_memory.host_memory`); else ``torch-save``."""
    if available is not None and 2 * table_bytes + _ALLOWANCE > available:
        return "dcp"
    return "torch-save"


def _check_disk(out, need: int, what: str) -> None:
    """ExportError, before anything is written, when ``out``'s filesystem has less than ``need`` bytes free."""
    import shutil

    from hotline.units import format_size

    free = shutil.disk_usage(os.path.dirname(os.path.abspath(out))).free
    if free < need:
        raise ExportError(
            f"{out}: the export needs {format_size(need)} of free disk ({what}), its filesystem has "
            f"{format_size(free)}: free some space or write it elsewhere; nothing was written"
        )


def _guard_out(checkpoint, out, force: bool) -> Path:
    """Where the export goes (:func:`hotline.outputs.guard`): an existing file is replaced only with ``force``,
    and so is a directory, only one that is a sharded export (:func:`export_sharded.is_export`)."""
    from hotline.outputs import Output, guard, judge
    from hotline.training import export_sharded

    what = "export_torchrec_dlrm out"
    if not export_sharded.is_export(out):
        return guard(what, out, [("checkpoint", checkpoint)], force=force)
    if not force:
        raise ExportError(f"{out} is a Hotline export: pass --force to replace it, or choose another name")
    return judge([Output(what, out, kind="dir")], [("checkpoint", checkpoint)], force=True)[what]


def _source(checkpoint, chunk_bytes: int):
    """``(files, payloads, open_source)`` of the checkpoint: its rank files and their payloads (rank 0's
    first), and its rows in row order for :func:`export_sharded.write`."""
    from hotline.training import export_sharded
    from hotline.training.export_rows import StreamedRows

    files = export_sharded.rank_files(checkpoint, ExportError)
    if len(files) > 1:
        payloads = export_sharded.read_ranks(files, ExportError)
        return files, payloads, export_sharded.rank_source(files, payloads, chunk_bytes, ExportError)
    payload = checkpoint_payload(checkpoint)
    if "rows" not in payload:
        chunk_rows = max(1, chunk_bytes // (4 * int(payload["tables"][0].shape[1])))
        return files, [payload], lambda scratch: export_sharded.TableChunks(payload["tables"], chunk_rows)
    parts = [(files[0], payload["rows"])]
    sizes = payload["table_sizes"]
    return (
        files,
        [payload],
        lambda scratch: StreamedRows(parts, sizes, payload["hot"], scratch, chunk_bytes, ExportError),
    )


def export_torchrec_dlrm(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    flags: dict | None = None,
    force: bool = False,
    format: str = "auto",
    chunk_bytes: int | None = None,
) -> dict:
    """Writes checkpoint ``checkpoint`` as torchrec's DLRM to ``out`` (atomically): one torch.save file, or a
    torch.distributed.checkpoint directory written chunk by chunk of ``chunk_bytes`` (``format``, see
    :data:`FORMATS`); returns its config and ``"storage"`` (the format written). ``checkpoint``: a
    one-process checkpoint, or one of N ranks (any rank's file, or their common stem: every rank's file is
    read). An existing ``out`` is replaced only with ``force``: a file, or a sharded export (a directory of
    any other kind never), which stays whole until the new one is complete; the checkpoint itself never
    (:func:`hotline.outputs.guard`). The free disk is checked, and a disk-store checkpoint's rows files' headers,
    before anything is written; their sha256 is checked on the one pass that reads them, before anything is
    put under ``out``'s name."""
    from hotline.training import checkpoint_rows, export_sharded
    from hotline.training.host_memory import host_memory

    if format not in FORMATS:
        raise ExportError(f"export format must be one of {', '.join(FORMATS)}, got {format!r}")
    replacing = export_sharded.is_export(out)
    out = _guard_out(checkpoint, out, force)
    chunk_bytes = chunk_bytes or checkpoint_rows.CHUNK_BYTES
    files, payloads, open_source = _source(checkpoint, chunk_bytes)
    payload = payloads[0]
    model = hotline_model(payload, files[0], flags)
    sizes = [int(n) for n in payload["table_sizes"]]
    D = model.config.embedding_dim
    table_bytes = 4 * D * sum(sizes)
    if format == "auto":
        format = "dcp" if replacing else choose_format(table_bytes, host_memory().available)
    elif replacing and format != "dcp":
        raise ExportError(
            f"{out} is a sharded export (a directory): --force replaces it with --format dcp only"
        )
    dense_bytes = sum(4 * p.numel() for p in model.parameters()) + (1 << 20)
    chunk_rows = max(1, chunk_bytes // (4 * D))
    if format == "torch-save":
        need, what = table_bytes + dense_bytes, "its tables and dense weights"
    else:
        chunks = sum(-(-n // chunk_rows) for n in sizes)
        need, what = (
            table_bytes + dense_bytes + 8192 * chunks,
            "its tables, dense weights and a file per chunk",
        )
    _check_disk(out, need, what)
    for f, p in zip(files, payloads):
        if "rows" in p:
            n = len(range(int(p.get("rank", 0)), sum(sizes), len(files)))
            checkpoint_rows.check_rows(
                f, p["rows"], p["step"], {"rows": n, "dim": D}, ExportError, digest=False
            )
    config = {
        "table_sizes": sizes,
        "embedding_dim": D,
        "bottom_mlp": list(model.config.bottom_mlp),
        "top_mlp": list(model.config.top_mlp),
        **_dcn_config(model.config),
        "feature_names": [feature_name(t) for t in range(model.config.num_tables)],
        "dataset_fingerprint": payload["dataset_fingerprint"],
        "step": int(payload["step"]),
    }
    out = Path(out)
    _io.remove_stale_temporaries(out.parent)
    tmp = _io.temporary_name(out)
    source = open_source(_io.temporary_name(out))  # reads the rows files' orders only; a scratch file maybe
    try:
        spill = getattr(source, "spill_bytes", 0)
        if spill:  # the rows read before their chunk, beyond what memory holds
            _check_disk(out, need + spill, what + ", and the rows read before their chunk's")
        if format == "torch-save":
            tables = export_sharded.tables_of(source, sizes)
            module = torchrec_dlrm(model, tables)
            blob = {"format": EXPORT_FORMAT, "config": config, "state_dict": module.state_dict()}
            _io.atomic_write(out, lambda f: torch.save(blob, f))
            return {**config, "storage": format}
        names = [f"t_{feature_name(t)}" for t in range(len(sizes))]
        keys = {export_sharded.table_key(n) for n in names}
        dense = {k: v for k, v in torchrec_dlrm(model, None).state_dict().items() if k not in keys}
        head = {"format": EXPORT_FORMAT, "config": config}
        export_sharded.write(out, tmp, head, dense, source, names, sizes, D)
    finally:
        source.close()
    return {**config, "storage": format}


def load_torchrec_dlrm(path: str | os.PathLike):
    """The torchrec DLRM of an export (a file, or a sharded export's directory), and its config (feature
    names in table order)."""
    from hotline.training.checkpoint import safe_load

    if Path(path).is_dir():
        return _load_sharded(path)
    blob = safe_load(path, f"exported model {path}", ExportError)
    if not isinstance(blob, dict) or blob.get("format") != EXPORT_FORMAT:
        raise ExportError(f"{path} is not a Hotline torchrec-DLRM export (format {EXPORT_FORMAT})")
    try:
        module = _build(blob["config"])
        module.load_state_dict(blob["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # an edited or mixed-up export: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{path}: its config and weights do not make one torchrec DLRM ({first})") from None
    return module.eval(), blob["config"]


def _load_sharded(path: str | os.PathLike):
    """The torchrec DLRM of a sharded export's directory (:mod:`hotline.training.export_sharded`)."""
    from hotline.training import export_sharded

    head = export_sharded.read_head(path)
    if head is None or head.get("format") != EXPORT_FORMAT or not isinstance(head.get("config"), dict):
        raise ExportError(f"{path} is not a Hotline torchrec-DLRM export (no {export_sharded.MARKER} of it)")
    try:
        module = _build(head["config"])
        export_sharded.load_into(path, module.state_dict())
    except (KeyError, TypeError, ValueError, RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{path}: its config and weights do not make one torchrec DLRM ({first})") from None
    return module.eval(), head["config"]


def keyed_jagged(sparse: np.ndarray, feature_names: list[str], bag_sizes: list[int] | None = None):
    """A KeyedJaggedTensor of a batch's ids ``[B, T, L]`` (feature-major, L ids per bag), or of ``[B, C]`` bags
    of ``bag_sizes`` whose padding (-1) is dropped: variable-length bags are what a KJT's lengths are for."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if bag_sizes is None:
        B, T, L = sparse.shape
        values = torch.from_numpy(
            np.ascontiguousarray(sparse.transpose(1, 0, 2)).reshape(-1).astype(np.int64)
        )
        lengths = torch.full((T * B,), L, dtype=torch.int32)
        return KeyedJaggedTensor.from_lengths_sync(keys=list(feature_names), values=values, lengths=lengths)
    flat = sparse.reshape(sparse.shape[0], sum(bag_sizes))
    ends = np.cumsum(bag_sizes)
    bags = [flat[:, e - b : e] for b, e in zip(bag_sizes, ends)]  # per table [B, L_t]
    values = np.concatenate([bag[bag != -1] for bag in bags])  # row-major: sample by sample, in table order
    lengths = np.concatenate([(bag != -1).sum(axis=1) for bag in bags]).astype(np.int32)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(feature_names),
        values=torch.from_numpy(values.astype(np.int64)),
        lengths=torch.from_numpy(lengths),
    )
