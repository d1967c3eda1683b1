"""The disk store's three files as outputs: the row file (``hotline-cold-rows.bin``), its header
(``FILE.json``) and its row order (``FILE.order.npy``), their names, and the proof, by each file's content,
that it is the store's own.

The three files are outputs under the one output policy (:func:`store_outputs`, :mod:`hotline.outputs`):
never written through a symbolic link, checked against the run's inputs and other outputs, and replaced only
when each is provably the store's own by its content, or with ``--force``:

- the row file ends with one page (after its records) that starts with :data:`TAIL_MAGIC` and records the
  record count and size, which give the file's size (:func:`is_own_rows`);
- the header is a JSON object of :data:`FORMAT` (:func:`is_own_manifest`);
- the row order's sha256 is the one the store's header records (:func:`is_own_order`).

A name, or a header beside a file, proves nothing about the file itself: a checkpoint saved as
``hotline-cold-rows.bin`` beside a real header is a user's file, kept unless ``--force``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from hotline import _io

PAGE = 4096
FORMAT = "hotline-cold-rows/2"
TAIL_MAGIC = b"HOTLINE COLD ROWS\n"
"""The start of the row file's last page (after its records): the file's own proof that the store made it."""


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def order_path(path: Path) -> Path:
    return path.with_name(path.name + ".order.npy")


def read_manifest(path: Path) -> dict | None:
    """The manifest (header) of the cold-row file ``path`` if it is the store's own (:func:`is_own_manifest`),
    else None."""
    m = manifest_path(path)
    if m.is_symlink():
        return None
    try:
        manifest = json.loads(m.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def is_own_manifest(path: Path) -> bool:
    """Whether ``path`` (a ``FILE.json``) is a store's manifest by its content: a JSON object of the format."""
    path = Path(path)
    return (
        path.name.endswith(".json") and read_manifest(path.with_name(path.name[: -len(".json")])) is not None
    )


def _tail(rows: int, record: int) -> bytes:
    """The row file's last page: :data:`TAIL_MAGIC` and the records it follows."""
    text = TAIL_MAGIC + json.dumps({"format": FORMAT, "rows": rows, "record_bytes": record}).encode() + b"\n"
    return text.ljust(PAGE, b"\0")


def is_own_rows(path: Path) -> bool:
    """Whether ``path`` is a row file the store made, by its content: a regular file (not a link) whose last
    page names the format and a record count and size that give the file's size."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size < PAGE or st.st_size % PAGE:
            return False
        with open(path, "rb") as f:
            f.seek(st.st_size - PAGE)
            page = f.read(PAGE)
        if not page.startswith(TAIL_MAGIC):
            return False
        head = json.loads(page[len(TAIL_MAGIC) :].split(b"\n", 1)[0])
        rows, record = int(head["rows"]), int(head["record_bytes"])
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return (
        head.get("format") == FORMAT
        and page == _tail(rows, record)
        and st.st_size == (-(-rows * record // PAGE) + 1) * PAGE
    )


def is_own_order(path: Path) -> bool:
    """Whether ``path`` (a ``FILE.order.npy``) is the store's row order by its content: its sha256 is the one
    the store's manifest records."""
    path = Path(path)
    if not path.name.endswith(".order.npy") or path.is_symlink() or not path.is_file():
        return False
    manifest = read_manifest(path.with_name(path.name[: -len(".order.npy")]))
    return manifest is not None and manifest.get("order_sha256") == _io.sha256(path)


def older_store(path: Path) -> str | None:
    """What ``path`` (one of a store's three files) is when the header beside it is an older Hotline's (format
    ``hotline-cold-rows/1``, whose files cannot prove by their content that they are the store's): said
    instead of a bare "exists"; the header is only read to say so, never trusted to replace anything."""
    path = Path(path)
    rows = path
    for side in (".json", ".order.npy"):
        if path.name.endswith(side):
            rows = path.with_name(path.name[: -len(side)])
    m = manifest_path(rows)
    try:
        head = json.loads(m.read_text()) if not m.is_symlink() else None
    except (OSError, ValueError):
        return None
    fmt = head.get("format") if isinstance(head, dict) else None
    if not isinstance(fmt, str) or not fmt.startswith("hotline-cold-rows/") or fmt == FORMAT:
        return None
    return (
        f"a disk store of an older Hotline (its header {m.name} says {fmt}; this one writes {FORMAT}, whose "
        f"files prove by their content that they are the store's): nothing in it needs converting, the store "
        f"is rebuilt at every run's start (its rows from the model or the checkpoint): pass --force to rebuild "
        f"it, or choose another --cold-dir"
    )


def store_outputs(path: str | os.PathLike, flag: str = "--cold-dir") -> list:
    """The row file ``path`` and its two side files as outputs of the run, for :func:`hotline.outputs.claim`:
    judged against the run's inputs and other outputs, never followed through a link, replaced only when
    provably the store's own or with ``--force``."""
    from hotline.outputs import Output

    path = Path(path)
    policy = {"follow": False, "explain": older_store}  # an older Hotline's store is named as one
    return [
        Output(f"{flag} (the disk store's rows)", path, owned=is_own_rows, **policy),
        Output(f"{flag} (the disk store's header)", manifest_path(path), owned=is_own_manifest, **policy),
        Output(f"{flag} (the disk store's row order)", order_path(path), owned=is_own_order, **policy),
    ]


def made_by_hotline(path: Path) -> bool:
    """Whether ``path`` is a cold-row file that the store made (by its own content; its manifest too)."""
    return is_own_rows(path) and read_manifest(path) is not None


def check_record(path: Path, manifest: dict, dim: int, state_floats: int, optimizer: str = "") -> None:
    """Refuses, with one line, a file whose header says its records are not ``dim`` weights and
    ``state_floats`` state floats of ``optimizer`` (a file made for another optimizer or dim)."""
    theirs = (manifest.get("dim"), manifest.get("state_floats"), manifest.get("optimizer", ""))
    if theirs[:2] != (dim, state_floats) or (optimizer and theirs[2] and theirs[2] != optimizer):
        made = f"optimizer {theirs[2] or '(not recorded)'}, dim {theirs[0]}, {theirs[1]} state floats per row"
        want = f"optimizer {optimizer or '(any)'}, dim {dim}, {state_floats} state floats per row"
        raise ValueError(
            f"cold store {path} was made for {made}; this run needs {want} (choose another --cold-dir)"
        )


def check_cold_path(path: str | os.PathLike, force: bool = False) -> Path:
    """``path`` as a cold-row file the store may (re)create, judged as the output policy judges it (see
    :func:`store_outputs`): refuses, with one line, a directory, a symbolic link, or a file that is not
    provably the store's own by its content; with ``force``, a link is removed (never its target) and a file
    is replaced."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"--cold-dir {path.parent} is not a directory")
    owns = (is_own_rows, is_own_manifest, is_own_order)
    for p, own in zip((path, manifest_path(path), order_path(path)), owns, strict=True):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            if not force:
                raise ValueError(
                    f"refusing to write {p}: it is a symbolic link (to {os.readlink(p)}) and the disk store never "
                    f"writes through a link (pass --force to replace the link itself, or choose another --cold-dir)"
                )
            p.unlink()
        elif stat.S_ISDIR(st.st_mode):
            raise ValueError(f"cold store file {p} is a directory")
        elif not stat.S_ISREG(st.st_mode):
            raise ValueError(f"refusing to write {p}: it is not a regular file (choose another --cold-dir)")
        elif not force and not own(p):
            older = older_store(p)
            what = (f"it is {older}" if older else "it exists and is not the disk store's own file by its content "
                    "(pass --force to replace it, or choose another --cold-dir)")  # fmt: skip
            raise ValueError(f"refusing to overwrite {p}: {what}")
    return path
