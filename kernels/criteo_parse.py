"""Numba kernels for raw Criteo text: parse lines into arrays, map raw categories to ids, format lines.

A raw Criteo line is ``label \\t I1..I13 \\t C1..C26`` (40 tab-separated fields): the label is ``0`` or
``1``; ``I*`` are decimal integers; ``C*`` are hexadecimal category hashes (usually 8 digits); any feature
field may be empty (missing). Parsing follows the reference DLRM preprocessing (facebookresearch/dlrm
``data_utils.py``): missing and negative integers become 0, dense values become ``log(x + 1)`` in float32,
missing categories become the raw value 0, and raw categories are taken modulo ``max_ind_range`` if given.

Unlike the reference, every field is checked strictly; a line that does not parse gets a reason code
(:data:`REASONS`) and the 1-based column of the offending field, and the caller decides what to do.

Kernels: :func:`parse_lines` (raw bytes -> label/dense/category arrays), :func:`map_categories` (raw
category values -> ids through per-table open-addressing hash tables built by :func:`build_id_table`),
:func:`format_lines` (arrays -> raw Criteo bytes, used to write synthetic data in the raw format).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL
MAX_HEX_DIGITS = 16

# Reason codes of a line that does not parse (index into REASONS; 0 means the line is fine).
OK = 0
TOO_FEW_FIELDS = 1
TOO_MANY_FIELDS = 2
BAD_LABEL = 3
BAD_INTEGER = 4
INTEGER_OVERFLOW = 5
BAD_HEX = 6
HEX_OVERFLOW = 7
NUL_BYTE = 8
LINE_TOO_LONG = 9
# A valid line is under 1 KiB; a longer limit only bounds memory when a file has no newlines.
MAX_LINE_BYTES = 1 << 20
REASONS = (
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

_TAB = 9
_LF = 10
_CR = 13
# (2**63 - 1) // 10: a magnitude above this overflows int64 once another digit is appended.
_INT64_TENTH = 922337203685477580


@njit(cache=True, inline="always")
def _parse_int(buf, s, e):
    """Parses buf[s:e] as [+-]?[0-9]+ (empty -> 0). Returns (reason, value with negatives clamped to 0)."""
    if s == e:
        return OK, 0
    neg = False
    p = s
    if buf[p] == 45 or buf[p] == 43:  # '-' or '+'
        neg = buf[p] == 45
        p += 1
        if p == e:
            return BAD_INTEGER, 0
    # The last digit may reach 7 for +(2**63 - 1) and 8 for -(2**63).
    last_max = 8 if neg else 7
    mag = 0
    overflow = False
    for q in range(p, e):
        d = np.int64(buf[q]) - 48
        if d < 0 or d > 9:
            return BAD_INTEGER, 0
        if mag > _INT64_TENTH or (mag == _INT64_TENTH and d > last_max):
            overflow = True  # keep scanning: a later non-digit makes it a bad integer instead
        else:
            mag = mag * 10 + d
    if overflow:
        return INTEGER_OVERFLOW, 0
    if neg:
        return OK, 0
    return OK, mag


def _hex_table() -> np.ndarray:
    """Value of each byte as a hex digit, -1 for other bytes (a lookup: no mispredicted branches)."""
    table = np.full(256, -1, np.int8)
    for i, c in enumerate(b"0123456789abcdef"):
        table[c] = i
    for i, c in enumerate(b"ABCDEF"):
        table[c] = 10 + i
    return table


@njit(cache=True, inline="always")
def _parse_hex(buf, s, e, hex_value):
    """Parses buf[s:e] as 1-16 hex digits (empty -> 0). Returns (reason, uint64 value)."""
    v = np.uint64(0)
    bad = 0
    for q in range(s, e):
        d = hex_value[buf[q]]
        bad |= d
        v = (v << np.uint64(4)) | np.uint64(d & 15)
    if bad < 0:
        return BAD_HEX, np.uint64(0)
    if e - s > MAX_HEX_DIGITS:
        return HEX_OVERFLOW, np.uint64(0)
    return OK, v


@njit(cache=True, inline="always")
def _parse_fields(buf, s, e, modulus, hex_value, i, labels, dense, cats):
    """Parses the fields of buf[s:e] into row i, stopping at the first bad one. Returns (reason, column)."""
    p = s
    col = 0
    while p <= e:
        q = p
        while q < e and buf[q] != _TAB:
            q += 1
        if col == 0:
            if q - p != 1 or (buf[p] != 48 and buf[p] != 49):
                return BAD_LABEL, 1
            labels[i] = np.float32(buf[p] - 48)
        elif col <= NUM_DENSE:
            r, v = _parse_int(buf, p, q)
            if r != OK:
                return r, col + 1
            # As dlrm: log(float32(x) + 1) in float32.
            dense[i, col - 1] = np.log(np.float32(v) + np.float32(1.0))
        elif col < NUM_FIELDS:
            r, h = _parse_hex(buf, p, q, hex_value)
            if r != OK:
                return r, col + 1
            if modulus > 0:
                h = h % modulus
            cats[i, col - 1 - NUM_DENSE] = h
        else:
            return TOO_MANY_FIELDS, col + 1
        col += 1
        p = q + 1
    if col < NUM_FIELDS:
        return TOO_FEW_FIELDS, col
    return OK, 0


@njit(cache=True, nogil=True)
def _parse_line(buf, s, e, modulus, max_line, hex_value, i, labels, dense, cats):
    """Parses one line buf[s:e] (without its newline) into row i. Returns (reason, column).

    The reason of a bad line is, in this order of precedence: longer than max_line bytes; a NUL byte
    (column of the field holding it); too few / too many fields (column = number of fields found); else the
    first bad field. A final CR is stripped (CRLF line endings).
    """
    if e - s > max_line:
        return LINE_TOO_LONG, 0
    if e > s and buf[e - 1] == _CR:
        e -= 1
    r, c = _parse_fields(buf, s, e, modulus, hex_value, i, labels, dense, cats)
    if r == OK:
        return r, c
    # Slow path, bad lines only: a NUL or a wrong field count takes precedence over the first bad field.
    ntab = 0
    for p in range(s, e):
        b = buf[p]
        if b == 0:
            return NUL_BYTE, ntab + 1
        if b == _TAB:
            ntab += 1
    if ntab + 1 < NUM_FIELDS:
        return TOO_FEW_FIELDS, ntab + 1
    if ntab + 1 > NUM_FIELDS:
        return TOO_MANY_FIELDS, ntab + 1
    return r, c


@njit(cache=True, parallel=True, nogil=True)
def _parse_block(buf, segments, modulus, max_line, hex_value):
    """Parses every line of buf. Each of ``segments`` byte ranges owns the lines that start in it: count
    them in parallel, then parse them in parallel into rows numbered by the counts (no pass over the bytes
    to build line offsets first)."""
    n = buf.shape[0]
    step = max(1, (n + segments - 1) // segments)
    segments = (n + step - 1) // step
    owned = np.zeros(segments + 1, np.int64)
    for k in prange(segments):
        # Line starts in [lo, hi): position 0, and p + 1 after every LF at p < n - 1.
        lo = k * step
        hi = min(n, lo + step)
        c = 1 if lo == 0 else 0
        for p in range(max(lo - 1, 0), min(hi - 1, n - 1)):
            c += buf[p] == _LF
        owned[k + 1] = c
    first_row = np.cumsum(owned)
    rows = first_row[-1]
    labels = np.empty(rows, np.float32)
    dense = np.empty((rows, NUM_DENSE), np.float32)
    cats = np.empty((rows, NUM_CATEGORICAL), np.uint64)
    reason = np.empty(rows, np.int8)
    column = np.empty(rows, np.int32)
    starts = np.empty(rows, np.int64)
    ends = np.empty(rows, np.int64)
    for k in prange(segments):
        lo = k * step
        hi = min(n, lo + step)
        s = lo
        if lo > 0:
            while s < hi and buf[s - 1] != _LF:
                s += 1
        i = first_row[k]
        while s < hi:
            e = s
            while e < n and buf[e] != _LF:
                e += 1
            r, c = _parse_line(buf, s, e, modulus, max_line, hex_value, i, labels, dense, cats)
            reason[i] = r
            column[i] = c
            starts[i] = s
            ends[i] = e
            i += 1
            s = e + 1
    return labels, dense, cats, reason, column, starts, ends


@dataclass
class ParsedLines:
    """Arrays parsed from a block of raw Criteo lines (n lines, rows of bad lines hold garbage)."""

    labels: np.ndarray
    """float32 [n] labels 0.0 / 1.0."""
    dense: np.ndarray
    """float32 [n, 13] log(x + 1) of the integer features (missing and negative -> 0)."""
    cats: np.ndarray
    """uint64 [n, 26] raw category values (missing -> 0), already modulo max_ind_range if given."""
    reason: np.ndarray
    """int8 [n] reason code per line (0 = parsed; see REASONS)."""
    column: np.ndarray
    """int32 [n] 1-based column of the bad field; for too few / too many fields, the number found."""
    starts: np.ndarray
    """int64 [n] offset of each line in the buffer."""
    ends: np.ndarray
    """int64 [n] offset of each line's end (its newline excluded)."""


def parse_lines(
    buf: np.ndarray,
    max_ind_range: int | None = None,
    max_line: int = MAX_LINE_BYTES,
    segment_bytes: int = 1 << 20,
) -> ParsedLines:
    """Parses every line of ``buf`` (uint8 bytes of whole raw Criteo lines) in parallel.

    A line longer than ``max_line`` bytes (newline excluded) is bad with reason ``line_too_long``. The
    threads share the work in segments of ``segment_bytes`` (1 MiB balances two threads at no cost).
    """
    buf = np.ascontiguousarray(buf)
    if buf.dtype != np.uint8 or buf.ndim != 1:
        raise TypeError(f"buf must be a 1-d uint8 array, got {buf.dtype} {buf.shape}")
    modulus = 0 if max_ind_range is None else int(max_ind_range)
    if modulus < 0 or (max_ind_range is not None and modulus == 0):
        raise ValueError(f"max_ind_range must be positive, got {max_ind_range}")
    if segment_bytes < 1 or max_line < 0:
        raise ValueError(f"segment_bytes must be positive and max_line >= 0, got {segment_bytes}, {max_line}")
    segments = max(1, -(-buf.shape[0] // segment_bytes))
    return ParsedLines(*_parse_block(buf, segments, np.uint64(modulus), max_line, _hex_table()))


# Fibonacci hashing: multiply by 2**64 / golden ratio and keep high bits (they depend on every input bit).
_HASH_MULTIPLIER = 0x9E3779B97F4A7C15


@njit(cache=True, inline="always")
def _slot(v, mask):
    return np.int64((v * np.uint64(_HASH_MULTIPLIER)) >> np.uint64(32)) & mask


@njit(cache=True, nogil=True)
def _build_id_table(uniques, offsets, remap, slot_offsets, keys, ids):
    for t in range(offsets.shape[0] - 1):
        base = slot_offsets[t]
        mask = slot_offsets[t + 1] - base - 1
        for k in range(offsets[t], offsets[t + 1]):
            j = _slot(uniques[k], mask)
            while ids[base + j] != -1:
                j = (j + 1) & mask
            keys[base + j] = uniques[k]
            ids[base + j] = remap[k]


@njit(cache=True, parallel=True, nogil=True)
def _map_categories(raw, slot_offsets, keys, ids, out):
    n, T = raw.shape
    missing = 0
    for i in prange(n):
        for t in range(T):
            v = raw[i, t]
            base = slot_offsets[t]
            mask = slot_offsets[t + 1] - base - 1
            j = _slot(v, mask)
            r = -1
            while ids[base + j] != -1:
                if keys[base + j] == v:
                    r = ids[base + j]
                    break
                j = (j + 1) & mask
            out[i, t] = r
            if r == -1:
                missing += 1
    return missing


@dataclass
class IdTable:
    """Raw category value -> id per table: open-addressing hash tables (load <= 1/2) back to back."""

    slot_offsets: np.ndarray
    """int64 [T + 1] start of each table's slots; every table has a power-of-two number of slots."""
    keys: np.ndarray
    """uint64 [S] raw value held by each slot."""
    ids: np.ndarray
    """int32 [S] id of the slot's value, -1 for an empty slot."""

    @property
    def num_tables(self) -> int:
        return self.slot_offsets.shape[0] - 1


def build_id_table(uniques: np.ndarray, offsets: np.ndarray, remap: np.ndarray) -> IdTable:
    """An :class:`IdTable` mapping ``uniques[offsets[t] + k]`` to ``remap[offsets[t] + k]`` in table t.

    ``uniques`` holds every table's distinct raw values back to back (table t at ``offsets[t]:offsets[t+1]``).
    """
    uniques = np.ascontiguousarray(uniques, dtype=np.uint64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    remap = np.ascontiguousarray(remap, dtype=np.int32)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != uniques.shape[0]:
        raise ValueError("offsets must start at 0 and end at len(uniques)")
    if uniques.shape != remap.shape:
        raise ValueError(f"uniques {uniques.shape} and remap {remap.shape} must have the same length")
    counts = np.diff(offsets)
    if (counts < 0).any():
        raise ValueError("offsets must be non-decreasing")
    # At least twice as many slots as values, so a probe sequence stays short.
    slots = 1 << np.ceil(np.log2(np.maximum(2 * counts, 2))).astype(np.int64)
    slot_offsets = np.zeros(counts.shape[0] + 1, np.int64)
    np.cumsum(slots, out=slot_offsets[1:])
    table = IdTable(
        slot_offsets, np.zeros(slot_offsets[-1], np.uint64), np.full(slot_offsets[-1], -1, np.int32)
    )
    _build_id_table(uniques, offsets, remap, table.slot_offsets, table.keys, table.ids)
    return table


def map_categories(raw: np.ndarray, table: IdTable, out: np.ndarray) -> None:
    """Writes ``out[i, t]`` = the id of raw value ``raw[i, t]`` in table t of ``table``.

    Raises ValueError if a raw value is not in its table.
    """
    raw = np.ascontiguousarray(raw, dtype=np.uint64)
    if raw.ndim != 2 or out.shape != raw.shape or out.dtype != np.int32:
        raise ValueError(f"raw {raw.shape} and out {out.shape} {out.dtype} must be [n, T] with out int32")
    if raw.shape[1] != table.num_tables:
        raise ValueError(f"raw has {raw.shape[1]} columns, the id table {table.num_tables} tables")
    missing = _map_categories(raw, table.slot_offsets, table.keys, table.ids, out)
    if missing:
        raise ValueError(f"{missing} raw category values are not in the id table")


@njit(cache=True, inline="always")
def _dec_len(v):
    n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


@njit(cache=True, inline="always")
def _hex_len(v):
    # At least 8 digits, as in the Criteo files; more only for values beyond 32 bits.
    n = 8
    v >>= 32
    while v > 0:
        v >>= 4
        n += 1
    return n


@njit(cache=True, parallel=True, nogil=True)
def _line_lengths(labels, dense, cats, lengths):
    for i in prange(labels.shape[0]):
        n = 1 + NUM_FIELDS  # the label digit, 39 tabs and the newline
        for j in range(dense.shape[1]):
            if dense[i, j] >= 0:
                n += _dec_len(dense[i, j])
        for j in range(cats.shape[1]):
            if cats[i, j] >= 0:
                n += _hex_len(cats[i, j])
        lengths[i] = n


@njit(cache=True, parallel=True, nogil=True)
def _format_lines(labels, dense, cats, offsets, out):
    hexdigits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    for i in prange(labels.shape[0]):
        p = offsets[i]
        out[p] = 48 + labels[i]
        p += 1
        for j in range(dense.shape[1]):
            out[p] = _TAB
            p += 1
            v = dense[i, j]
            if v >= 0:
                k = _dec_len(v)
                for d in range(k - 1, -1, -1):
                    out[p + d] = 48 + v % 10
                    v //= 10
                p += k
        for j in range(cats.shape[1]):
            out[p] = _TAB
            p += 1
            v = cats[i, j]
            if v >= 0:
                k = _hex_len(v)
                for d in range(k - 1, -1, -1):
                    out[p + d] = hexdigits[v & 15]
                    v >>= 4
                p += k
        out[p] = _LF


def format_lines(labels: np.ndarray, dense: np.ndarray, cats: np.ndarray) -> np.ndarray:
    """Raw Criteo text (uint8 bytes, one line per row) for int labels [n] in {0, 1}, int64 dense [n, 13]
    and int64 categories [n, 26]; negative values are missing and written as empty fields.

    Categories are written as lowercase hex with at least 8 digits.
    """
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    dense = np.ascontiguousarray(dense, dtype=np.int64)
    cats = np.ascontiguousarray(cats, dtype=np.int64)
    n = labels.shape[0]
    if labels.ndim != 1 or dense.shape != (n, NUM_DENSE) or cats.shape != (n, NUM_CATEGORICAL):
        raise ValueError(
            f"expected labels [n], dense [n, {NUM_DENSE}], cats [n, {NUM_CATEGORICAL}]; "
            f"got {labels.shape}, {dense.shape}, {cats.shape}"
        )
    if n and ((labels != 0) & (labels != 1)).any():
        raise ValueError("labels must be 0 or 1")
    lengths = np.empty(n, np.int64)
    if n == 0:
        return np.empty(0, np.uint8)
    _line_lengths(labels, dense, cats, lengths)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(offsets[-1], np.uint8)
    _format_lines(labels, dense, cats, offsets, out)
    return out
