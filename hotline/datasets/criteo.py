"""Criteo Kaggle / Terabyte preprocessing: raw tab-separated text -> a Hotline dataset directory.

Same conversion as the reference DLRM (facebookresearch/dlrm ``data_utils.py``), so results compare:
missing integers -> 0, negative integers -> 0, dense = ``log(x + 1)`` in float32, categories parsed as hex
(missing -> 0), optionally taken modulo ``max_ind_range``, then mapped per table to contiguous ids in the
order of the sorted unique raw values over all the data. With ``min_count`` T > 1, the raw values seen
fewer than T times in total share id 0 (the rare bucket) and the frequent ones get ids 1..K in sorted
order; with T = 1 (the default, as dlrm) there is no rare bucket and ids are 0..K-1.

Splits, as dlrm (``np.array_split`` of the last day, whose first half is *test* and second half *val*):

* ``kaggle`` (one file, e.g. ``train.txt``): the rows form 7 equal "days" (the first ``N % 7`` days one row
  longer); days 1-6 are train; the 7th is split in halves: test = first ceil(n/2) rows, val = the rest.
* ``terabyte`` (several ``day_N`` files): all files but the last are train; the last is split as above.

``layout="auto"`` picks kaggle for one input file and terabyte for several. Files all named ``day_N`` (with
any extension) are ordered by N, so a shell glob's ``day_10`` before ``day_2`` does no harm; other names keep
the order given.

The work runs in two streaming passes, so memory stays bounded whatever the file size (only the per-table
distinct values grow, with the cardinality): pass 1 reads raw bytes in large blocks (plain or gzip, in a
reader thread), parses them with the Numba kernel :func:`hotline.kernels.criteo_parse.parse_lines`, and (in
a second thread, overlapping the next parse) appends labels / dense / raw categories to temporary files
inside the dataset writer's temporary directory and counts the distinct raw values per table (16 bytes per
distinct value); pass 2 builds a raw value -> id hash table per table (12-48 bytes per distinct value),
maps the raw categories with :func:`~hotline.kernels.criteo_parse.map_categories` and writes the splits.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hotline._paths import file_problem
from hotline._progress import bar_disable
from hotline.datasets.criteo_raw import (
    BLOCK_BYTES,
    CHUNK_ROWS,
    KAGGLE_DAYS,
    LAYOUTS,
    ON_BAD_LINE,
    CriteoFormatError,
    bad_line_error,
    is_gzip,
    raw_fingerprint,
    read_blocks,
)
from hotline.datasets.format import DatasetWriter
from hotline.kernels.criteo_parse import (
    LINE_TOO_LONG,
    NUM_CATEGORICAL,
    NUM_DENSE,
    REASONS,
    IdTable,
    build_id_table,
    map_categories,
    parse_lines,
)
from hotline.pipeline.threads import Producer


class _UniqueCounter:
    """Sorted unique values and their counts, merged lazily so adding a block costs O(block log block)."""

    def __init__(self):
        self.values = np.empty(0, np.uint64)
        self.counts = np.empty(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, values: np.ndarray, counts: np.ndarray) -> None:
        self._pending.append((values, counts))
        self._pending_size += values.shape[0]
        # Merging only when the pending values outgrow the merged ones keeps the total work O(n log n).
        if self._pending_size > max(self.values.shape[0], 1 << 16):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        values = np.concatenate([self.values, *(v for v, _ in self._pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self._pending)])
        self._pending, self._pending_size = [], 0
        order = np.argsort(values, kind="stable")
        values, counts = values[order], counts[order]
        starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
        self.values = values[starts]
        self.counts = np.add.reduceat(counts, starts) if counts.size else counts

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self._merge()
        return self.values, self.counts


def _over_size_limit(f) -> bool:
    """Whether ``f`` reached this process's file-size limit (RLIMIT_FSIZE), rather than a full disk."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return limit != resource.RLIM_INFINITY and os.fstat(f.fileno()).st_size >= limit - (1 << 16)


class _Pass1Sink:
    """Appends parsed rows to the temporary files and counts the categories in a background thread, so this
    serial numpy work overlaps with parsing the next block (the Numba kernels release the GIL)."""

    def __init__(self, labels_file, dense_file, cats_file):
        self.files = (labels_file, dense_file, cats_file)
        self.counters = [_UniqueCounter() for _ in range(NUM_CATEGORICAL)]
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="criteo-pass1")
        self._pending: Future | None = None

    def _store(self, labels: np.ndarray, dense: np.ndarray, cats: np.ndarray) -> None:
        for a, f in zip((labels, dense, cats), self.files):
            try:
                a.tofile(f)
            except OSError as e:  # numpy says only "N requested and M written": name the file, say why
                errno_ = e.errno or (errno.EFBIG if _over_size_limit(f) else errno.ENOSPC)
                raise OSError(errno_, f"{os.strerror(errno_)}: cannot write {Path(f.name).name}") from e
        # One contiguous row per table makes the per-table sort cache friendly.
        for t, column in enumerate(np.ascontiguousarray(cats.T)):
            self.counters[t].add(*np.unique(column, return_counts=True))

    def submit(self, labels: np.ndarray, dense: np.ndarray, cats: np.ndarray) -> None:
        self.wait()  # one block in flight: keeps the order of rows and bounds memory
        self._pending = self._executor.submit(self._store, labels, dense, cats)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)


@dataclass
class _FileStats:
    """What pass 1 learned about one raw file."""

    path: Path
    rows: int = 0
    lines: int = 0
    bad_lines: dict[str, int] = field(default_factory=dict)


def _pass1_file(
    stats: _FileStats,
    max_ind_range: int | None,
    on_bad_line: str,
    block_bytes: int,
    sink: _Pass1Sink,
    bar,
) -> None:
    """Parses one raw file block by block, appending good rows to the sinks and counting categories."""
    path = stats.path
    bad_counts = np.zeros(len(REASONS), np.int64)
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip(path) else raw
        reader = Producer("hotline-criteo-read", depth=2).start(read_blocks(stream, raw, block_bytes))
        last_pos = 0
        try:
            for block, pos in reader:
                if block is None:
                    if on_bad_line == "error":
                        raise bad_line_error(path, stats.lines + 1, "line_too_long", 0, None)
                    bad_counts[LINE_TOO_LONG] += 1
                    stats.lines += 1
                    continue
                parsed = parse_lines(block, max_ind_range)
                n = parsed.reason.shape[0]
                bad = parsed.reason != 0
                labels, dense, cats = parsed.labels, parsed.dense, parsed.cats
                if bad.any():
                    first = int(np.argmax(bad))
                    if on_bad_line == "error":
                        code = int(parsed.reason[first])
                        text = block[parsed.starts[first] : parsed.ends[first]].tobytes()
                        raise bad_line_error(
                            path, stats.lines + first + 1, REASONS[code], int(parsed.column[first]), text
                        )
                    bad_counts += np.bincount(parsed.reason, minlength=len(REASONS))
                    keep = ~bad
                    labels, dense, cats = labels[keep], dense[keep], cats[keep]
                stats.lines += n
                stats.rows += labels.shape[0]
                sink.submit(labels, dense, cats)
                bar.update(pos - last_pos)
                last_pos = pos
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise CriteoFormatError(
                path, None, None, f"truncated or corrupt gzip stream after line {stats.lines} ({e})"
            ) from e
        finally:
            reader.close()
    bad_counts[0] = 0
    stats.bad_lines = {REASONS[i]: int(c) for i, c in enumerate(bad_counts) if c}


# ----------------------------------------------------------------------------------------------- splits


def detect_layout(paths: list[Path], layout: str = "auto") -> str:
    """The split layout: ``kaggle`` for one input file, ``terabyte`` for several, unless given explicitly."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "terabyte" and len(paths) < 2:
        raise ValueError(
            "--layout terabyte trains on every day file but the last (which becomes val and test): with one "
            f"file ({paths[0] if paths else 'none'}) there would be 0 training rows; give several day_N files, "
            "or use --layout kaggle"
        )
    if layout != "auto":
        return layout
    return "kaggle" if len(paths) == 1 else "terabyte"


def order_inputs(paths: list[Path]) -> list[Path]:
    """Files all named ``day_N[.ext]`` sorted by N (a shell glob puts day_10 before day_2); else as given."""
    numbers = [re.fullmatch(r"day_(\d+)(\..*)?", p.name) for p in paths]
    if all(numbers):
        return [p for _, p in sorted(zip((int(m.group(1)) for m in numbers), paths), key=lambda x: x[0])]
    return list(paths)


def split_sizes(layout: str, rows_per_file: list[int]) -> dict[str, int]:
    """Rows of train / val / test, in file order (train rows first, then test, then val; see module doc)."""
    total = int(sum(rows_per_file))
    if layout == "kaggle":
        per_day, extra = divmod(total, KAGGLE_DAYS)
        days = [per_day + (d < extra) for d in range(KAGGLE_DAYS)]
        last = days[-1]
    elif layout == "terabyte":
        last = int(rows_per_file[-1]) if rows_per_file else 0
    else:
        raise ValueError(f"layout must be kaggle or terabyte, got {layout!r}")
    # dlrm: test_indices, val_indices = np.array_split(last_day, 2) -> test gets the larger first half.
    test = -(-last // 2)
    return {"train": total - last, "test": test, "val": last - test}


# ----------------------------------------------------------------------------------------------- preprocess


def _id_table(counters: list[_UniqueCounter], min_count: int) -> tuple[IdTable, list[int]]:
    """The raw value -> id table of every category table, and the table sizes.

    Ids follow the sorted raw values; with ``min_count`` > 1, rare values get id 0 and frequent ones 1..K.
    """
    values, remaps, sizes = [], [], []
    for counter in counters:
        v, c = counter.result()
        if min_count > 1:
            frequent = c >= min_count
            remap = np.where(frequent, np.cumsum(frequent), 0)
            sizes.append(int(frequent.sum()) + 1)
        else:
            remap = np.arange(v.shape[0])
            sizes.append(int(v.shape[0]))
        values.append(v)
        remaps.append(remap.astype(np.int32))
    if max(sizes) > np.iinfo(np.int32).max:
        raise ValueError(f"a table has {max(sizes)} ids, more than int32 holds; use --max-ind-range")
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum([v.shape[0] for v in values], out=offsets[1:])
    return build_id_table(np.concatenate(values), offsets, np.concatenate(remaps)), sizes


def _pass1(
    stats: list[_FileStats],
    tmp: dict[str, Path],
    max_ind_range: int | None,
    on_bad_line: str,
    block_bytes: int,
    progress: bool,
) -> list[_UniqueCounter]:
    """Pass 1: parses every file into the temporary files; returns the per-table unique value counters."""
    from tqdm.auto import tqdm

    total_bytes = sum(s.path.stat().st_size for s in stats)
    with (
        open(tmp["labels"], "wb") as lf,
        open(tmp["dense"], "wb") as df,
        open(tmp["cats"], "wb") as cf,
        tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc="criteo pass 1 (parse)",
            disable=bar_disable(progress),
        ) as bar,
    ):
        sink = _Pass1Sink(lf, df, cf)
        try:
            for s in stats:
                _pass1_file(s, max_ind_range, on_bad_line, block_bytes, sink, bar)
        finally:
            sink.close()
    return sink.counters


def _npy_data_writer(path: Path):
    """``path`` (a .npy file the writer created) opened for writing its data from the first byte on."""
    f = open(path, "r+b")
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        np.lib.format.read_array_header_1_0(f)
    else:
        np.lib.format.read_array_header_2_0(f)
    return f


def _read_exact(f, nbytes: int) -> bytes:
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise RuntimeError(f"temporary file {f.name} ended early: {len(data)} of {nbytes} bytes")
    return data


def _pass2(
    writer: DatasetWriter, tmp: dict[str, Path], id_table: IdTable, sizes: dict[str, int], progress: bool
) -> None:
    """Pass 2: fills the splits' arrays from the temporary files, mapping raw categories to ids.

    The arrays are written with plain sequential writes rather than through their memory maps: the pages
    of a written memory map stay in this process's resident memory, plain writes keep it bounded.
    """
    from tqdm.auto import tqdm

    with (
        open(tmp["labels"], "rb") as lf,
        open(tmp["dense"], "rb") as df,
        open(tmp["cats"], "rb") as cf,
        tqdm(
            total=sum(sizes.values()),
            unit="rows",
            unit_scale=True,
            desc="criteo pass 2 (map ids)",
            disable=bar_disable(progress),
        ) as bar,
    ):
        ids = np.empty((CHUNK_ROWS, NUM_CATEGORICAL), np.int32)
        # Rows are stored in file order: train, then the last day's test half, then its val half.
        for split in ("train", "test", "val"):
            n = sizes[split]
            writer.create_split(split, n)  # allocates the .npy files (its memory maps are dropped at once)
            with (
                _npy_data_writer(writer.tmp / f"{split}_labels.npy") as labels_out,
                _npy_data_writer(writer.tmp / f"{split}_dense.npy") as dense_out,
                _npy_data_writer(writer.tmp / f"{split}_sparse.npy") as sparse_out,
            ):
                for a in range(0, n, CHUNK_ROWS):
                    m = min(n, a + CHUNK_ROWS) - a
                    labels_out.write(_read_exact(lf, 4 * m))
                    dense_out.write(_read_exact(df, 4 * NUM_DENSE * m))
                    raw = np.fromfile(cf, np.uint64, m * NUM_CATEGORICAL).reshape(m, NUM_CATEGORICAL)
                    map_categories(raw, id_table, ids[:m])
                    ids[:m].tofile(sparse_out)
                    bar.update(m)


def preprocess(
    raw_paths: list[str | os.PathLike] | str | os.PathLike,
    out: str | os.PathLike,
    *,
    layout: str = "auto",
    max_ind_range: int | None = None,
    min_count: int = 1,
    on_bad_line: str = "error",
    progress: bool = True,
    block_bytes: int = BLOCK_BYTES,
    overwrite: bool = False,
) -> Path:
    """Converts raw Criteo files (Kaggle ``train.txt`` or Terabyte ``day_N``, plain or gzip) into a dataset
    directory at ``out`` (see the module docstring for the conversion and the splits); returns ``out``.

    Raises :class:`CriteoFormatError` for a bad line (``on_bad_line="error"``), a truncated gzip file, or
    input without rows; nothing is left at ``out`` then (an existing dataset there is kept). An existing
    ``out`` is replaced only if it is a Hotline dataset and ``overwrite`` (the CLI's ``--force``), and
    never when it holds one of the raw files; anything else there is a DatasetError before any read.
    """
    paths = [Path(raw_paths)] if isinstance(raw_paths, (str, os.PathLike)) else [Path(p) for p in raw_paths]
    if not paths:
        raise ValueError("no raw Criteo files given")
    for p in paths:
        problem = file_problem(p)  # a directory, a FIFO, /dev/null or a symlink loop is named as what it is
        if problem == "does not exist":
            raise FileNotFoundError(f"raw Criteo file {p} does not exist")
        if problem is not None:
            raise ValueError(f"raw Criteo file {p} {problem}")
    if len({p.resolve() for p in paths}) != len(paths):
        raise ValueError(f"a raw file is given twice: {[str(p) for p in paths]}")
    if on_bad_line not in ON_BAD_LINE:
        raise ValueError(f"on_bad_line must be one of {ON_BAD_LINE}, got {on_bad_line!r}")
    if max_ind_range is not None and max_ind_range <= 0:
        raise ValueError(f"max_ind_range must be positive, got {max_ind_range}")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    layout = detect_layout(paths, layout)
    stats = [_FileStats(p) for p in order_inputs(paths)]
    t0 = time.perf_counter()

    # Table sizes are known only after pass 1; the writer needs them only when the splits are created.
    writer = DatasetWriter(out, [0] * NUM_CATEGORICAL, pooling_factor=1, overwrite=overwrite, inputs=paths)
    with writer:
        tmp = {k: writer.tmp / f"_pass1_{k}.bin" for k in ("labels", "dense", "cats")}
        try:
            try:
                counters = _pass1(stats, tmp, max_ind_range, on_bad_line, block_bytes, progress)
            except OSError as e:
                if e.errno is None or e.filename is not None:
                    raise
                what = (
                    e.strerror
                    if "cannot write" in str(e.strerror)
                    else f"{e.strerror}: cannot write the rows parsed in pass 1"
                )
                raise OSError(e.errno, f"{what} of dataset {out}; the partial output was removed") from e
            total = sum(s.rows for s in stats)
            if total == 0:
                skipped = sum(sum(s.bad_lines.values()) for s in stats)
                why = f"all {skipped} lines were bad and skipped" if skipped else "the input has no lines"
                raise CriteoFormatError(", ".join(str(s.path) for s in stats), None, None, f"no rows: {why}")
            id_table, writer.table_sizes = _id_table(counters, min_count)
            del counters
            _pass2(writer, tmp, id_table, split_sizes(layout, [s.rows for s in stats]), progress)
        finally:
            for f in tmp.values():
                f.unlink(missing_ok=True)  # before finish(), which moves the whole directory into place
        seconds = time.perf_counter() - t0
        bad_total: dict[str, int] = {}
        for s in stats:
            for k, v in s.bad_lines.items():
                bad_total[k] = bad_total.get(k, 0) + v
        source = {
            "kind": "criteo",
            "layout": layout,
            "files": [
                {
                    "name": s.path.name,
                    "bytes": s.path.stat().st_size,
                    "sha256_size_head_tail": raw_fingerprint(s.path),
                    "rows": s.rows,
                }
                for s in stats
            ],
            "options": {"max_ind_range": max_ind_range, "min_count": min_count},
            "rare_id": 0 if min_count > 1 else None,
        }
        extra = {
            "bad_lines": bad_total,
            "bad_lines_per_file": {s.path.name: s.bad_lines for s in stats},
            "on_bad_line": on_bad_line,
            "preprocess_seconds": round(seconds, 3),
            "rows_per_second": round(total / seconds, 1) if seconds > 0 else None,
        }
        return writer.finish(source=source, extra=extra)
