"""Raw Criteo files: the format (label, 13 integers, 26 hex categories, tab-separated), its errors, reading
plain or gzip files in line-aligned blocks, and writing rows back as raw text."""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hotline.kernels.criteo_parse import (
    MAX_LINE_BYTES,
    NUM_CATEGORICAL,
    NUM_DENSE,
    NUM_FIELDS,
    format_lines,
)

LAYOUTS = ("auto", "kaggle", "terabyte")
ON_BAD_LINE = ("error", "skip")
KAGGLE_DAYS = 7
FIELD_NAMES = (
    "label",
    *(f"I{i}" for i in range(1, NUM_DENSE + 1)),
    *(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1)),
)
# Raw bytes read per block in pass 1, and rows per chunk in pass 2 and in write_raw_tsv.
BLOCK_BYTES = 32 << 20
CHUNK_ROWS = 1 << 18
_FINGERPRINT_BYTES = 1 << 20

_EXPECTED = {
    "too_few_fields": f"expected {NUM_FIELDS} tab-separated fields",
    "too_many_fields": f"expected {NUM_FIELDS} tab-separated fields",
    "bad_label": "expected a label 0 or 1",
    "bad_integer": "expected a decimal integer or an empty field",
    "integer_overflow": "expected an integer that fits in 64 bits",
    "bad_hex": "expected a hexadecimal category or an empty field",
    "hex_overflow": "expected at most 16 hex digits (64 bits)",
    "nul_byte": "expected text, found a NUL byte",
    "line_too_long": f"expected a line of at most {MAX_LINE_BYTES} bytes",
}


class CriteoFormatError(ValueError):
    """A raw Criteo file does not parse: names the file, the 1-based line and field, and what was expected.

    ``line`` and ``field`` are None for errors of the whole file (truncated gzip stream, no rows at all).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        line: int | None,
        field: str | None,
        reason: str,
        column: int | None = None,
    ):
        self.path = str(path)
        self.line = line
        self.field = field
        self.column = column
        self.reason = reason
        where = self.path if line is None else f"{self.path}, line {line}"
        if field is not None:
            where += f", field {field}" + ("" if column is None else f" (column {column})")
        super().__init__(f"{where}: {reason}")


def field_name(column: int) -> str:
    """Name of a 1-based column of a raw Criteo line: ``label``, ``I1``..``I13``, ``C1``..``C26``."""
    return FIELD_NAMES[column - 1] if 1 <= column <= NUM_FIELDS else f"extra field {column}"


def write_raw_tsv(
    path: str | os.PathLike,
    labels: np.ndarray,
    dense: np.ndarray,
    cats: np.ndarray,
    append: bool = False,
    force: bool = False,
) -> Path:
    """Writes rows as raw Criteo text lines (``label \\t I1..I13 \\t C1..C26``), gzip-compressed if ``.gz``.

    ``labels``: int [N] in {0, 1}. ``dense``: int64 [N, 13], a negative value means missing (empty field;
    real Criteo files do hold negative integers, which this writer cannot express). ``cats``: uint32 or int64
    [N, 26] category values written as lowercase hex with at least 8 digits; a negative value means missing
    (empty field). ``append`` adds to an existing file instead of replacing it; an existing file is replaced
    only with ``force`` (:func:`hotline.outputs.guard`).
    """
    path = Path(path)
    labels = np.asarray(labels)
    dense = np.asarray(dense)
    cats = np.asarray(cats)
    n = labels.shape[0] if labels.ndim == 1 else -1
    if labels.ndim != 1 or dense.shape != (n, NUM_DENSE) or cats.shape != (n, NUM_CATEGORICAL):
        raise ValueError(
            f"expected labels [N], dense [N, {NUM_DENSE}], cats [N, {NUM_CATEGORICAL}]; "
            f"got {labels.shape}, {dense.shape}, {cats.shape}"
        )
    for name, a in (("labels", labels), ("dense", dense), ("cats", cats)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name} must be an integer array, got {a.dtype}")
    if cats.dtype == np.uint64 and cats.size and int(cats.max()) > np.iinfo(np.int64).max:
        raise ValueError("cats values must fit in int64")
    if not append:
        from hotline.outputs import guard

        path = guard("write_raw_tsv path", path, force=force)
    mode = "ab" if append else "wb"
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, mode) as f:
        for a in range(0, n, CHUNK_ROWS):
            b = min(n, a + CHUNK_ROWS)
            f.write(format_lines(labels[a:b], dense[a:b], cats[a:b]).data)
    return path


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_blocks(stream, raw, block_bytes: int) -> Iterator[tuple[np.ndarray | None, int]]:
    """Whole lines of ``stream`` in blocks of about ``block_bytes``, each with the position reached in the
    underlying ``raw`` file (compressed bytes for gzip). A block ``None`` stands for one line longer than
    MAX_LINE_BYTES: its bytes are dropped, so memory stays bounded even for a file without newlines."""
    carry = b""
    discarding = False
    while True:
        data = stream.read(block_bytes)
        if not data:
            if carry:
                yield np.frombuffer(carry, np.uint8), raw.tell()
            return
        if discarding:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            data = data[nl + 1 :]
            discarding = False
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            if len(buf) > MAX_LINE_BYTES:
                yield None, raw.tell()
                carry = b""
                discarding = True
            else:
                carry = buf
            continue
        carry = buf[cut + 1 :]
        yield np.frombuffer(buf, np.uint8, count=cut + 1), raw.tell()


def raw_fingerprint(path: Path) -> str:
    """sha256 of the file size and its first and last MiB: cheap, and changes when the file does."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            h.update(f.read())
    return h.hexdigest()


def bad_line_error(path: Path, line: int, reason: str, column: int, text: bytes | None) -> CriteoFormatError:
    if reason in ("too_few_fields", "too_many_fields"):
        # The kernel gives the number of fields found; name the first missing or the first extra one.
        found = column
        column = found + 1 if reason == "too_few_fields" else NUM_FIELDS + 1
        return CriteoFormatError(
            path, line, field_name(column), f"{_EXPECTED[reason]}, found {found}", column
        )
    if reason == "line_too_long":
        return CriteoFormatError(path, line, None, _EXPECTED[reason])
    detail = _EXPECTED[reason]
    if text is not None and reason != "nul_byte":
        fields = text.rstrip(b"\r").split(b"\t")
        if column - 1 < len(fields):
            detail += f", got {fields[column - 1][:40]!r}"
    return CriteoFormatError(path, line, field_name(column), detail, column)
