"""Pipelining: one background-thread utility, and the look-ahead executor built on it (1 or N ranks)."""
