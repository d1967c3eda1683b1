"""Slow, obvious numpy twins of the Criteo parsing kernels (``kernels/criteo_parse.py``).

Split from ``naive.py``, which re-exports every name here: tests keep writing ``naive.criteo_parse_line``.
"""

from __future__ import annotations

import numpy as np  # noqa: F401

# ---- criteo_parse (kernels/criteo_parse.py): the reference DLRM preprocessing, line by line --------------

CRITEO_REASONS = (
    "ok",
    "too_few_fields",
    "too_many_fields",
    "bad_label",
    "bad_integer",
    "integer_overflow",
    "bad_hex",
    "hex_overflow",
    "nul_byte",
    "line_too_long",
)


def criteo_parse_line(line: bytes, max_ind_range: int | None = None, max_line: int = 1 << 20):
    """One raw Criteo line (no newline) -> (reason, column, label, dense[13], cats[26]) with plain Python.

    dlrm's data_utils.py: split on tabs, empty -> 0, int(x), negatives -> 0, log(float32(x) + 1),
    int(x, 16) % max_ind_range. Strict checks on top, in the kernel's order of precedence.
    """
    import re

    if len(line) > max_line:
        return "line_too_long", 0, None, None, None
    if line.endswith(b"\r"):
        line = line[:-1]
    if b"\0" in line:
        return "nul_byte", line[: line.index(b"\0")].count(b"\t") + 1, None, None, None
    fields = line.split(b"\t")
    if len(fields) < 40:
        return "too_few_fields", len(fields), None, None, None
    if len(fields) > 40:
        return "too_many_fields", len(fields), None, None, None
    if fields[0] not in (b"0", b"1"):
        return "bad_label", 1, None, None, None
    dense = []
    for j, x in enumerate(fields[1:14]):
        if x == b"":
            x = b"0"
        if not re.fullmatch(rb"[+-]?[0-9]+", x):
            return "bad_integer", j + 2, None, None, None
        v = int(x)
        if not -(2**63) <= v < 2**63:
            return "integer_overflow", j + 2, None, None, None
        v = max(v, 0)
        dense.append(np.log(np.float32(v) + np.float32(1)))
    cats = []
    for j, x in enumerate(fields[14:]):
        if x == b"":
            x = b"0"
        if not re.fullmatch(rb"[0-9a-fA-F]+", x):
            return "bad_hex", j + 15, None, None, None
        if len(x) > 16:
            return "hex_overflow", j + 15, None, None, None
        v = int(x, 16)
        cats.append(v % max_ind_range if max_ind_range else v)
    return "ok", 0, float(fields[0] == b"1"), dense, cats


def criteo_split_lines(data: bytes) -> list[bytes]:
    """The lines of a raw file: split at newlines; a final newline does not start another line."""
    if not data:
        return []
    lines = data.split(b"\n")
    return lines[:-1] if data.endswith(b"\n") else lines


def criteo_format_line(label: int, dense, cats) -> bytes:
    """One raw Criteo line: negative = missing (empty field); categories as hex, at least 8 digits."""
    parts = [str(int(label))]
    parts += ["" if v < 0 else str(int(v)) for v in dense]
    parts += ["" if v < 0 else format(int(v), "08x") for v in cats]
    return ("\t".join(parts) + "\n").encode()


def criteo_reference(
    files: list[bytes], layout: str, max_ind_range=None, min_count: int = 1, skip_bad: bool = False
):
    """The whole dlrm-style preprocessing of raw file contents (in order) with dicts and sorted().

    Returns ({split: (dense float32 [n,13], sparse int32 [n,26,1], labels float32 [n])}, table_sizes).
    """
    rows_per_file, labels, dense, cats = [], [], [], []
    for data in files:
        rows = 0
        for line in criteo_split_lines(data):
            reason, _, label, d, c = criteo_parse_line(line, max_ind_range)
            if reason != "ok":
                assert skip_bad, reason
                continue
            labels.append(label)
            dense.append(d)
            cats.append(c)
            rows += 1
        rows_per_file.append(rows)
    n = len(labels)
    id_maps, sizes = [], []
    for t in range(26):
        counts = {}
        for c in cats:
            counts[c[t]] = counts.get(c[t], 0) + 1
        if min_count > 1:
            frequent = sorted(v for v, k in counts.items() if k >= min_count)
            ids = {v: 0 for v in counts}
            ids.update({v: i + 1 for i, v in enumerate(frequent)})
            sizes.append(len(frequent) + 1)
        else:
            ids = {v: i for i, v in enumerate(sorted(counts))}
            sizes.append(len(ids))
        id_maps.append(ids)
    sparse = [[[id_maps[t][c[t]]] for t in range(26)] for c in cats]
    if layout == "kaggle":
        days = [n // 7 + (d < n % 7) for d in range(7)]  # dlrm: the first n % 7 days get one more row
        last = days[-1]
    else:
        last = rows_per_file[-1]
    train_end = n - last
    test_end = train_end + (last + 1) // 2
    bounds = {"train": (0, train_end), "test": (train_end, test_end), "val": (test_end, n)}
    out = {}
    for split, (a, b) in bounds.items():
        out[split] = (
            np.array(dense[a:b], np.float32).reshape(-1, 13),
            np.array(sparse[a:b], np.int32).reshape(-1, 26, 1),
            np.array(labels[a:b], np.float32),
        )
    return out, sizes


# ---- kernels/criteo_parse.py: build_id_table and map_categories -----------------------------------------
def criteo_id_maps(uniques, offsets, remap):
    """One dict per table: raw value ``uniques[k]`` -> id ``remap[k]`` for k in ``offsets[t]:offsets[t+1]``."""
    return [
        {int(uniques[k]): int(remap[k]) for k in range(offsets[t], offsets[t + 1])}
        for t in range(len(offsets) - 1)
    ]


def criteo_map_categories(raw, id_maps):
    """``out[i, t] = id_maps[t][raw[i, t]]`` (-1 where the value is missing) and the number missing."""
    raw = np.asarray(raw)
    out = np.full(raw.shape, -1, dtype=np.int32)
    missing = 0
    for i in range(raw.shape[0]):
        for t in range(raw.shape[1]):
            v = int(raw[i, t])
            if v in id_maps[t]:
                out[i, t] = id_maps[t][v]
            else:
                missing += 1
    return out, missing
