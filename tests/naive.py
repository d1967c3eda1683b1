"""Slow, obvious numpy twins of every Numba kernel in ``kernels/``; tests assert the two agree.

Each twin is written for clarity, not speed: plain loops or the most direct numpy expression.
Add a twin by appending a section (helpers working in parallel append with ``cat >>``).
"""

from __future__ import annotations

import numpy as np  # noqa: F401
