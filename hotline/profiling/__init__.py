"""Profiling: access counts per (table, row) over a sample, and the figures a placement is chosen from."""

from hotline.profiling.profile import Profile
from hotline.profiling.profiler import Profiler, profile

__all__ = ["Profile", "Profiler", "profile"]
