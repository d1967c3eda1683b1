"""Progress bars only where a person watches them."""

from __future__ import annotations


def bar_disable(progress: bool) -> bool | None:
    """tqdm's ``disable=`` for a bar shown when ``progress`` asks for it: ``True`` (off), else ``None``, with
    which tqdm shows it only on a terminal, so that a log or a pipe gets no ``\\r``-rewritten lines."""
    return True if not progress else None
