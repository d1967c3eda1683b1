"""The checks of a ``KeyedJaggedTensor`` the tiered collection takes, before any of it is read: one line naming
the key (a ValueError) for what would otherwise pass silently or fail in numpy's words.

- ids (``values``) must be integers, one per value (1-D): a float id would be truncated to a row;
- every length must be >= 0;
- the lengths must account for the values exactly: lengths summing to less than the values would leave the
  rest in no bag (silently), more would read past them;
- per-value weights, where given, one per value.
"""

from __future__ import annotations

import numpy as np
import torch


def check_kjt(features) -> None:
    """Raises ValueError naming the key of the first thing in ``features`` (a ``KeyedJaggedTensor`` of one
    batch size for every key) that is not a batch of ids (see the module docstring)."""
    keys = list(features.keys())
    if not keys or features.variable_stride_per_key():
        return  # nothing to read; a variable batch size is refused by the collection itself
    values, lengths = features.values(), features.lengths()
    if values.dim() != 1:  # numpy's "cannot reshape" naming nothing
        raise ValueError(
            f"KeyedJaggedTensor: its values have shape {tuple(values.shape)}, not one id per value (1-D)"
        )
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ValueError(
            f"KeyedJaggedTensor key {keys[0]!r}: its ids are {values.dtype}, not integers (a float id would be "
            f"truncated to a row): give integer ids"
        )
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"KeyedJaggedTensor key {keys[0]!r}: its lengths are {lengths.dtype}, not integers")
    B = int(features.stride())
    lens = lengths.detach().cpu().numpy().astype(np.int64)
    if lens.shape != (len(keys) * B,):
        raise ValueError(
            f"KeyedJaggedTensor: {lens.size} lengths for {len(keys)} keys of batch size {B} (expected "
            f"{len(keys) * B}, one per key and sample)"
        )
    lens = lens.reshape(len(keys), B)
    if (lens < 0).any():
        k, b = np.argwhere(lens < 0)[0]
        raise ValueError(
            f"KeyedJaggedTensor key {keys[k]!r}: the length of sample {int(b)} is {int(lens[k, b])}; a bag's "
            f"length must be >= 0"
        )
    ends = np.cumsum(lens.sum(axis=1))
    n = int(values.numel())
    if ends[-1] != n:
        if ends[-1] > n:
            k = int(np.flatnonzero(ends > n)[0])
            raise ValueError(
                f"KeyedJaggedTensor key {keys[k]!r}: its lengths run to value {int(ends[k])} but there are only "
                f"{n} values: the lengths and the values do not match"
            )
        raise ValueError(
            f"KeyedJaggedTensor: the lengths sum to {int(ends[-1])} but there are {n} values: the last "
            f"{n - int(ends[-1])} (after key {keys[-1]!r}) would be in no bag; the lengths and the values do "
            f"not match"
        )
    weights = features.weights_or_none()
    if weights is not None and int(weights.numel()) != n:
        raise ValueError(
            f"KeyedJaggedTensor key {keys[0]!r}: {int(weights.numel())} weights for {n} values (one per value)"
        )
