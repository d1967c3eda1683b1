"""Numba kernels: pure functions on numpy arrays and scalars (installed as ``hotline.kernels``)."""
