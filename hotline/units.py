"""Byte sizes as people write them: ``"256MiB"``, ``"1.5GB"``, ``"4096"``."""

from __future__ import annotations

import re

# Binary units are powers of 1024 (what GPU memory is sold in); KB/MB/GB/TB are decimal, as in SI.
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """A byte count from ``"256MiB"``, ``"2 GiB"``, ``"1.5GB"``, ``"4096"`` or ``"4096B"`` (units ignore case).

    KiB/MiB/GiB/TiB are binary (1024-based), KB/MB/GB/TB decimal (1000-based); a fractional result is
    rounded down to whole bytes. Raises ValueError naming the text and the accepted forms.
    """
    if isinstance(text, bool):
        raise ValueError(f"size must be a string or an int, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be non-negative, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group("unit").lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size: expected a non-negative number with an optional unit "
            "B, KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB (1000-based), e.g. '256MiB'"
        )
    number = match.group("number")
    if "." in number:
        # Exact decimal arithmetic: "0.1GB" must be 100000000 bytes, not 99999999.
        whole, _, frac = number.partition(".")
        scale = 10 ** len(frac)
        return (int(whole or 0) * scale + int(frac or 0)) * _UNITS[unit] // scale
    return int(number) * _UNITS[unit]


def size_arg(text: str) -> int:
    """``parse_size`` as an argparse ``type=``: a bad size becomes argparse's usage error."""
    import argparse

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def format_size(num_bytes: int) -> str:
    """A byte count for people, in binary units: ``268435456 -> "256 MiB"``, ``1536 -> "1.5 KiB"``."""
    num_bytes = int(num_bytes)
    if num_bytes < 0:
        return "-" + format_size(-num_bytes)
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value = float(num_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"
